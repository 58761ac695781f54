"""The counter-based hash every random number of the synthetic stream comes from: a pure function of (key, counter),
so any example, id or parameter can be computed alone, in any order, on any host.

  words = counter_hash.splitmix64(counters_uint64, key)    # uint64, one output per counter
"""

import numpy as np

_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB


def splitmix64(counter, key: int, xp=np):
  """Output number `counter` of the splitmix64 generator seeded with `key` (uint64, vectorized, stateless). `xp`:
  numpy, or jax.numpy under `jax.enable_x64` (the stream generated on the device, `synthetic_device`)."""
  u64 = xp.uint64
  z = (counter.astype(u64) + u64(1)) * u64(_GOLDEN_GAMMA) + u64(key)
  z ^= z >> u64(30)
  z *= u64(_MIX_1)
  z ^= z >> u64(27)
  z *= u64(_MIX_2)
  z ^= z >> u64(31)
  return z
