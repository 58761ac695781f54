"""JAX's persistent compilation cache for every process of a job, so that a restarted job does not compile again.

  compilation_cache.enable(workdir / 'compilation_cache', process_id)   # before anything compiles
  compilation_cache.directory_for(FLAGS.compilation_cache_dir, default)  # flag, else $JAX_COMPILATION_CACHE_DIR
  with compilation_cache.compiling() as compiled: ...   # compiled.seconds: this thread's compiling meanwhile

Every program a run compiles (the train step, the rounds, the evaluation) is written to
`DIRECTORY/process_{p}` and read back by the next start of the same process: a job restarted after a failure
loads its programs instead of compiling them. JAX 0.10 writes cache entries from process 0 only (a program's key
holds its devices on CPU, so the others would never hit), so the write is replaced by one that any process makes
(`private_apis`), each into a directory of its own (no two writers on one file). `experiments.train` enables it
in the workdir by default (`--compilation_cache_dir`; `$JAX_COMPILATION_CACHE_DIR` where that is set:
`directory_for`).
"""

from collections.abc import Iterator
import contextlib
import dataclasses
import pathlib
import threading

import jax

from shadowsync_jax.parallel import private_apis


def directory_for(flag_value: str | None, default: str) -> str:
  """Where a binary keeps its cache: its `--compilation_cache_dir` if given (empty: none), else JAX's own setting
  (`$JAX_COMPILATION_CACHE_DIR`: the tests share one cache this way), else `default` (its workdir's)."""
  if flag_value is not None:
    return flag_value
  return jax.config.jax_compilation_cache_dir or default


def enable(directory: str | pathlib.Path, process_id: int = 0) -> pathlib.Path:
  """Caches every compiled program of this process in `directory/process_{process_id}`; returns that directory."""
  path = pathlib.Path(directory).absolute() / f'process_{process_id}'
  jax.config.update('jax_compilation_cache_dir', str(path))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', -1)

  private_apis.cache_writes_from_any_process()
  return path


@dataclasses.dataclass
class Compiled:
  seconds: float = 0.0  # Tracing, lowering and compiling (or loading from the cache), summed.


_COMPILE_EVENTS = (
  '/jax/core/compile/jaxpr_trace_duration',
  '/jax/core/compile/jaxpr_to_mlir_module_duration',
  '/jax/core/compile/backend_compile_duration',
)


@contextlib.contextmanager
def compiling() -> Iterator[Compiled]:
  """The seconds this thread spends compiling inside the block (JAX's own compile events), so that a measured cost
  can leave out a one-time compile (a checkpoint interval calibrated on a save that compiled its gather)."""
  compiled, thread = Compiled(), threading.get_ident()

  def on_event(event: str, seconds: float, **kwargs) -> None:
    del kwargs
    if event in _COMPILE_EVENTS and threading.get_ident() == thread:
      compiled.seconds += seconds

  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    yield compiled
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
