"""ShadowSync (Zheng et al. 2020, arXiv:2003.03477) across processes: sync rounds in a background thread, off the
training path, the replicas of the job meeting on the host.

  driver = ShadowSync(algorithm, 'ma', meshes, groups=('mlp',), min_interval_s='auto', max_overhead=0.05)
  driver.start(state_L, driver.initial_sync_state(state_L))   # times a round, starts the thread
  for block in ...:                              # b: the loop's `hooks.Boundary`
    driver.before_block(b)                       # lands a finished round on b.state, hands a wanted snapshot over
    state_L, _ = train_block(state_L, block_L)   # n steps, no cross-replica collective in there
    driver.at_boundary(b)                        # times the blocks (less b.work_s's long ones); raises its error
  state_L = driver.finish(state_L)               # last rounds with every process, then joins the thread

Where the job's processes step apart (`drivers.make`; one process, and jobs whose steps are collectives,
fuse their rounds into the blocks: `scheduled`). A round (docs/design.md §3, `algorithms.met_rounds`): the thread
asks for a snapshot; at its next block boundary, before the next block, the training loop dispatches one program
that lands the round's lead on the live params (each replica's own part of the round: EA's pull, BMUF's momentum
step), keeps a copy `s` of the params as they were, and computes each replica's contribution to the round (what
the algorithm averages); the thread reads them, sums this process's on the host (no collective even among its own
devices: one waits for the slowest device's block), meets every process's sum (`parallel.peer_links`: a
direct connection to each other process; no collective, so no device waits for a peer) and posts the job's mean; at
the next boundary after that, a second program lands the rest of the round, `s' - s - lead`, into the live params,
keeping the local steps made meanwhile. A boundary hands a snapshot over only once the round before has landed, so a
snapshot holds every earlier round. An exception in the thread is re-raised at the first boundary after it happened.

Pace: a round starts no sooner than `min_interval_s` after the last one started. With 'auto' the interval is the
round's cost over the budget, `max_overhead` of the trainers' throughput (`pacing.GapPacer`): its device time (its
two programs, timed by `start` on copies) and its host work (the thread's, and the training thread's at the
round's boundaries: CPU seconds, measured round by round). `stats()` reports the pace and what it came from, and
how late rounds land (`mean_merge_lag_steps`, `mean_round_latency_s`).

Several processes: each runs one such thread, one round after the other, so round n of every process meets round
n of the others. A process whose stream is done keeps serving snapshots from `finish` until every process is done:
each round first agrees (`host_meeting`) on whether all processes have finished, and all threads stop after that
same round. The same agreement takes the longest of the processes' paces, and every thread waits that long from the
agreement, which they all leave together: the processes come to the next round at about the same moment. The
first round waits for the process's training to be under way. Checkpoints need no pause: every process saves its own
part, with no collective (`recovery.checkpointing`), a round in flight left out of it whole (`settled`).

(Before, a round was a collective of the job's devices, dispatched by this thread: it waited on a process's devices,
and the blocks queued behind it, for its peer's, up to a block, or a straggler's slow block; a 2 x 4 job measured
0.13-0.15 s a round and paced them 4-5 s apart. Tried and left, issue 64: both phases fused into the blocks, as in
one process, with no program of their own (a snapshot handed over after a block's last step, the round landed before
the first step of the block after next, whose carry waited up to half a block for the thread's meeting and the next
round's agreement). A round then landed one block after its snapshot instead of two, but the job ran no faster,
2 x 4 at the default config and K 16, 3 runs of each against this driver: `shadow_ea` 0.94-1.09 of its speed,
`shadow_bmuf` 0.96-1.01, `shadow_ma` 1.00; it came to the boundary it needed a little less often (28-29 rounds a run
against 30-33), and NE was no better: `shadow_ea` 0.855-0.859 against 0.852-0.856, `shadow_bmuf` 0.842-0.845
against 0.840-0.843. Without the carry's wait it missed that boundary by a few ms every round: a round every third
block, `shadow_ea` 0.862.)
"""

import collections
from collections.abc import Callable
import queue
import statistics
import threading
import time
from typing import Any

import jax

from shadowsync_jax import hooks
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import host_meeting
from shadowsync_jax.sync import pacing
from shadowsync_jax.sync import restarts
from shadowsync_jax.sync import rounds

PyTree = Any
_POLL_S = 0.05  # How often a waiting thread checks whether it was asked to stop.
_HOST_COST_ROUNDS = 8  # The rounds whose host work's mean is the host cost of a round (`pacing.GapPacer`).
_ABANDON_JOIN_S = 5.0  # How long a failing run waits for the thread to notice.


class ShadowSync(hooks.Hook):
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
    # What a restart builds its fresh driver from (`fresh`).
    self._settings = (algorithm, name, meshes, groups, min_interval_s, max_overhead, tables)
    self._first_round_after = first_round_after
    self._first_snapshot_step = first_round_after
    self._pacer = pacing.GapPacer(max_overhead, None if min_interval_s == 'auto' else float(min_interval_s))
    self._interval_s = self._pacer.interval_s()  # Written by the training thread, read by the shadow thread.
    self._clock = pacing.BlockClock(self._pacer)
    self._in_flight = False  # A snapshot was handed over and its round not merged yet.
    self._snapshot_step: int | None = None  # The boundary that handed it over (None: after the last step).
    self._merge_lags: list[int] = []  # Steps trained between a round's snapshot and its merge,
    self._merge_lags_s: list[float] = []  # and seconds.
    self._handed_over_at = 0.0
    self._init_R, _ = algorithms.stacked(algorithm, meshes.job)
    self._hand_over_L, self._land_L, self._take_back_L = algorithms.met_rounds(algorithm, meshes.local)
    self._num_replicas = meshes.job.shape[replicas.REPLICA_AXIS]
    # (snapshot, the sync state it started from) of a round handed over, not landed yet: its lead has landed.
    self._handed_over: tuple[PyTree, PyTree] | None = None
    # (led copy, snapshot, sync state) of a round served after the last step (`finish`), not met yet.
    self._served: tuple[PyTree, PyTree, PyTree] | None = None
    self._links = host_meeting.peer_links(meshes)
    self._agree = host_meeting.round_agreement(meshes, self._links)
    self._meet = host_meeting.sums_meeting(meshes, self._links)
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
    # The thread's CPU seconds for each of its last rounds' host work (its sums read, met and averaged), and their
    # mean: on the training process's cores, a cost of the round beside its programs' device time (`pacing`).
    self._host_costs_s: collections.deque[float] = collections.deque(maxlen=_HOST_COST_ROUNDS)
    self._host_cost_s = 0.0
    # The training thread's CPU seconds at the boundaries of each of its last rounds (dispatching the hand-over and
    # the landing, the sync state's arrays), and their mean: the round's host work on that thread.
    self._boundary_costs_s: collections.deque[float] = collections.deque(maxlen=_HOST_COST_ROUNDS)
    self._boundary_cost_s = 0.0
    self._boundary_cpu_s = 0.0  # Since the last landing.
    self._first_round_after_s = 0.0
    self._training = threading.Event()  # The training thread has passed `_first_snapshot_step`.

  def fresh(self) -> 'ShadowSync':
    """A new driver of this one's settings, not started: a restart's, its first round a step after it."""
    return ShadowSync(*self._settings)

  def restarted(self, state_L: Any, sync_state_R: PyTree) -> restarts.RestartedSync:
    """This driver ended at once and a fresh one started from (`state_L`, `sync_state_R`) (full recovery)."""
    return restarts.restart(self, state_L, sync_state_R)

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
    self._pacer.observe_round_cost(self._time_a_round(state_L, sync_state_R))
    self._sync_state_R = sync_state_R
    self._gaps.reset(int(state_L.step[0]))
    self._first_snapshot_step = int(state_L.step[0]) + self._first_round_after
    self._clock.reset()
    self._in_flight, self._snapshot_step, self._served = False, None, None
    self._stop.clear()
    self._done.clear()
    self._snapshot_wanted.clear()
    self._training.clear()
    self._thread = threading.Thread(target=self._run, name='shadow-sync', daemon=True)
    self._thread.start()

  def _compile_rounds(self, state_L: Any, sync_state_R: PyTree) -> None:
    """Compiles the snapshot copy, the round and the merge for these shapes, once, before training goes on.

    Compiled on first use instead, the round (a second or more of compiling for `ea`) would take the training
    thread's cores, and the merge would stop the training thread itself, inside the run's timed steps.
    """
    if self._compiled:
      return
    synced_L = rounds.select(state_L.params, self._groups)
    sync_state_L = replicas.to_local(sync_state_R, self._meshes)
    self._hand_over_L.lower(synced_L, sync_state_L).compile()
    contributions_L = jax.eval_shape(self._hand_over_L, synced_L, sync_state_L)[2]
    mean = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype), contributions_L)
    self._land_L.lower(synced_L, synced_L, sync_state_L, mean).compile()
    self._take_back_L.lower(synced_L, synced_L, sync_state_L).compile()
    self._compiled = True

  def _time_a_round(self, state_L: Any, sync_state_R: PyTree) -> float:
    """What a round costs the trainers: the device time of its two programs (the hand-over and the landing), the
    median of `CALIBRATION_ROUNDS` after a warm-up, on copies of the params (nothing of this process's run changes;
    the sums meet no peer)."""
    synced_L = rounds.select(state_L.params, self._groups)
    sync_state_L = replicas.to_local(sync_state_R, self._meshes)
    seconds = []
    for _ in range(pacing.CALIBRATION_ROUNDS + 1):
      params_L = rounds.copy(synced_L)
      jax.block_until_ready(params_L)
      started = time.perf_counter()
      led_L, snapshot_L, contributions_L = self._hand_over_L(params_L, sync_state_L)
      jax.block_until_ready(self._land_L(led_L, snapshot_L, sync_state_L, host_meeting.host_sum(contributions_L)))
      seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[1:])

  def next_due(self, step: int) -> int | None:
    """The first step that may hand over a snapshot (after 'auto''s probe, which a round would stretch and whose
    choice of K it would skew); after it, none: a round waits at most a block for a boundary to hand over at, and one
    to land at (cut short for it, blocks cost the 2 cores a step each at the default config's 8 replicas)."""
    return self._first_snapshot_step if self._first_snapshot_step > step else None

  def between_steps(self) -> None:
    return None  # The thread's rounds are programs of their own.

  def before_block(self, b: hooks.Boundary) -> None:
    """Before the block from `b.step`: raise the thread's error, merge a finished round, hand over a wanted
    snapshot."""
    self._raise_if_failed()
    cpu_started, before = time.thread_time(), (self._gaps.rounds, self._in_flight)
    b.state = self._step_boundary(b.state, b.step)
    if (self._gaps.rounds, self._in_flight) != before:  # A round landed or was handed over here.
      self._boundary_cpu_s += time.thread_time() - cpu_started
      if self._gaps.rounds != before[0]:
        self._boundary_costs_s.append(self._boundary_cpu_s)
        self._boundary_cost_s, self._boundary_cpu_s = statistics.fmean(self._boundary_costs_s), 0.0

  def at_boundary(self, b: hooks.Boundary) -> None:
    """After dispatching a block of `b.steps` steps: raise the thread's error, time the steps for the pace.

    If the loop's own work at the last boundary (metric writes, saves, its recovery's bookkeeping: `b.work_s`) was
    longer than a mean step between rounds, the interval to this boundary is left out of the pace: it carries a save
    or a write (which waits for the device), not a round's cost, and a few such intervals among a round's would make
    the round look many times dearer. Bookkeeping of microseconds leaves the interval timed, and so does everything
    before a step time is known (so that one gets known)."""
    self._raise_if_failed()
    step_s = self._pacer.step_time_s()
    if step_s is not None and b.work_s > step_s:
      self._clock.skip()
    self._clock.boundary(time.perf_counter(), b.steps, b.waited, b.paused_s)
    if b.step >= self._first_snapshot_step:
      self._training.set()
    self._pacer.observe_host_cost(self._host_cost_s + self._boundary_cost_s)
    self._interval_s = self._pacer.interval_s()

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    """Ends the rounds and joins the thread; raises its error if it failed.

    Normally the round in flight when training ended lands (it started among the steps), and then this process's
    last params keep serving snapshots until every process of the job has finished its stream: those rounds' sums
    meet the peers' (whose training goes on), and land nowhere here, the model being the one trained (a BMUF round
    landed after the last step adds a momentum step that no training follows: as a foreground run, none); the sync
    state (EA's center, BMUF's global model) moves as the peers' does, so that every process ends with one, and the
    round met once every process is done moves nothing anywhere. `abandon`
    (the run is failing) drops the round in flight and returns within seconds, without raising the thread's
    error."""
    self._clock.skip()  # What comes before the next step (a save, the end) is no step time.
    if self._thread is None:
      return state_L
    if abandon:  # The thread may be waiting for a dead process: wait a little, not forever.
      self._stop.set()
      self._thread.join(timeout=_ABANDON_JOIN_S)
      state_L, _ = self.settled(state_L)  # The round in flight dropped whole: its lead too.
      self._handed_over = None
      return state_L
    self._done.set()
    while self._thread.is_alive():
      self._raise_if_failed()
      state_L = self._step_boundary(state_L, step=None)
      self._thread.join(timeout=_POLL_S)
    self._raise_if_failed()
    return self._step_boundary(state_L, step=None)  # A result the thread posted as it ended.

  def consensus_rule(self) -> consensus.Rule:
    return consensus.Rule(self._name, self._groups, self._tables)

  def consensus(self, params_L: PyTree) -> PyTree:
    return consensus.materialize(self.consensus_rule(), params_L, self._sync_state_R, self._meshes)

  def stats(self) -> dict[str, Any]:
    """The rounds and sync gaps (`rounds.GapTracker`), this process's pace (`pacing.GapPacer.stats`),
    sync_job_interval_s: the pace the processes agreed on at the last round (the longest of theirs), and
    mean_merge_lag_steps and mean_merge_lag_s: the steps trained, and the seconds, between a round's hand-over and
    its landing, how stale a round is when it lands (the local steps `w + (s' - s)` keeps; a block or more)."""
    lags, lags_s = self._merge_lags, self._merge_lags_s
    return {
      'mean_merge_lag_s': sum(lags_s) / len(lags_s) if lags_s else None,
      **self._gaps.stats(),
      **self._pacer.stats(),
      'sync_job_interval_s': self._job_interval_s,
      'mean_merge_lag_steps': sum(lags) / len(lags) if lags else None,
    }

  def sync_state(self) -> PyTree:
    """The sync state of the last merged round."""
    return self._sync_state_R

  def settled(self, state_L: Any) -> tuple[Any, PyTree]:
    """With a round in flight, the params without its lead (new buffers), and the last merged round's sync state:
    the round is not in the pair at all (its late part is not computed yet)."""
    if self._handed_over is None:
      return state_L, self._sync_state_R
    snapshot_L, sync_state_L = self._handed_over
    unled = self._take_back_L(rounds.select(state_L.params, self._groups), snapshot_L, sync_state_L)
    return state_L._replace(params=rounds.with_synced(state_L.params, unled)), self._sync_state_R

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
      job_mean, latency_s, all_done = self._results.get_nowait()
    except queue.Empty:
      pass
    else:
      if self._handed_over is None:  # A round served after the last step: its sums met the peers', it lands here not.
        if not all_done:  # A peer trains on and lands it: its sync state (EA's center, BMUF's) moves here too.
          led_L, snapshot_L, sync_state_L = self._served
          self._sync_state_R = replicas.to_job(self._land_L(led_L, snapshot_L, sync_state_L, job_mean)[1], self._meshes)
        self._served, self._in_flight = None, False
        return self._hand_over_if_wanted(state_L, step)
      snapshot_L, sync_state_L = self._handed_over
      synced_L, sync_state_L = self._land_L(
        rounds.select(state_L.params, self._groups), snapshot_L, sync_state_L, job_mean
      )
      state_L = state_L._replace(params=rounds.with_synced(state_L.params, synced_L))
      self._sync_state_R = replicas.to_job(sync_state_L, self._meshes)
      self._handed_over = None
      self._gaps.merged(step, latency_s)
      if step is not None and self._snapshot_step is not None:
        self._merge_lags.append(step - self._snapshot_step)
        self._merge_lags_s.append(time.perf_counter() - self._handed_over_at)
      self._in_flight = False
    return self._hand_over_if_wanted(state_L, step)

  def _hand_over_if_wanted(self, state_L: Any, step: int | None) -> Any:
    """Hands a snapshot over if the thread wants one and the round before has landed; after the last step (`step`
    None) its sums only, the params left as trained (`finish`)."""
    first_done = step is None or step >= self._first_snapshot_step
    if not (self._snapshot_wanted.is_set() and first_done and not self._in_flight):
      return state_L
    self._snapshot_wanted.clear()
    sync_state_L = replicas.to_local(self._sync_state_R, self._meshes)
    synced_L = rounds.select(state_L.params, self._groups)
    if step is None:  # Served, not landed: the sums of a copy.
      led_L, snapshot_L, contributions_L = self._hand_over_L(rounds.copy(synced_L), sync_state_L)
      self._served = (led_L, snapshot_L, sync_state_L)
      self._snapshots.put(contributions_L)
      self._in_flight = True
      return state_L
    led_L, snapshot_L, contributions_L = self._hand_over_L(synced_L, sync_state_L)
    state_L = state_L._replace(params=rounds.with_synced(state_L.params, led_L))  # The round's lead, landed.
    self._handed_over = (snapshot_L, sync_state_L)
    self._snapshots.put(contributions_L)
    self._snapshot_step, self._handed_over_at = step, time.perf_counter()
    self._in_flight = True
    return state_L

  def _run(self) -> None:
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
        contributions_L = self._next_snapshot()
        if contributions_L is None:
          return
        started, cpu_started = time.perf_counter(), time.thread_time()
        job_mean = host_meeting.job_mean(self._meet, contributions_L, self._num_replicas, self._stop.is_set)
        self._host_costs_s.append(time.thread_time() - cpu_started)  # Waits for the sums and the peers: no CPU.
        self._host_cost_s = statistics.fmean(self._host_costs_s)
        if job_mean is None or not self._put_result((job_mean, time.perf_counter() - started, all_done)) or all_done:
          return
        self._wait_for_the_next_round(round_start)
    except BaseException as error:  # pylint: disable=broad-except  (handed to the training thread as it is)
      self._error = error
      self._failed.set()
    finally:
      if self._links is not None:  # No round meets after this one: every peer has read this process's last.
        self._links.close()

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
