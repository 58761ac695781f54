"""Test setup: 8 virtual CPU devices, so multi-replica code runs for real on a laptop CPU."""

import jax

jax.config.update('jax_num_cpu_devices', 8)
