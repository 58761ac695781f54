"""The multi-process runtime: `jax.distributed` (gloo on CPU) and a watchdog that finds a peer gone or hung.

  distributed.initialize('127.0.0.1:1234', num_processes=2, process_id=0, peer_timeout_s=30)
  ...                                   # jax.devices(): the job's devices; jax.local_devices(): this process's
  distributed.report(step, phase='train')      # progress the peers watch: a peer whose step stalls is hung
  values = distributed.exchange('plan', mine)  # every process's value, in process order (the key-value store)
  agree = distributed.Agreement('rounds')      # the same, again at every call (agree(value, stopped) -> values)
  meet = distributed.VectorAgreement('sums')   # the same for float32 vectors (meet(vector, stopped) -> vectors)
  if distributed.peer_lost():                  # at a step boundary: save what survives, exit PEER_LOST
  distributed.fail(error)               # on an exception: ends this process, blaming it or a peer that is gone
  distributed.finish()                  # normal end: the peers stop watching this process; shuts the runtime down

One process per host (or per GPU); the same code on CPU, GPU and TPU. Cross-process collectives go over gloo on
CPU and NCCL on GPUs. The coordination service runs in process 0 (JAX's way) or, with `start_service=False`, in
whoever started the job (`launcher`, `coordinator`): then a dead process 0 is a peer like any other, where JAX
would abort every survivor the moment it died.

A process that dies (killed, crashed) or hangs would leave its peers waiting in a collective for good. Every
process publishes a heartbeat in the runtime's key-value store once a second: a counter, and the step and phase
its training thread last reported. A peer is lost when it reported a failure, when its heartbeat stops for
`peer_timeout_s` (dead, or stopped), when it is training and its step has not moved for `peer_timeout_s` (hung),
or when the key-value store itself does not answer for `peer_timeout_s` (a network partition: its calls have no
deadline, so a guard thread that makes none watches the watchdog). Then `peer_lost()` becomes true: a training
loop that checks it at its step boundaries (`handle_peer_loss(True)`) gets the time of a few steps to save what it
holds and exit with `exit_codes.PEER_LOST`; any other process, or one whose training thread is stuck in a collective, is
ended by the watchdog with that code.
"""

from collections.abc import Callable
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

import jax
import numpy as np

from shadowsync_jax.parallel import exit_codes
from shadowsync_jax.parallel import network
from shadowsync_jax.parallel import private_apis

PEER_LOST_EXIT_CODE = exit_codes.PEER_LOST
_HEARTBEAT_S = 1.0
# How long the watchdog waits for a training loop to reach a step boundary (to save and exit by itself): this many
# of its recent step times, within these bounds.
_STEP_BOUNDARY_GRACE_STEPS, _STEP_BOUNDARY_GRACE_S = 20, (0.5, 10.0)
_PREFIX = 'shadowsync'
_EXCHANGE_TIMEOUT_MS = 300_000
_AGREEMENT_POLL_MS = 50  # How often an `Agreement` waiting for a peer asks whether it was stopped.
# Phases in which a process's step may stand still for long (compiling, restoring, evaluating, waiting at the end).
_STILL_PHASES = ('setup', 'finish')

_watchdog: '_PeerWatchdog | None' = None


def initialize(
  coordinator_address: str,
  num_processes: int,
  process_id: int,
  peer_timeout_s: float = 30.0,
  start_service: bool = True,
) -> None:
  """Joins the job as `process_id` of `num_processes`; process 0 starts the coordination service at
  `coordinator_address` unless `start_service` is False (it runs elsewhere: `coordinator.host`)."""
  global _watchdog
  if not 0 <= process_id < num_processes:
    raise ValueError(f'process_id={process_id} must be in [0, num_processes={num_processes}).')
  if peer_timeout_s < 2 * _HEARTBEAT_S:
    raise ValueError(f'peer_timeout_s={peer_timeout_s} must be at least {2 * _HEARTBEAT_S} s.')
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.config.update('jax_enable_preemption_service', False)  # Preemption is SIGTERM here (`_on_sigterm`).
  private_apis.bind_gloo_to(network.local_address_towards(coordinator_address))
  # JAX's own liveness check ends the process with a fatal log; ours, faster, says which peer and why.
  heartbeat_timeout_s = int(3 * peer_timeout_s) + 10
  private_apis.connect_client(coordinator_address, num_processes, process_id, heartbeat_timeout_s, start_service)
  _watchdog = _PeerWatchdog(
    private_apis.distributed_client(), process_id, num_processes, peer_timeout_s, coordinator_address
  )
  _watchdog.start()
  _watch_for_sigterm()


def active() -> bool:
  """Whether this process is part of a job of several processes set up by `initialize`."""
  return _watchdog is not None


def report(step: int, phase: str = 'train', checkpoint: int | None = None) -> None:
  """The training thread's progress (and its newest complete checkpoint, when it knows one), published with the
  next heartbeat: cheap, call it every step."""
  if _watchdog is not None:
    _watchdog.reported(step, phase)
    if checkpoint is not None:
      _watchdog.checkpoint = checkpoint


def block_dispatched(steps: int | None) -> None:
  """The training thread dispatched a block of `steps` steps that are collectives of the job (sharded tables, sync
  SGD): it cannot end without every peer, so a lost peer gives the loop at most a step more than the short grace
  to reach its boundary (`_PeerWatchdog.grace_s`). None: no such block from now on (the loop ended)."""
  if _watchdog is not None:
    _watchdog.dispatched(steps)


def lost_for_s() -> float | None:
  """Seconds since a peer was lost (or this process told to stop), None while every peer is well."""
  lost_at = _watchdog._lost_at if _watchdog is not None else None  # pylint: disable=protected-access
  return None if lost_at is None else time.monotonic() - lost_at


def my_step() -> int:
  """The step this process's training thread last reported."""
  return _watchdog.step if _watchdog is not None else 0


def peer_lost() -> str | None:
  """Why a peer is lost (or this process was told to stop: SIGTERM), None while every peer is well."""
  return _watchdog.lost_reason if _watchdog is not None else None


def handle_peer_loss(
  enabled: bool, last_resort: Callable[[str], None] | None = None, boundary_matters: bool = True
) -> None:
  """While enabled, a lost peer is left to the training loop (`peer_lost`), which saves and exits within
  `_STEP_BOUNDARY_GRACE_S`; otherwise, and after that, the watchdog ends this process, after calling
  `last_resort(reason)` (the training thread is stuck: save what can be saved without it). Where the loop would
  save nothing at its boundary that `last_resort` does not (`boundary_matters` False: no live state is kept), the
  wait is the short one."""
  if _watchdog is not None:
    _watchdog.loop_handles_loss, _watchdog.last_resort = enabled, last_resort
    _watchdog.boundary_matters = boundary_matters


def peer_status() -> dict[int, dict[str, Any]]:
  """What each peer last reported: its `step` (where a dead peer had got to, for a partial recovery) and its newest
  complete `checkpoint` (the newest one every process has bounds what a full recovery may need)."""
  return {peer: dict(status) for peer, status in _watchdog.peer_status.items()} if _watchdog is not None else {}


def exchange(name: str, value: Any) -> list[Any]:
  """Every process's `value` (JSON-able) under `name`, in process order: each publishes, then reads the others'.
  A synchronization point of the job, through the coordination service (no collective)."""
  if _watchdog is None:
    return [value]
  client, process_id = private_apis.distributed_client(), _watchdog.process_id
  client.key_value_set(f'{_PREFIX}/exchange/{name}/{process_id}', json.dumps(value))
  return [
    json.loads(client.blocking_key_value_get(f'{_PREFIX}/exchange/{name}/{p}', _EXCHANGE_TIMEOUT_MS))
    for p in range(_watchdog.num_processes)
  ]


class Agreement:
  """Every process's value at each call, in process order: the n-th call of each process meets the n-th of the
  others, through the coordination service. No collective: a process that waits here for a late peer holds none of
  its devices (a collective would, and its training steps, queued behind it on those devices, would wait too).

    agree = distributed.Agreement('shadow_rounds')
    values = agree(value, stopped=event.is_set)   # None if `stopped()` became true while a peer was awaited
  """

  def __init__(self, name: str):
    self._name, self._calls = name, 0

  def __call__(self, value: Any, stopped: Callable[[], bool] = lambda: False) -> list[Any] | None:
    if _watchdog is None:
      return [value]
    client, me, call = private_apis.distributed_client(), _watchdog.process_id, self._calls
    client.key_value_set(self._key(call, me), json.dumps(value))
    values = []
    for process in range(_watchdog.num_processes):
      while (got := _get_within(client, self._key(call, process), _AGREEMENT_POLL_MS)) is None:
        if stopped():
          return None
      values.append(json.loads(got))
    # Every peer has read this process's value of call n - 2: it set its own value of call n - 1 after reading it.
    if call >= 2:
      client.key_value_delete(self._key(call - 2, me))
    self._calls += 1
    return values

  def _key(self, call: int, process: int) -> str:
    return f'{_PREFIX}/agreement/{self._name}/{call}/{process}'


class VectorAgreement:
  """`Agreement` for float32 vectors (a shadow round's sums, `sync.shadow`): every process's vector at each call, in
  process order, as bytes in chunks of at most `chunk_bytes` (the service's messages stay small). No collective: a
  process that waits here for a late peer holds none of its devices, and its training goes on.

    meet = distributed.VectorAgreement('shadow_sums')
    vectors = meet(vector, stopped=event.is_set)   # None if `stopped()` became true while a peer was awaited
  """

  def __init__(self, name: str, chunk_bytes: int = 1 << 20):
    self._name, self._chunk_bytes, self._calls = name, chunk_bytes, 0

  def __call__(self, vector: np.ndarray, stopped: Callable[[], bool] = lambda: False) -> list[np.ndarray] | None:
    vector = np.ascontiguousarray(vector, np.float32)
    if _watchdog is None:
      return [vector]
    client, me, call = private_apis.distributed_client(), _watchdog.process_id, self._calls
    data = vector.tobytes()
    chunks = max(1, -(-len(data) // self._chunk_bytes))  # The same count on every process: vectors of one size.
    for chunk in range(chunks):
      client.key_value_set_bytes(
        self._key(call, me, chunk), data[chunk * self._chunk_bytes : (chunk + 1) * self._chunk_bytes]
      )
    vectors = []
    for process in range(_watchdog.num_processes):
      if process == me:  # Its own, as it was set: not read back through the service.
        vectors.append(vector)
        continue
      pieces = []
      for chunk in range(chunks):
        while (got := _get_bytes_within(client, self._key(call, process, chunk), _AGREEMENT_POLL_MS)) is None:
          if stopped():
            return None
        pieces.append(got)
      vectors.append(np.frombuffer(b''.join(pieces), np.float32))
    if call >= 2:  # Every peer has read call n - 2: it set its call n - 1 after reading it.
      for chunk in range(chunks):
        client.key_value_delete(self._key(call - 2, me, chunk))
    self._calls += 1
    return vectors

  def _key(self, call: int, process: int, chunk: int) -> str:
    return f'{_PREFIX}/vectors/{self._name}/{call}/{process}/{chunk}'


def _get_bytes_within(client, key: str, timeout_ms: int) -> bytes | None:
  """The bytes of `key`, or None if it was not set within `timeout_ms`."""
  try:
    return client.blocking_key_value_get_bytes(key, timeout_ms)
  except Exception as error:  # pylint: disable=broad-except
    if 'DEADLINE_EXCEEDED' in str(error):
      return None
    raise


def _get_within(client, key: str, timeout_ms: int) -> str | None:
  """The value of `key`, or None if it was not set within `timeout_ms`."""
  try:
    return client.blocking_key_value_get(key, timeout_ms)
  except Exception as error:  # pylint: disable=broad-except
    if 'DEADLINE_EXCEEDED' in str(error):
      return None
    raise


def wait_for_every_process(name: str) -> None:
  """Returns once every process has called it with `name`: a barrier through the coordination service, with no
  deadline (a peer that dies meanwhile is the watchdog's to find), for processes far apart in time, e.g. a fast one
  that finished its stream long before a straggler: the collectives that follow would time out waiting (gloo gives
  a peer 30 s to join a new group)."""
  if _watchdog is None:
    return
  client = private_apis.distributed_client()
  client.key_value_set(f'{_PREFIX}/barrier/{name}/{_watchdog.process_id}', '1')
  for process in range(_watchdog.num_processes):
    while _watchdog._try_get(f'{_PREFIX}/barrier/{name}/{process}') is None:  # pylint: disable=protected-access
      time.sleep(0.2)


def exit_peer_lost(message: str) -> NoReturn:
  """Ends this process with `exit_codes.PEER_LOST` after `message`, without JAX's exit handlers (their shutdown
  barrier would wait for the peer that is gone)."""
  os.write(2, f'\nshadowsync: stopping process {jax.process_index()}: {message}.\n'.encode())
  os._exit(PEER_LOST_EXIT_CODE)  # pylint: disable=protected-access


def fail(error: BaseException, exit_code: int = 1, explain: str | None = None) -> NoReturn:
  """Ends this process after `error` with `exit_code`, blaming the right process.

  An error from the transport (a collective whose partner vanished) is most likely a peer's death: the watchdog
  gets `peer_timeout_s` to name that peer (and ends the process itself); the error's traceback is printed only if
  no peer was lost by then (a peer's death is a line, not a crash of this process). Any other error is this
  process's own: `explain` (one line) or its traceback is printed, the peers are told at once, and stop naming it.
  Exits without waiting for the peers, as a normal exit would.
  """
  if _watchdog is not None and looks_like_a_lost_peer(error):
    first_line = str(error).splitlines()[0] if str(error) else ''
    os.write(
      2,
      f'\nshadowsync: process {_watchdog.process_id}: a collective failed ({type(error).__name__}: '
      f'{first_line[:300]}); waiting up to {_watchdog.timeout_s:g} s to learn whether a peer is gone.\n'.encode(),
    )
    _watchdog.loop_handles_loss = False
    _watchdog.wait_for_a_lost_peer()
  _print_own_error(error, explain)
  if _watchdog is not None:
    _watchdog.report_failure(f'{type(error).__name__}: {error}')
  os._exit(exit_code)  # pylint: disable=protected-access


def _print_own_error(error: BaseException, explain: str | None) -> None:
  if explain is not None:
    print(explain, file=sys.stderr)
  else:
    traceback.print_exception(error)
  sys.stderr.flush()
  sys.stdout.flush()


def looks_like_a_lost_peer(error: BaseException) -> bool:
  """Whether `error` is what a collective raises when its partner vanished (it names no one)."""
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


def _watch_for_sigterm() -> None:
  """A scheduler's "stop now" (preemption), or the launcher telling of a dead peer: like a lost peer. Python runs a
  signal handler only when its main thread runs Python, which it may never do again (stuck behind a collective), so
  the signal is read from the interpreter's wakeup pipe, written by its C handler, in a thread of its own."""
  read_end, write_end = os.pipe()
  os.set_blocking(write_end, False)
  signal.signal(signal.SIGTERM, lambda *_: None)  # Handled below; the default would end the process at once.
  signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

  def watch():
    while True:
      signals = os.read(read_end, 64)
      if signal.SIGTERM in signals and _watchdog is not None:
        _watchdog.lose('told to stop (SIGTERM)')

  threading.Thread(target=watch, name='sigterm-watch', daemon=True).start()


class _PeerWatchdog:
  """Bumps this process's heartbeat and watches the peers' (see the module docstring)."""

  def __init__(self, client, process_id: int, num_processes: int, timeout_s: float, coordinator_address: str):
    self._client, self.process_id, self.num_processes, self.timeout_s = client, process_id, num_processes, timeout_s
    self._peers = [p for p in range(num_processes) if p != process_id]
    self._coordinator_address = coordinator_address
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name='peer-watchdog', daemon=True)
    self.step, self.phase, self.checkpoint = 0, 'setup', None  # Written by the training thread (`report`).
    self._step_s, self._reported_at = None, None  # A training step's recent duration, and when the last one ended.
    self._fast_step_s = None  # The same, following the fastest recent boundaries (`reported`).
    self.loop_handles_loss = False
    self.last_resort: Callable[[str], None] | None = None
    self.boundary_matters = True
    self.lost_reason: str | None = None
    self._lost_at: float | None = None
    self._block_due: float | None = None  # When the last collective block dispatched should end (`dispatched`).
    self.peer_status: dict[int, dict[str, Any]] = {}

  def start(self) -> None:
    self._last_round = time.monotonic()
    self._thread.start()
    threading.Thread(target=self._guard, name='peer-watchdog-guard', daemon=True).start()

  def _guard(self) -> None:
    """Watches the watchdog: a key-value call blocks for as long as the coordinator is unreachable."""
    while not self._stop.wait(_HEARTBEAT_S):
      stale = time.monotonic() - self._last_round
      if stale > self.timeout_s:
        self.lose(
          f'cannot reach the coordinator at {self._coordinator_address}: no key-value call returned for '
          f'{stale:.0f} s (peer_timeout_s={self.timeout_s:g}): a network partition, or the coordinator hangs'
        )
        self._end_if_due()

  def reported(self, step: int, phase: str) -> None:
    now = time.monotonic()
    if phase == 'train' and self.phase == 'train' and step > self.step and self._reported_at is not None:
      seconds = (now - self._reported_at) / (step - self.step)
      self._step_s = seconds if self._step_s is None else 0.9 * self._step_s + 0.1 * seconds
      # The device's pace, nearly: boundaries with a save between them read slower, so it follows the fast ones.
      fast = self._fast_step_s
      self._fast_step_s = seconds if fast is None or seconds < fast else 0.98 * fast + 0.02 * seconds
    self.step, self.phase, self._reported_at = step, phase, now

  def dispatched(self, steps: int | None) -> None:
    pace, now = self._fast_step_s, time.monotonic()
    if steps is None or pace is None:
      self._block_due = None if steps is None else now  # No pace yet: the short grace.
    else:
      self._block_due = max(now, self._block_due or now) + steps * pace  # After the blocks dispatched before it.

  def grace_s(self) -> float:
    """How long a training loop may take to reach its next step boundary. Before its first block of this start is
    done (phase 'setup': compiling, or its devices wait on a collective with a peer that is gone), the short one:
    what it would save at a boundary is what it started from, already on disk. The short one too where nothing is
    saved at a boundary (`handle_peer_loss`). Where the blocks' steps are collectives of the job (`block_dispatched`),
    the short one and at most one step more: a block whose steps need a dead peer ends only where the peer had done
    its part of every collective before it died, and then within the step the survivor was finishing. (The survivors
    of the Criteo Kaggle study had waited 2-10 s in such blocks, first for 20 recent step times, `_step_s`, which
    count the saves between boundaries; then, until 2026-11-28, for the rest of the block, up to 6.4 s.) Otherwise
    the time of a few recent steps."""
    low, high = _STEP_BOUNDARY_GRACE_S
    if self.phase == 'setup' or not self.boundary_matters:
      return low
    if self._block_due is not None and self._lost_at is not None:
      return low + min(self._fast_step_s or 0.0, max(0.0, self._block_due - self._lost_at))
    return high if self._step_s is None else min(high, max(low, _STEP_BOUNDARY_GRACE_STEPS * self._step_s))

  def lose(self, reason: str) -> None:
    if self.lost_reason is None:
      self.lost_reason, self._lost_at = reason, time.monotonic()

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
    beats, seen = 0, {p: (None, None, time.monotonic(), time.monotonic()) for p in self._peers}
    while not self._stop.is_set():
      try:
        beats += 1
        beat = json.dumps({'beat': beats, 'step': self.step, 'phase': self.phase, 'checkpoint': self.checkpoint})
        self._client.key_value_set(f'{_PREFIX}/heartbeat/{self.process_id}', beat, allow_overwrite=True)
        for peer in self._peers:
          self._watch(peer, seen)
      except Exception as error:  # pylint: disable=broad-except  (the coordinator's key-value store is gone)
        if self._stop.is_set():
          return
        self.lose(
          f'lost the coordinator at {self._coordinator_address}: it died or was killed '
          f'({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""})'
        )
      self._last_round = time.monotonic()
      self._end_if_due()
      self._stop.wait(_HEARTBEAT_S if self.lost_reason is None else 0.1)

  def _end_if_due(self) -> None:
    """Once a peer is lost: now, unless the training loop handles it; then after its grace."""
    if self.lost_reason is not None and not self._stop.is_set():
      waited = time.monotonic() - self._lost_at
      if not self.loop_handles_loss or waited > self.grace_s():
        if self.loop_handles_loss and self.last_resort is not None:
          self.last_resort(self.lost_reason)  # Exits itself; returns only if it could not.
        exit_peer_lost(self.lost_reason)

  def _watch(self, peer: int, seen: dict) -> None:
    """Updates what is known of `peer`; loses it if it failed, went silent or stalled in training."""
    failure = self._try_get(f'{_PREFIX}/failed/{peer}')
    if failure is not None:
      self.lose(f'process {peer} failed: {failure}')
      return
    if self._try_get(f'{_PREFIX}/done/{peer}') is not None:
      return
    beat, step, beat_since, step_since = seen[peer]
    now, current = time.monotonic(), self._try_get(f'{_PREFIX}/heartbeat/{peer}')
    if current != beat:
      status = json.loads(current) if current else {}
      self.peer_status[peer] = {'step': status.get('step', 0), 'checkpoint': status.get('checkpoint')}
      moved = status.get('step') != step or status.get('phase') in _STILL_PHASES
      seen[peer] = (current, status.get('step'), now, now if moved else step_since)
    elif now - beat_since > self.timeout_s:
      self.lose(
        f'process {peer} sent no heartbeat for {now - beat_since:.0f} s (peer_timeout_s={self.timeout_s:g}): '
        'it died, was killed, stopped or cut off'
      )
    if now - seen[peer][3] > self.timeout_s:
      self.lose(
        f'process {peer} made no training step for {now - seen[peer][3]:.0f} s (peer_timeout_s='
        f'{self.timeout_s:g}): it hangs'
      )

  def _try_get(self, key: str) -> str | None:
    try:
      return self._client.key_value_try_get(key)
    except Exception as error:  # pylint: disable=broad-except
      if 'NOT_FOUND' in str(error) or 'not found' in str(error).lower():
        return None
      raise
