"""The watchdog of a process of a job: its heartbeat, published in the runtime's key-value store once a second, and
the peers' heartbeats watched; a peer found gone, hung or cut off (or the coordinator lost) ends this process with
`exit_codes.PEER_LOST`, now or, where the training loop handles the loss, after its grace (`PeerWatchdog.grace_s`).
`distributed` starts one per process and is its interface (`report`, `peer_lost`, `handle_peer_loss`, `fail`); its
module docstring says when a peer is lost.

  watchdog = PeerWatchdog(client, process_id, num_processes, timeout_s, coordinator_address)
  watchdog.start()                      # the heartbeat thread, and a guard thread that watches it
  watchdog.reported(step, 'train')      # the training thread's progress, sent with the next heartbeat
  watchdog.lost_reason                  # why a peer is lost, None while every peer is well
  exit_peer_lost(reason)                # ends this process with exit_codes.PEER_LOST, without JAX's exit handlers
"""

from collections.abc import Callable
import json
import os
import threading
import time
from typing import Any, NoReturn

import jax

from shadowsync_jax.parallel import exit_codes

HEARTBEAT_S = 1.0
# How long the watchdog waits for a training loop to reach a step boundary (to save and exit by itself): this many
# of its recent step times, within these bounds.
_STEP_BOUNDARY_GRACE_STEPS, _STEP_BOUNDARY_GRACE_S = 20, (0.25, 10.0)
PREFIX = 'shadowsync'  # Of every key this process sets in the runtime's key-value store.
# Phases in which a process's step may stand still for long (compiling, restoring, evaluating, waiting at the end).
_STILL_PHASES = ('setup', 'finish')


def exit_peer_lost(message: str) -> NoReturn:
  """Ends this process with `exit_codes.PEER_LOST` after `message`, without JAX's exit handlers (their shutdown
  barrier would wait for the peer that is gone)."""
  os.write(2, f'\nshadowsync: stopping process {jax.process_index()}: {message}.\n'.encode())
  os._exit(exit_codes.PEER_LOST)  # pylint: disable=protected-access


class PeerWatchdog:
  """Bumps this process's heartbeat and watches the peers' (`distributed`'s module docstring)."""

  def __init__(self, client, process_id: int, num_processes: int, timeout_s: float, coordinator_address: str):
    self._client, self.process_id, self.num_processes, self.timeout_s = client, process_id, num_processes, timeout_s
    self._peers = [p for p in range(num_processes) if p != process_id]
    self._coordinator_address = coordinator_address
    self._stop = threading.Event()
    self._woken = threading.Event()  # Set by a loss (or the stop): the watchdog's wait ends at once.
    self._thread = threading.Thread(target=self._run, name='peer-watchdog', daemon=True)
    self.step, self.phase, self.checkpoint = 0, 'setup', None  # Written by the training thread (`distributed.report`).
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
    while not self._stop.wait(HEARTBEAT_S):
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
    saved at a boundary (`distributed.handle_peer_loss`). Where the blocks' steps are collectives of the job
    (`distributed.block_dispatched`), the short one and at most one step more: a block whose steps need a dead peer
    ends only where the peer had done its part of every collective before it died, and then within the step the
    survivor was finishing. (The survivors of the Criteo Kaggle study had waited 2-10 s in such blocks, first for 20
    recent step times, `_step_s`, which count the saves between boundaries; then, until 2026-11-28, for the rest of
    the block, up to 6.4 s.) Otherwise the time of a few recent steps."""
    low, high = _STEP_BOUNDARY_GRACE_S
    if self.phase == 'setup' or not self.boundary_matters:
      return low
    if self._block_due is not None and self._lost_at is not None:
      return low + min(self._fast_step_s or 0.0, max(0.0, self._block_due - self._lost_at))
    return high if self._step_s is None else min(high, max(low, _STEP_BOUNDARY_GRACE_STEPS * self._step_s))

  def lose(self, reason: str) -> None:
    if self.lost_reason is None:
      self.lost_reason, self._lost_at = reason, time.monotonic()
      # Its grace counts from now: a loss told between heartbeats (SIGTERM) once waited out the rest of one, up to
      # 1 s more of every restart whose survivor was stuck.
      self._woken.set()

  def report_failure(self, message: str) -> None:
    try:
      self._client.key_value_set(f'{PREFIX}/failed/{self.process_id}', message[:2000], allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except  (the coordinator may be gone too; the heartbeat stops anyway)
      pass
    self._stop.set()
    self._woken.set()

  def wait_for_a_lost_peer(self) -> None:
    """Returns after `timeout_s` plus two heartbeats unless the watchdog found a lost peer (and exited) by then."""
    self._thread.join(timeout=self.timeout_s + 2 * HEARTBEAT_S)

  def finish(self) -> None:
    self._client.key_value_set(f'{PREFIX}/done/{self.process_id}', '1', allow_overwrite=True)
    self._stop.set()
    self._woken.set()
    self._thread.join()

  def _run(self) -> None:
    beats, seen = 0, {p: (None, None, time.monotonic(), time.monotonic()) for p in self._peers}
    while not self._stop.is_set():
      try:
        beats += 1
        beat = json.dumps({'beat': beats, 'step': self.step, 'phase': self.phase, 'checkpoint': self.checkpoint})
        self._client.key_value_set(f'{PREFIX}/heartbeat/{self.process_id}', beat, allow_overwrite=True)
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
      self._woken.wait(HEARTBEAT_S if self.lost_reason is None else 0.1)
      self._woken.clear()

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
    failure = self.try_get(f'{PREFIX}/failed/{peer}')
    if failure is not None:
      self.lose(f'process {peer} failed: {failure}')
      return
    if self.try_get(f'{PREFIX}/done/{peer}') is not None:
      return
    beat, step, beat_since, step_since = seen[peer]
    now, current = time.monotonic(), self.try_get(f'{PREFIX}/heartbeat/{peer}')
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

  def try_get(self, key: str) -> str | None:
    try:
      return self._client.key_value_try_get(key)
    except Exception as error:  # pylint: disable=broad-except
      if 'NOT_FOUND' in str(error) or 'not found' in str(error).lower():
        return None
      raise
