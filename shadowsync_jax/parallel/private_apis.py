"""Every use of a private module of jax, jaxlib or orbax, in one place, for the versions it was written for.

  private_apis.connect_client(address, num_processes, process_id, heartbeat_timeout_s)   # a client, no service
  private_apis.connect_client(..., start_service=True)   # process 0 starts the service, as jax.distributed does
  private_apis.distributed_client()         # the job's client: its key-value store (the watchdog's heartbeats)
  private_apis.coordinator_address()        # 'host:port' of the job's coordinator, or None
  private_apis.bind_gloo_to(address)        # gloo's collectives on the address that reaches the peers
  private_apis.cache_writes_from_any_process()   # the persistent compilation cache written by every process
  private_apis.orbax_signals_in_process()   # orbax's save futures without the coordinator's key-value store
  private_apis.await_orbax_cleanup(manager) # a checkpoint manager's removal of unfinished saves, done now
  private_apis.coordination_service(port, num_processes, heartbeat_timeout_s)   # jaxlib alone, no jax

What they do that no public API does (jax 0.10.2, orbax-checkpoint 0.12.8):
- `jax.distributed.initialize` starts the coordination service inside process 0, and a service that dies with
  process 0 takes every other process down with it: the job runs the service in a process of its own
  (`coordinator`) and every trainer connects as a client only (`connect_client`), through the client constructor
  and `global_state` of `jax._src.distributed`; the watchdog's heartbeats use that client's key-value store. Its
  client compresses every message (`use_compression=True`, not an option of `initialize`): ours does not.
- gloo's TCP collectives are made without a hostname, so gloo resolves this machine's name (127.0.0.1 on many
  machines) and every process dials its own loopback: `bind_gloo_to` gives them the address towards the peers.
- JAX writes compilation cache entries from process 0 only; a restarted process of another index would compile
  everything again: `cache_writes_from_any_process` replaces the writer (`jax._src.compiler._cache_write`).
- orbax's save futures look for signals in the coordinator's key-value store, which may be gone with a dead
  coordinator while a survivor saves its live state: `orbax_signals_in_process` keeps them in the process.
- orbax's `CheckpointManager` removes unfinished saves in a thread it awaits only in its first save: a process that
  ends before (a restore it refuses) prints that thread's traceback; `await_orbax_cleanup` waits for it at once.

Nothing here runs at import: each patch is made by the call that needs it, once. `check_versions` says which
installed versions differ from those above; the first call of any function here warns once when one does, and
tests/parallel/test_private_apis.py fails when a symbol used here changes its name or parameters.
"""

import functools
import importlib.metadata
import inspect
from typing import Any
import warnings

WRITTEN_FOR = {'jax': '0.10.2', 'jaxlib': '0.10.2', 'orbax-checkpoint': '0.12.8'}
# `jax._src.compiler._cache_write`'s parameters in those versions (the replacement takes the same).
CACHE_WRITE_PARAMETERS = ('cache_key', 'compile_time_secs', 'module_name', 'backend', 'executable', 'host_callbacks')


def check_versions() -> list[str]:
  """One line for each package whose installed version is not the one this module was written for."""
  lines = []
  for package, version in WRITTEN_FOR.items():
    try:
      installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      continue
    if installed != version:
      lines.append(
        f'{package} {installed} is installed; shadowsync_jax/parallel/private_apis.py was written for {version} '
        'and uses its private modules: run tests/parallel/test_private_apis.py'
      )
  return lines


@functools.cache
def _warn_once_if_other_versions() -> None:
  for line in check_versions():
    warnings.warn(line, stacklevel=3)


def connect_client(
  coordinator_address: str, num_processes: int, process_id: int, heartbeat_timeout_s: int, start_service: bool = False
) -> None:
  """What `jax.distributed.initialize` does, with the client's messages not compressed: a client of the job's
  service (started here by process 0 if `start_service`, else run elsewhere), set as the job's client
  (`jax.distributed.shutdown` and the collectives then use it).

  JAX's own client gzips every message, at a cost: a shadow round's sums (float32 that barely compress) took 2-3x
  the host CPU of the round itself through it, on the training process's cores (the 2 x 4 job's `shadow_ma` at
  0.84-0.86 of `none` with no device work in its rounds at all; 0.96 uncompressed)."""
  _warn_once_if_other_versions()
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top

  state = jax_distributed.global_state
  if state.client is not None:
    raise RuntimeError('distributed.initialize should only be called once.')
  if start_service and process_id == 0:  # As `jax.distributed.initialize` starts it: every address, this port.
    port = coordinator_address.rsplit(':', 1)[1]
    state.service = _jax.get_distributed_runtime_service(
      f'[::]:{port}', num_processes, heartbeat_timeout=heartbeat_timeout_s, shutdown_timeout=300
    )
  state.coordinator_address, state.process_id, state.num_processes = coordinator_address, process_id, num_processes
  state.client = _jax.get_distributed_runtime_client(
    coordinator_address, process_id, init_timeout=300, use_compression=False, heartbeat_timeout=heartbeat_timeout_s
  )
  state.client.connect()


def distributed_client() -> Any:
  """The job's distributed runtime client (None before `jax.distributed.initialize` or `connect_client`)."""
  _warn_once_if_other_versions()
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top

  return jax_distributed.global_state.client


def coordinator_address() -> str | None:
  """The job's coordinator address, 'host:port' (None before the job is set up)."""
  _warn_once_if_other_versions()
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top

  return jax_distributed.global_state.coordinator_address


def bind_gloo_to(address: str) -> None:
  """gloo's collectives made with `address` as their hostname; before the CPU backend exists (it is made at the
  first use of a device)."""
  _warn_once_if_other_versions()
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top

  original = getattr(_jax.make_gloo_tcp_collectives, 'func', _jax.make_gloo_tcp_collectives)
  _jax.make_gloo_tcp_collectives = functools.partial(original, hostname=address)


def cache_writes_from_any_process() -> None:
  """Every process writes the programs it compiles to its persistent compilation cache (JAX: process 0 only).

  Where JAX's writer takes other parameters than those of the versions in `WRITTEN_FOR`, nothing is replaced and a
  warning says so: JAX's own writer stays (process 0 writes; the others compile again after a restart)."""
  _warn_once_if_other_versions()
  from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
  from jax._src import compiler  # pylint: disable=g-import-not-at-top

  parameters = tuple(inspect.signature(compiler._cache_write).parameters)  # pylint: disable=protected-access
  if parameters != CACHE_WRITE_PARAMETERS:
    warnings.warn(
      f'jax._src.compiler._cache_write takes {parameters}, not {CACHE_WRITE_PARAMETERS}: left as it is, so only '
      'process 0 writes the compilation cache',
      stacklevel=2,
    )
    return

  def write_from_any_process(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    if host_callbacks:  # As JAX's own write: a program with host callbacks is not cached.
      return
    try:
      compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend, int(compile_time_secs))
    except Exception as error:  # pylint: disable=broad-except  (a cache that cannot be written only costs time)
      warnings.warn(f'could not write the compilation cache entry of {module_name!r}: {error}', stacklevel=2)

  compiler._cache_write = write_from_any_process  # pylint: disable=protected-access


def orbax_signals_in_process() -> None:
  """orbax's save futures signal within the process, not through the coordinator's key-value store."""
  _warn_once_if_other_versions()
  from orbax.checkpoint._src.futures import signaling_client  # pylint: disable=g-import-not-at-top

  signaling_client.get_signaling_client = signaling_client.ThreadSafeKeyValueSignalingClient


def await_orbax_cleanup(manager: Any) -> None:
  """Waits for a `CheckpointManager`'s removal of the temporary directories of unfinished saves (`cleanup_tmp_
  directories`), which it starts in a thread and awaits only in its first save."""
  _warn_once_if_other_versions()
  manager._maybe_await_cleanup_tmp_directory()  # pylint: disable=protected-access


def coordination_service(port: int, num_processes: int, heartbeat_timeout_s: int) -> Any:
  """JAX's coordination service on every address of this host at `port`, `recoverable` (a dead client does not
  stop the others); it runs until the object is deleted. Imports jaxlib alone, not jax: fast."""
  _warn_once_if_other_versions()
  from jaxlib import _jax  # pylint: disable=g-import-not-at-top

  return _jax.get_distributed_runtime_service(
    f'[::]:{port}', num_processes, heartbeat_timeout=heartbeat_timeout_s, shutdown_timeout=5, recoverable=True
  )
