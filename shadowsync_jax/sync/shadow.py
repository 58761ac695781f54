"""ShadowSync (Zheng et al. 2020, arXiv:2003.03477): sync rounds in a background thread, off the training path.

  driver = ShadowSync(algorithm, 'ma', meshes, groups=('mlp',), min_interval_s='auto', max_overhead=0.05)
  driver.start(state_L, driver.initial_sync_state(state_L))   # starts the thread
  for block in ...:
    state_L, _ = train_block(state_L, block_L)   # n steps, no cross-replica collective in there
    state_L = driver.at_boundary(step, state_L, n)   # never waits for a round
    driver.loop_work(seconds)                    # the loop's own work (writes, saves): a long one is not a step's
    driver.next_due(step)                        # a boundary soon enough for a round to be handed over or merged
  state_L = driver.finish(state_L)               # last rounds with every process, then joins the thread

A round: the thread asks for a snapshot; at its next block boundary the training loop dispatches a copy `s` of the
synced params (a copy, so donating the params to the next block cannot delete what the thread reads) and hands it
over; the thread computes the synced `s'` (its collectives are the only ones) and posts `(s, s')`; at the next
boundary after that, the loop merges `w <- w + (s' - s)`, keeping the local steps made while the round ran. An
exception in the thread is re-raised by `at_boundary` at the first boundary after it happened. The loop dispatches
blocks of steps (docs/design.md §13); so that a round waits for a boundary no more than a small part of its pace, the
driver asks for a boundary every `FRESHNESS` of its interval (`next_due`).

Pace: a round starts no sooner than `min_interval_s` after the last one started. With 'auto' the interval is paced
(`pacing.Pacer`): the training thread times every step, those a round ran beside and those between rounds, and
spaces the rounds so that they cost the trainers at most `max_overhead` of their throughput; the thread waits for the
interval as it stands while it waits. `stats()` reports the pace and what it came from.

Several processes: each runs one such thread, and the threads are the only issuers of cross-process collectives
(docs/design.md §3), one round after the other, so round n of every process meets round n of the others. A process whose
stream is done keeps serving snapshots from `finish` until every process is done: each round first agrees on
whether all processes have finished, and all threads stop after that same round. The same agreement takes the
longest of the processes' paces, and every thread waits that long from the agreement, which they all leave
together: the processes come to the next round at about the same moment. (Each waiting its own pace, the one with
the shorter pace waited for the other inside the round, for seconds at a time, and counted the steps it made
meanwhile as the round's: its measured cost grew and with it its pace, and the rounds got rare.) The agreement goes
through the coordination service, not a collective, and comes before the snapshot is asked for: a process that
waits there for a late peer has handed nothing over and its devices train meanwhile, timed as between rounds. (As a
collective it held the process's devices while it waited, and the blocks queued behind it: seconds of training lost
a round, which the pace did not see as the round's.) For the same reason the round's collective is dispatched only
once every process has its snapshot (a second meeting through the service): dispatched at once, it held a process's
devices until its peer's next boundary, a block later or a straggler's slow step after. The first round waits for
the process's training to be under way, so that no round's collective waits for a peer's compile. Checkpoints
need no pause: every process saves its own part, with no collective (`recovery.checkpointing`).
"""

from collections.abc import Callable
import queue
import threading
import time
from typing import Any

import jax

from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import pacing
from shadowsync_jax.sync import rounds

PyTree = Any
_POLL_S = 0.05  # How often a waiting thread checks whether it was asked to stop.
_ABANDON_JOIN_S = 5.0  # How long a failing run waits for the thread to notice.
FRESHNESS = 0.25  # A boundary comes at least every this share of the pace: a round waits no longer for one.


def _round_agreement(meshes: replicas.ReplicaMeshes):
  """`agree(done, interval_s, stopped) -> (all_done, job_interval_s)`: whether every process of the job is done, and
  the longest of their paces (None if `stopped()` became true while a peer was awaited); through the coordination
  service when there are several processes (`distributed.Agreement`: a process waiting there for a late peer keeps
  training; a collective would hold its devices, and its steps behind it, for as long)."""
  if meshes.job is meshes.local:
    return lambda done, interval_s, stopped=None: (done, interval_s)
  agreement = distributed.Agreement('shadow_rounds')

  def agree(done: bool, interval_s: float, stopped=lambda: False) -> tuple[bool, float] | None:
    offers = agreement([done, interval_s], stopped)
    if offers is None:
      return None
    return all(done for done, _ in offers), max(interval_s for _, interval_s in offers)

  return agree


def _handover_rendezvous(meshes: replicas.ReplicaMeshes):
  """`all_handed_over(stopped) -> bool`: returns once every process has its round's snapshot (False if `stopped()`
  became true first), through the coordination service. The round's collective runs on the devices the training
  blocks run on: dispatched before a peer had its snapshot, it held this process's devices, and every block queued
  behind it, until the peer's next boundary (a block later, or a straggler's slow step)."""
  if meshes.job is meshes.local:
    return lambda stopped: True
  agreement = distributed.Agreement('shadow_handovers')
  return lambda stopped: agreement(True, stopped) is not None


class ShadowSync:
  """`shadow_*`: one background thread loops rounds, no faster than one per `min_interval_s` (seconds, or 'auto':
  paced to cost at most `max_overhead` of the trainers' throughput)."""

  def __init__(
    self,
    algorithm: algorithms.SyncAlgorithm,
    name: str,
    meshes: replicas.ReplicaMeshes,
    groups: tuple[str, ...],
    min_interval_s: float | str = 'auto',
    max_overhead: float = 0.05,
    tables: consensus.Tables = consensus.REPLICATED,
    first_round_after: int = 1,
  ):
    """`first_round_after`: steps from the start to the first boundary that may hand over a snapshot (after the
    compiling block; after 'auto''s probe, whose timed blocks a round's work would stretch and whose choice of K it
    would skew: `block_plan.steps_until_chosen`)."""
    self._name, self._meshes, self._groups, self._tables = name, meshes, groups, tables
    self._first_round_after = first_round_after
    self._first_snapshot_step = first_round_after
    self._pacer = pacing.Pacer(max_overhead, None if min_interval_s == 'auto' else float(min_interval_s))
    self._interval_s = self._pacer.interval_s()  # Written by the training thread, read by the shadow thread.
    self._clock = pacing.BlockClock(self._pacer)
    self._in_flight = False  # A snapshot was handed over and its round not merged yet.
    self._snapshot_step: int | None = None  # The boundary that handed it over (None: after the last step).
    self._merge_lags: list[int] = []  # Steps trained between a round's snapshot and its merge.
    self._init_R, self._sync_R = algorithms.stacked(algorithm, meshes.job)
    self._agree = _round_agreement(meshes)
    self._all_handed_over = _handover_rendezvous(meshes)
    self._job_interval_s: float | None = None  # The longest pace of the processes, agreed at the last round.
    self._sync_state_R = None  # That of the last merged round; the thread runs ahead on its own copy.
    self._snapshot_wanted = threading.Event()
    self._snapshots: queue.Queue = queue.Queue(maxsize=1)
    self._results: queue.Queue = queue.Queue(maxsize=1)
    self._stop = threading.Event()  # Abandon rounds now (the run failed).
    self._done = threading.Event()  # This process trained its whole stream; rounds go on until all processes are.
    self._error: BaseException | None = None
    self._failed = threading.Event()
    self._thread: threading.Thread | None = None
    self._compiled = False
    self._gaps = rounds.GapTracker()
    self._first_round_after_s = 0.0
    self._training = threading.Event()  # The training thread has passed `_first_snapshot_step`.

  def initial_sync_state(self, state_L: Any) -> PyTree:
    return self._init_R(replicas.to_job(rounds.select(state_L.params, self._groups), self._meshes))

  def start(self, state_L: Any, sync_state_R: PyTree, first_round_after_s: float = 0.0) -> None:
    """Compiles what the rounds run, then starts the thread; its first round comes `first_round_after_s` after the
    first boundary that may hand over a snapshot (a training run's at once; `studies.shadow_overhead` starts each
    timed window at a random phase of the pace, as a window of a steady run would)."""
    if not first_round_after_s >= 0:
      raise ValueError(f'first_round_after_s={first_round_after_s} must be >= 0.')
    self._first_round_after_s = first_round_after_s
    self._compile_rounds(state_L, sync_state_R)
    self._sync_state_R = sync_state_R
    self._gaps.reset(int(state_L.step[0]))
    self._first_snapshot_step = int(state_L.step[0]) + self._first_round_after
    self._clock.reset()
    self._in_flight, self._snapshot_step = False, None
    self._stop.clear()
    self._done.clear()
    self._snapshot_wanted.clear()
    self._training.clear()
    self._thread = threading.Thread(target=self._run, name='shadow-sync', daemon=True)
    replicas.reserve_collectives(self._thread)  # Until finish: the thread is the only issuer of collectives.
    self._thread.start()

  def _compile_rounds(self, state_L: Any, sync_state_R: PyTree) -> None:
    """Compiles the snapshot copy, the round and the merge for these shapes, once, before training goes on.

    Compiled on first use instead, the round (a second or more of compiling for `ea`) would take the training
    thread's cores, and the merge would stop the training thread itself, inside the run's timed steps.
    """
    if self._compiled:
      return
    synced_L = rounds.select(state_L.params, self._groups)
    rounds.copy.lower(synced_L).compile()
    self._sync_R.lower(replicas.to_job(synced_L, self._meshes), sync_state_R).compile()
    rounds.merge.lower(synced_L, synced_L, synced_L).compile()
    self._compiled = True

  def next_due(self, step: int) -> int | None:
    """A boundary within `FRESHNESS` of the pace the rounds follow (the job's: the longest of the processes' at the
    last agreement, or this process's own if longer); until a step time is known, every
    `pacing.MIN_STEPS_MEASURED` steps (blocks short enough that some fall between rounds, so that the pace gets
    measured at all); never before the first step that may hand over a snapshot: 'auto''s probe is not cut (cut to
    `MIN_STEPS_MEASURED`, its longer blocks timed short, and their fit chose K = 1).

    A pace of 0 set by hand (`min_interval_s=0`: rounds as fast as they go) asks for a boundary every step. An
    'auto' pace of 0 is one not measured yet (no round merged, or none left in the pacer's memory): no boundary is
    asked for then, and a round waits at most a block for one. (Cut to every step, a process whose first rounds
    waited seconds for a peer still compiling ran those seconds one step a dispatch: 2.3-5.7 s of a 2 x 4 job's
    ~15 s of training, 0.79-0.87 of `none`'s examples/sec.)"""
    step_s = self._pacer.step_time_s()
    pace_s = max(self._job_interval_s or 0.0, self._interval_s)
    if step_s is None:
      due = step + pacing.MIN_STEPS_MEASURED
    elif pace_s == 0 and self._pacer.fixed_interval_s is None:
      return self._first_snapshot_step if self._first_snapshot_step > step else None
    else:
      due = step + max(1, int(FRESHNESS * pace_s / step_s))
    return max(due, self._first_snapshot_step)

  def at_boundary(self, step: int, state_L: Any, steps: int, waited: bool = False, paused_s: float = 0.0) -> Any:
    """After a block of `steps` steps: raise the thread's error, time the steps for the pace, merge a finished
    round, hand over a wanted snapshot."""
    self._raise_if_failed()
    self._clock.boundary(time.perf_counter(), steps, self._in_flight, waited, paused_s)
    if step >= self._first_snapshot_step:
      self._training.set()
    state_L = self._step_boundary(state_L, step)
    self._interval_s = self._pacer.interval_s()
    return state_L

  def loop_work(self, seconds: float) -> None:
    """The loop's own work since the last boundary (metric writes, saves, its recovery's bookkeeping) took
    `seconds`. If that is longer than a mean step between rounds, the interval to the next boundary is left out of
    the pace: it carries a save or a write (which waits for the device), not a round's cost, and a few such
    intervals among a round's would make the round look many times dearer. Bookkeeping of microseconds leaves the
    interval timed, and so does everything before a step time is known (so that one gets known)."""
    step_s = self._pacer.step_time_s()
    if step_s is not None and seconds > step_s:
      self._clock.skip()

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    """Ends the rounds and joins the thread; raises its error if it failed.

    Normally this process's last params keep serving snapshots until every process of the job has finished its
    stream, and the rounds finished meanwhile are merged (they count as rounds, not as sync gaps). `abandon` (the run is
    failing) drops the round in flight and returns within seconds, without raising the thread's error.
    """
    self._clock.skip()  # What comes before the next step (a save, the end) is no step time.
    if self._thread is None:
      return state_L
    if abandon:  # The thread may be stuck in a collective with a dead process: wait a little, not forever.
      self._stop.set()
      self._thread.join(timeout=_ABANDON_JOIN_S)
      replicas.reserve_collectives(None)
      return state_L
    self._done.set()
    try:
      while self._thread.is_alive():
        self._raise_if_failed()
        state_L = self._step_boundary(state_L, step=None)
        self._thread.join(timeout=_POLL_S)
    finally:
      replicas.reserve_collectives(None)
    self._raise_if_failed()
    return self._step_boundary(state_L, step=None)

  def consensus_rule(self) -> consensus.Rule:
    return consensus.Rule(self._name, self._groups, self._tables)

  def consensus(self, params_L: PyTree) -> PyTree:
    return consensus.materialize(self.consensus_rule(), params_L, self._sync_state_R, self._meshes)

  def stats(self) -> dict[str, Any]:
    """The rounds and sync gaps (`rounds.GapTracker`), this process's pace (`pacing.Pacer.stats`),
    sync_job_interval_s: the pace the processes agreed on at the last round (the longest of theirs), and
    mean_merge_lag_steps: the steps trained between a round's snapshot and its merge, how stale a round is when it
    lands (the local steps `w + (s' - s)` keeps; under blocks, a block or more)."""
    lags = self._merge_lags
    return {
      **self._gaps.stats(),
      **self._pacer.stats(),
      'sync_job_interval_s': self._job_interval_s,
      'mean_merge_lag_steps': sum(lags) / len(lags) if lags else None,
    }

  def sync_state(self) -> PyTree:
    """The sync state of the last merged round, so it matches the params `at_boundary` returned (safe to save)."""
    return self._sync_state_R

  def wait_for_rounds(self, rounds: int, step_boundary, timeout_s: float = 60.0) -> None:
    """Test helper: calls `step_boundary()` until `rounds` rounds were merged (or raises TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    while self._gaps.rounds < rounds:
      if time.monotonic() > deadline:
        raise TimeoutError(f'only {self._gaps.rounds} of {rounds} shadow rounds in {timeout_s} s.')
      step_boundary()

  def _raise_if_failed(self) -> None:
    if self._failed.is_set():
      raise self._error

  def _step_boundary(self, state_L: Any, step: int | None) -> Any:
    """Merges a finished round (a sync gap unless `step` is None: after training), then hands over a wanted
    snapshot."""
    try:
      snapshot_L, synced_L, sync_state_R, latency_s = self._results.get_nowait()
    except queue.Empty:
      pass
    else:
      synced_groups = rounds.merge(rounds.select(state_L.params, self._groups), snapshot_L, synced_L)
      state_L = state_L._replace(params=rounds.with_synced(state_L.params, synced_groups))
      self._sync_state_R = sync_state_R
      self._gaps.merged(step, latency_s)
      if step is not None and self._snapshot_step is not None:
        self._merge_lags.append(step - self._snapshot_step)
      self._in_flight = False
      self._clock.touched()
      if step is not None:
        self._pacer.observe_round(latency_s)
    if self._snapshot_wanted.is_set() and (step is None or step >= self._first_snapshot_step):
      self._snapshot_wanted.clear()
      self._snapshots.put(rounds.copy(rounds.select(state_L.params, self._groups)))
      self._snapshot_step = step
      self._in_flight = True
      self._clock.touched()
    return state_L

  def _run(self) -> None:
    sync_state_R = self._sync_state_R
    try:
      # The first round waits for this process's training to be under way (past its compiling block and 'auto''s
      # probe): its agreement then finds every process training, and its collective waits for no peer's compile.
      while not (self._training.wait(_POLL_S) or self._stop.is_set() or self._done.is_set()):
        continue
      started_s = time.monotonic()
      self._wait(lambda: self._first_round_after_s - (time.monotonic() - started_s))
      while not self._stop.is_set():
        # Agree before asking for the snapshot (module docstring): a wait here for a late peer is no round's cost.
        agreed = self._agree(self._done.is_set(), self._interval_s, self._stop.is_set)
        if agreed is None:
          return
        all_done, self._job_interval_s = agreed
        round_start = time.monotonic()  # The same moment on every process: they all leave the agreement together.
        snapshot_L = self._next_snapshot()
        if snapshot_L is None or not self._all_handed_over(self._stop.is_set):
          return
        started = time.perf_counter()
        synced_R, sync_state_R = self._sync_R(replicas.to_job(snapshot_L, self._meshes), sync_state_R)
        synced_L = replicas.to_local(synced_R, self._meshes)
        jax.block_until_ready(synced_L)
        if not self._put_result((snapshot_L, synced_L, sync_state_R, time.perf_counter() - started)) or all_done:
          return
        self._wait_for_the_next_round(round_start)
    except BaseException as error:  # pylint: disable=broad-except  (handed to the training thread as it is)
      self._error = error
      self._failed.set()

  def _wait_for_the_next_round(self, round_start: float) -> None:
    """Until the pace after `round_start`: the longest the processes agreed on at that round, or this process's own
    if it grew since (the training thread may change it meanwhile); at once when this process is done, so that
    `finish` does not wait out the pace."""
    self._wait(lambda: max(self._job_interval_s, self._interval_s) - (time.monotonic() - round_start))

  def _wait(self, remaining_s: Callable[[], float]) -> None:
    """Until `remaining_s()` reaches 0 (asked again at every poll), or at once when stopped or this process is
    done."""
    while not (self._stop.is_set() or self._done.is_set()):
      left_s = remaining_s()
      if left_s <= 0:
        return
      self._stop.wait(min(left_s, _POLL_S))

  def _next_snapshot(self) -> PyTree | None:
    self._snapshot_wanted.set()
    while not self._stop.is_set():
      try:
        return self._snapshots.get(timeout=_POLL_S)
      except queue.Empty:
        continue
    return None

  def _put_result(self, result) -> bool:
    while not self._stop.is_set():
      try:
        self._results.put(result, timeout=_POLL_S)
        return True
      except queue.Full:
        continue
    return False
