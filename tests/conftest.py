"""Test setup: 8 virtual CPU devices, so multi-replica code runs for real on a laptop CPU; and one persistent
compilation cache for the whole session, so that a program compiled once (the tiny model's step, init, rounds,
evaluation) is loaded, not compiled again, by the next test, job process or notebook that builds it (they inherit
`JAX_COMPILATION_CACHE_DIR`; `experiments.train` and `benchmarks.sweep` take it over their workdir's cache). The
cache starts empty every session and is removed at its end. pytest's process makes it before it starts its workers
(pytest-xdist, `pytest.ini`), and they inherit it too: one cache for the workers and every process they start."""

import atexit
import os
import shutil
import tempfile

import jax

if os.environ.get('PYTEST_XDIST_WORKER') and os.environ.get('JAX_COMPILATION_CACHE_DIR'):
  _CACHE_DIR = os.environ['JAX_COMPILATION_CACHE_DIR']  # A worker: the cache of the pytest process that started it.
else:
  _CACHE_DIR = tempfile.mkdtemp(prefix='shadowsync_tests_jax_cache_')
  atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
_CACHE_SETTINGS = {
  'jax_compilation_cache_dir': _CACHE_DIR,
  'jax_persistent_cache_min_compile_time_secs': 0,  # Every program, however fast it compiles.
  'jax_persistent_cache_min_entry_size_bytes': -1,
}
for name, value in _CACHE_SETTINGS.items():
  jax.config.update(name, value)
  os.environ[name.upper()] = str(value)  # For the processes the tests start.

jax.config.update('jax_num_cpu_devices', 8)

# XLA's CPU compiler at its quickest: the suite's tiny programs compile in about a third of the time and run about as
# fast (compiling is most of the suite's time). Set before any backend starts, and inherited by every process the
# tests start. The default optimization is what users and the benchmarks run: a test that checks a claim there
# starts its processes with `XLA_FLAGS_OUTSIDE_TESTS` (the flags the suite was started with) as their XLA_FLAGS.
TEST_XLA_FLAGS = ('--xla_cpu_use_fusion_emitters=false', '--xla_backend_optimization_level=0')
_outside = os.environ.setdefault('XLA_FLAGS_OUTSIDE_TESTS', os.environ.get('XLA_FLAGS', ''))
os.environ['XLA_FLAGS'] = ' '.join([*_outside.split(), *TEST_XLA_FLAGS])
