"""A lost peer: what a process of a job saves when another one died, what it writes down, and its exit.

  loss = peer_loss.PeerLoss(process, live, keeps_live, records, finish_writing)
  loss.stop_if_lost(step, state_L, settled)     # at a block boundary: a peer lost, then save, write down, exit
  loss.stop(step, state_L, sync_state_L, why)   # the same, the loss known (a collective that failed)
  loss.stop_stuck(why)                          # from the watchdog, the training thread stuck in a collective
  loss.trained(step, settled)                   # after the last block: what `stop_stuck` saves from then on

When a peer is lost (`distributed.peer_lost`, or a collective that failed), a process under partial recovery first
saves its live state (`live_state`: its train state and sync state of its last step, or of its newest host copy
when its devices are stuck), then writes the loss into the job's history and exits with `exit_codes.PEER_LOST`;
whoever runs the job (`supervisor`, or a cluster's restart loop) starts it again. A survivor that could not save
its last step's state first lets the checkpoint being written finish (`finish_writing`, at most `WRITE_WAIT_S`):
its newest checkpoint may be newer than its newest host copy (`live_state`), and the restart restores the newer.
A survivor that trained its whole stream and waits for its peers at the end (the shadow rounds it serves until
every process is done) saves the state its last block ended with (`trained`): its training thread never reaches
another boundary, and the checkpoints' interval may hold no copy of it (seen: a survivor at its stream's end exited
with nothing saved, and its restart went back to its checkpoint).
"""

from collections.abc import Callable
import threading
import time
from typing import Any

import jax

from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import history
from shadowsync_jax.parallel import peer_watchdog
from shadowsync_jax.recovery import job_process
from shadowsync_jax.recovery import training_state

PyTree = Any
WRITE_WAIT_S = 10.0  # How long a survivor that exits waits for the checkpoint being written, at most.


class PeerLoss:
  """This process's end when a peer is lost (module docstring)."""

  def __init__(
    self,
    process: job_process.JobProcess,
    live: Any,
    keeps_live: Callable[[], bool],
    records: Callable[[], dict[str, float]],
    finish_writing: Callable[[], None] = lambda: None,
  ):
    """`live`: the `live_state.LiveKeeper`, if any; `keeps_live()`: whether the mode in force saves it (the
    partial modes, `cpr`); `records()`: this start's accounts, written down with the loss; `finish_writing()`:
    returns once the checkpoints being written are on disk."""
    self._process, self._live, self._keeps_live, self._records = process, live, keeps_live, records
    self._finish_writing = finish_writing
    self._trained: tuple[int, Any] | None = None  # (step, training tree) after the last block (`trained`).

  def _saves_live(self) -> bool:
    return self._live is not None and self._keeps_live()

  def stop_if_lost(self, step: int, state_L: Any, settled: Callable[[], tuple[Any, PyTree]]) -> None:
    """At a block boundary: where a peer is lost, `settled()`'s pair saved (the partial modes) and the exit."""
    if (reason := distributed.peer_lost()) is not None:
      self.stop(step, *settled(), reason)

  def stop(self, step: int, state_L: Any, sync_state_L: PyTree, reason: str) -> None:
    """At a block boundary: saves what survives (this step's live state, under partial recovery), writes it down,
    and exits PEER_LOST. Where the state of `step` cannot be read (its block failed in a collective, or was
    donated), the newest host copy is saved, and the step written down is the last one reported done: the block
    that failed trained nothing. Where nothing is saved, `step` is written down only if its block ended (a block
    of collectives dispatched after the peer died never does: it once counted 2 steps trained again that never
    were)."""
    saved = None
    if self._saves_live():
      try:
        saved = self._live.save(step, training_state.training_tree(state_L, sync_state_L))
      except Exception as error:  # pylint: disable=broad-except  (a donated buffer: the newest host copy will do)
        print(f'Process {self._process.index} could not save its live state: {type(error).__name__}: {error}')
        saved, step = self._newest_copy(), min(step, distributed.my_step())
    elif not _ended(state_L):
      step = min(step, distributed.my_step())
    self._write_down_and_exit(step, reason, saved)

  def trained(self, step: int, settled: Callable[[], tuple[Any, PyTree]]) -> None:
    """After the last block: `settled()`'s pair, made ready (the watchdog's thread reads it), is what `stop_stuck`
    saves from now on, where the mode saves live states. `forget()` once the final save is under way."""
    if self._saves_live():
      tree = training_state.training_tree(*settled())
      jax.block_until_ready(tree)
      self._trained = (step, tree)

  def forget(self) -> None:
    self._trained = None

  def stop_stuck(self, reason: str) -> None:
    """From the watchdog, when the training thread never reached a step boundary (its devices wait on a collective
    that will not complete, or it waits at the end for its peers): saves the state of its last block where it had
    trained its stream (`trained`), otherwise the newest host copy of the live state; writes it down, exits
    PEER_LOST."""
    saved, waited_s, started = None, distributed.lost_for_s(), time.perf_counter()
    if self._saves_live():
      saved = self._trained_state()
      if saved is None:
        saved = self._newest_copy()
    self._write_down_and_exit(
      distributed.my_step(),
      reason + '; the training thread was stuck',
      saved,
      timing={'waited_s': waited_s, 'live_write_s': time.perf_counter() - started},
    )

  def _trained_state(self) -> int | None:
    """Saves the state after the last block, if known and still there (its step; None: not saved)."""
    if (trained := self._trained) is None:
      return None
    try:
      return self._live.save(*trained)
    except Exception as error:  # pylint: disable=broad-except  (donated to the rounds at the end: a copy will do)
      print(f'Process {self._process.index} could not save the state of its last step: {type(error).__name__}: {error}')
      return None

  def _newest_copy(self) -> int | None:
    """The newest host copy written (its step; None: none), once the checkpoint being written is on disk or
    `WRITE_WAIT_S` passed (a writer stuck on the devices or the dead peer is left behind)."""
    writing = threading.Thread(target=self._finish_writing, name='finish-writing', daemon=True)
    writing.start()
    saved = self._live.save_latest()
    writing.join(timeout=WRITE_WAIT_S)
    return saved

  def _write_down_and_exit(self, step: int, reason: str, live_step: int | None, timing: dict | None = None) -> None:
    """`timing` (from the watchdog): how long after the loss it gave up on the loop, and the newest copy's write."""
    live_saved = live_step is not None
    process = self._process
    history.append(
      process.workdir,
      process.writer,
      {
        'event': 'peer_lost',
        'generation': process.generation,
        'process': process.index,
        'step': step,
        'peer_steps': {str(q): status['step'] for q, status in distributed.peer_status().items()},
        'reason': reason,
        'live_saved': live_saved,
        'live_step': live_step,
        **(timing or {}),
        **self._records(),
      },
    )
    peer_watchdog.exit_peer_lost(reason + (f'; live state of step {live_step} saved' if live_saved else ''))


def _ended(state_L: Any) -> bool:
  """Whether the block that made `state_L` has ended (without waiting for it; a donated state has not)."""
  try:
    return state_L.step.is_ready()
  except RuntimeError:  # Deleted: donated to a block dispatched after it.
    return False
