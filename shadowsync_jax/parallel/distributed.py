"""The multi-process runtime: `jax.distributed` (gloo on CPU) and a watchdog that stops a process whose peer is gone.

  distributed.initialize('127.0.0.1:1234', num_processes=2, process_id=0, peer_timeout_s=30)
  ...                                   # jax.devices(): the job's devices; jax.local_devices(): this process's
  distributed.fail(error)               # on an exception: ends this process, blaming it or a peer that is gone
  distributed.finish()                  # normal end: the peers stop watching this process; shuts the runtime down

One process per host (or per GPU); the same code on CPU, GPU and TPU. Cross-process collectives go over gloo on
CPU and NCCL on GPUs. Orbax is switched to the runtime's key-value barriers, so saving a checkpoint from the
training thread issues no collective beside the shadow thread's (DESIGN §3: one thread per process issues them).

A process that dies (killed, crashed) or hangs would leave its peers waiting in a collective for good. So every
process bumps a heartbeat in the runtime's key-value store once a second, and a watchdog thread ends this process
(exit code `PEER_LOST_EXIT_CODE`) with a message naming the peer as soon as that peer reported a failure, or when
its heartbeat has not moved for `peer_timeout_s`, or when the coordinator (process 0) cannot be reached.
"""

import os
import threading
import time
from typing import NoReturn

from absl import flags
import jax

from shadowsync_jax.parallel import exit_codes

PEER_LOST_EXIT_CODE = exit_codes.PEER_LOST
_HEARTBEAT_S = 1.0
_PREFIX = 'shadowsync'

_watchdog: '_PeerWatchdog | None' = None


def initialize(coordinator_address: str, num_processes: int, process_id: int, peer_timeout_s: float = 30.0) -> None:
  """Joins the job as `process_id` of `num_processes` (process 0 hosts the coordinator at `coordinator_address`)."""
  global _watchdog
  if not 0 <= process_id < num_processes:
    raise ValueError(f'process_id={process_id} must be in [0, num_processes={num_processes}).')
  if peer_timeout_s < 2 * _HEARTBEAT_S:
    raise ValueError(f'peer_timeout_s={peer_timeout_s} must be at least {2 * _HEARTBEAT_S} s.')
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  # JAX's own liveness check ends the process with a fatal log; ours, faster, says which peer and why.
  jax.distributed.initialize(
    coordinator_address, num_processes, process_id, heartbeat_timeout_seconds=int(3 * peer_timeout_s) + 10
  )
  _use_orbax_key_value_barriers()
  _watchdog = _PeerWatchdog(_client(), process_id, num_processes, peer_timeout_s, coordinator_address)
  _watchdog.start()


def fail(error: BaseException, exit_code: int = 1) -> NoReturn:
  """Ends this process after `error` with `exit_code`, blaming the right process.

  An error from the transport (a collective whose partner vanished) is most likely a peer's death: the watchdog
  gets `peer_timeout_s` to name that peer (and ends the process itself). Any other error is this process's own:
  the peers are told at once, and stop naming it. Exits without waiting for the peers, as a normal exit would.
  """
  if _watchdog is not None:
    if _looks_like_a_lost_peer(error):
      os.write(
        2,
        f'\nshadowsync: process {_watchdog.process_id}: a collective failed; waiting up to '
        f'{_watchdog.timeout_s:g} s to learn whether a peer is gone.\n'.encode(),
      )
      _watchdog.wait_for_a_lost_peer()
    _watchdog.report_failure(f'{type(error).__name__}: {error}')
  os._exit(exit_code)  # pylint: disable=protected-access


def _looks_like_a_lost_peer(error: BaseException) -> bool:
  text = str(error).lower()
  return any(
    sign in text for sign in ('gloo', 'connection closed', 'connection reset', 'unavailable', 'nccl', 'socket')
  )


def finish() -> None:
  """Marks this process done (its peers stop watching it), stops the watchdog, shuts the runtime down."""
  global _watchdog
  if _watchdog is None:
    return
  _watchdog.finish()
  _watchdog = None
  jax.distributed.shutdown()


def _client():
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top

  return jax_distributed.global_state.client


def _use_orbax_key_value_barriers() -> None:
  """Orbax's default barrier is a collective over all devices; from the training thread it would run beside the
  shadow thread's collectives. Its flag (an absl flag) switches it to the runtime's key-value barrier."""
  from orbax.checkpoint._src.multihost import multihost  # pylint: disable=g-import-not-at-top

  if not flags.FLAGS.is_parsed():  # Used as a library: the flag's value is only read once flags are parsed.
    flags.FLAGS.mark_as_parsed()
  flags.FLAGS.experimental_orbax_use_distributed_barrier = True
  if not multihost.EXPERIMENTAL_ORBAX_USE_DISTRIBUTED_BARRIER.value:
    raise RuntimeError('could not switch orbax to key-value barriers (experimental_orbax_use_distributed_barrier).')


class _PeerWatchdog:
  """Bumps this process's heartbeat and watches the peers' (see the module docstring)."""

  def __init__(self, client, process_id: int, num_processes: int, timeout_s: float, coordinator_address: str):
    self._client, self.process_id, self.timeout_s = client, process_id, timeout_s
    self._peers = [p for p in range(num_processes) if p != process_id]
    self._coordinator_address = coordinator_address
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name='peer-watchdog', daemon=True)

  def start(self) -> None:
    self._thread.start()

  def report_failure(self, message: str) -> None:
    try:
      self._client.key_value_set(f'{_PREFIX}/failed/{self.process_id}', message[:2000], allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except  (the coordinator may be gone too; the heartbeat stops anyway)
      pass
    self._stop.set()

  def wait_for_a_lost_peer(self) -> None:
    """Returns after `timeout_s` plus two heartbeats unless the watchdog found a lost peer (and exited) by then."""
    self._thread.join(timeout=self.timeout_s + 2 * _HEARTBEAT_S)

  def finish(self) -> None:
    self._client.key_value_set(f'{_PREFIX}/done/{self.process_id}', '1', allow_overwrite=True)
    self._stop.set()
    self._thread.join()

  def _run(self) -> None:
    beats, last_seen = 0, {p: (None, time.monotonic()) for p in self._peers}
    while not self._stop.is_set():
      try:
        beats += 1
        self._client.key_value_set(f'{_PREFIX}/heartbeat/{self.process_id}', str(beats), allow_overwrite=True)
        for peer in self._peers:
          failure = self._try_get(f'{_PREFIX}/failed/{peer}')
          if failure is not None:
            self._exit(f'process {peer} failed: {failure}')
          if self._try_get(f'{_PREFIX}/done/{peer}') is not None:
            continue
          beat, since = last_seen[peer]
          now, current = time.monotonic(), self._try_get(f'{_PREFIX}/heartbeat/{peer}')
          if current != beat:
            last_seen[peer] = (current, now)
          elif now - since > self.timeout_s:
            self._exit(
              f'process {peer} sent no heartbeat for {now - since:.0f} s (peer_timeout_s='
              f'{self.timeout_s:g}): it died, was killed or hangs'
            )
      except Exception as error:  # pylint: disable=broad-except  (the coordinator's key-value store is gone)
        if self._stop.is_set():
          return
        self._exit(
          f'lost the coordinator (process 0 at {self._coordinator_address}): it died or was killed '
          f'({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""})'
        )
      self._stop.wait(_HEARTBEAT_S)

  def _try_get(self, key: str) -> str | None:
    try:
      return self._client.key_value_try_get(key)
    except Exception as error:  # pylint: disable=broad-except
      if 'NOT_FOUND' in str(error) or 'not found' in str(error).lower():
        return None
      raise

  def _exit(self, reason: str) -> None:
    """Ends this process now: its main thread may be blocked in a collective that will never complete."""
    os.write(2, f'\nshadowsync: stopping process {self.process_id}: {reason}.\n'.encode())
    os._exit(PEER_LOST_EXIT_CODE)  # pylint: disable=protected-access
