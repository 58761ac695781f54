"""ShadowSync (Zheng et al. 2020, arXiv:2003.03477) across processes: sync rounds in a background thread, off the
training path, the replicas of the job meeting on the host.

  driver = ShadowSync(algorithm, 'ma', meshes, groups=('mlp',), min_interval_s='auto', max_overhead=0.05)
  driver.start(state_L, driver.initial_sync_state(state_L))   # times a round, starts the thread
  train_block = dispatch.make_train_block(config, meshes, between=driver.between_steps())
  for block in ...:                              # b: the loop's `hooks.Boundary`
    driver.before_block(b)                       # raises the thread's error
    carry = driver.block_carry(step, n)          # a round to land, a snapshot to hand over, in this block
    state_L, _, carry = train_block(state_L, block_L, steps_L, carry)   # no cross-replica collective in there
    driver.after_block(carry)                    # the contributions handed over go to the thread
    driver.at_boundary(b)                        # times the blocks (less b.work_s's long ones); raises its error
  state_L = driver.finish(state_L)               # last rounds with every process, then joins the thread

Where the job's processes step apart (`drivers.make`; one process, and jobs whose steps are collectives, fuse
whole rounds into the blocks: `scheduled`). A round (docs/design.md §3, `algorithms.met_round`) has two phases,
both fused into the training blocks (`between_steps`, the blocks' `Carry`): the thread asks for a snapshot; the
next block the loop dispatches hands it over after its last step: it lands the round's lead on the params (each
replica's own part of the round: EA's pull, BMUF's momentum step), keeps a copy `s` of the params as they were, and
leaves each replica's contribution (what the algorithm averages) in its carry. The thread reads them once that
block is done, sums this process's on the host (no collective even among its own devices: one waits for the
slowest device's block), meets every process's sum (`parallel.peer_links`: a direct connection to each other
process; no collective, so no device waits for a peer), and places the job's mean on this process's devices; the
block after next lands the rest of the round before its first step, `s' - s - lead`, keeping the local steps made
meanwhile: a round lands a block after its snapshot (its carry, built as the block in between starts to train, may
wait up to half a block for the thread: `block_carry`; without that wait the thread's meeting missed the boundary
it needed by a few ms, and rounds came every third block instead of every second). A block hands a snapshot over
only once the round before has landed (in it, or earlier), so a snapshot holds every earlier round. The training
thread dispatches no program for a round: it passes the carry on (the phases as programs of their own, dispatched
at the boundaries, held it at each until the block in flight was done). An exception in the thread is re-raised at
the first boundary after it happened.

Pace: a round starts no sooner than `min_interval_s` after the last one started. With 'auto' the interval is the
round's cost over the budget, `max_overhead` of the trainers' throughput (`pacing.GapPacer`): its device time (its
two phases as programs of their own, timed by `start` on copies: more than inside a block, an upper bound) and its
host work (the thread's, and the training thread's for the carries of the round's blocks: CPU seconds, measured
round by round). `stats()` reports the pace and what it came from, and how late rounds land
(`mean_merge_lag_steps`, `mean_round_latency_s`).

Several processes: each runs one such thread (`round_thread`: the rounds' agreement, their meeting and their
pace across the processes). A process whose stream is done keeps serving snapshots from `finish` until every process
is done. Checkpoints need no pause: every process saves its own part, with no collective
(`recovery.checkpointing`), a round in flight left out of it whole (`settled`).
"""

import collections
from collections.abc import Callable
import statistics
import time
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from shadowsync_jax import hooks
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import host_meeting
from shadowsync_jax.sync import pacing
from shadowsync_jax.sync import restarts
from shadowsync_jax.sync import round_thread
from shadowsync_jax.sync import rounds

PyTree = Any
_NEVER = 2**30  # A count of steps past any block: nothing lands, or is handed over, in it.
# The share of a block a block's carry may wait for the result of a round handed over two blocks before: the devices
# train the block dispatched before it meanwhile (one is in flight), so a wait shorter than that block costs nothing.
_RESULT_WAIT = 0.5
_HOST_COST_ROUNDS = 8  # The rounds whose training-thread work's mean is that cost of a round (`pacing.GapPacer`).
_ABANDON_JOIN_S = 5.0  # How long a failing run waits for the thread to notice.


class Carry(NamedTuple):
  """What a block takes (donated) and returns, per device, for the rounds fused into it (`between_steps`): the
  sync state the round in flight started from (that of the last landed round: one round is in flight at most);
  the snapshot of the round in flight; the exchange: in, the job's mean to land; out, after a hand-over, this
  process's replicas' contributions, for the thread to read; and after which of its steps the block lands a round
  (`land_at`) and hands one over (`hand_over_at`), `_NEVER`: not in this block."""

  sync_state: PyTree
  snapshot: PyTree
  exchange: PyTree
  land_at: jax.Array
  hand_over_at: jax.Array


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
    self._clock = pacing.BlockClock(self._pacer)
    self._in_flight = False  # A snapshot was handed over and its round not merged yet.
    self._snapshot_step: int | None = None  # The boundary that handed it over (None: after the last step).
    self._merge_lags: list[int] = []  # Steps trained between a round's snapshot and its merge,
    self._merge_lags_s: list[float] = []  # and seconds.
    self._handed_over_at = 0.0
    self._init_R, _ = algorithms.stacked(algorithm, meshes.job)
    self._round = algorithms.met_round(algorithm)  # Fused into the blocks (`between_steps`).
    # The same as programs of their own: timed by `start`, and where no block runs (`finish`, `settled`).
    self._hand_over_L, self._land_L, self._take_back_L = algorithms.met_rounds(algorithm, meshes.local)
    self._num_local = meshes.local.shape[replicas.REPLICA_AXIS]
    # This process's carry for the next block (`Carry`'s arrays: the last block's, or fresh), and whether that block
    # hands a snapshot over / lands a round.
    self._carry_L: tuple[PyTree, PyTree, PyTree] | None = None
    self._landing: tuple[int, float] | None = None  # The landing block's first step, and its round's latency.
    self._handing_over = False
    self._blocks = 0  # Blocks of steps dispatched since `start`,
    self._handed_over_in = 0  # and the one that handed the round in flight over.
    self._zeros_L: Callable[[], PyTree] | None = None  # A fresh exchange, once the thread has the last one.
    self._never_flags_L = None  # The last block's flags (both `_NEVER`), for a next block with no round work.
    # (snapshot, the sync state it started from) of a round handed over, not landed yet: its lead has landed.
    self._handed_over: tuple[PyTree, PyTree] | None = None
    # (led copy, snapshot, sync state) of a round served after the last step (`finish`), not met yet.
    self._served: tuple[PyTree, PyTree, PyTree] | None = None
    self._rounds = round_thread.RoundThread(meshes)
    self._rounds.interval_s = self._pacer.interval_s()
    # That of the last merged round, this process's part (the job's arrays made from it when asked: `sync_state`).
    self._sync_state_L = None
    self._compiled = False
    self._gaps = rounds.GapTracker()
    # The thread's host work a round (`RoundThread.host_cost_s`) is one cost of the round beside its programs' device
    # time (`pacing`); the training thread's is another: its CPU seconds at the boundaries of each of its last rounds
    # (the hand-over's and the landing's carries, the sync state's arrays), and their mean.
    self._boundary_costs_s: collections.deque[float] = collections.deque(maxlen=_HOST_COST_ROUNDS)
    self._boundary_cost_s = 0.0
    self._boundary_cpu_s = 0.0  # Since the last landing.

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
    self._compile_rounds(state_L, sync_state_R)
    self._pacer.observe_round_cost(self._time_a_round(state_L, sync_state_R))
    self._sync_state_L = replicas.to_local(sync_state_R, self._meshes)
    # The blocks' own copies (they take them: the caller's, a restored state's, stay as they are).
    self._carry_L = (rounds.copy(self._sync_state_L), self._zeros_L(), self._zeros_L())
    self._never_flags_L = None
    self._landing, self._handing_over, self._blocks, self._handed_over_in = None, False, 0, 0
    self._gaps.reset(int(state_L.step[0]))
    self._first_snapshot_step = int(state_L.step[0]) + self._first_round_after
    self._clock.reset()
    self._in_flight, self._snapshot_step, self._served = False, None, None
    self._rounds.start(first_round_after_s)

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
    shapes = jax.eval_shape(lambda tree: tree, synced_L)
    on_devices = NamedSharding(self._meshes.local, P(replicas.REPLICA_AXIS))
    zeros = lambda: jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes)
    self._zeros_L = jax.jit(zeros, out_shardings=jax.tree.map(lambda _: on_devices, shapes))
    self._zeros_L.lower().compile()
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

  def between_steps(self) -> replicas.Between:
    """The round's two phases in a block, per device (`Carry`): a landing before its first step, a hand-over after
    its last. The carry donated: it holds the sync state and two trees of the synced params' size, passed on from
    block to block."""
    round_, groups = self._round, self._groups

    def next_at(carry: Carry, done):
      del done
      return jnp.minimum(carry.land_at, carry.hand_over_at)

    def land(state, carry: Carry):
      synced, sync_state = round_.land(
        rounds.select(state.params, groups), carry.snapshot, carry.sync_state, carry.exchange
      )
      landed = carry._replace(sync_state=sync_state, land_at=jnp.full_like(carry.land_at, _NEVER))
      return state._replace(params=rounds.with_synced(state.params, synced)), landed

    def hand_over(state, carry: Carry):
      led, snapshot, contributions = round_.hand_over(rounds.select(state.params, groups), carry.sync_state)
      state = state._replace(params=rounds.with_synced(state.params, led))  # The round's lead, landed.
      handed = carry._replace(
        snapshot=snapshot, exchange=contributions, hand_over_at=jnp.full_like(carry.hand_over_at, _NEVER)
      )
      return state, handed

    def phase(state, carry: Carry):
      return lax.cond(carry.land_at <= carry.hand_over_at, land, hand_over, state, carry)

    return replicas.Between(next_at, phase, donate_carry=True)

  def block_carry(self, step: int | None, steps: int) -> Carry:
    """The carry of the block of `steps` steps from `step` (None: a block of no step, which compiles): a finished
    round lands before its first step, and a wanted snapshot is handed over after its last. The round's
    contributions are read by the thread once that block is done, which the loop sees as it dispatches the block
    after it; this block's carry, built right then, waits for the round's result up to `_RESULT_WAIT` of a block
    (the devices train the block in flight meanwhile), so that it lands two blocks after its snapshot, not
    three, and, within the same time, for the thread to ask for the next round's snapshot (once the processes agreed
    on it, if the pace allows it by then), so that this block hands it over: a round every second block, not every
    third."""
    land_at = hand_over_at = _NEVER
    if step is not None:
      deadline = time.perf_counter() + self._result_wait_s(steps)
      result = self._rounds.result(deadline - time.perf_counter())
      if result is not None:  # The thread goes on to the next round's agreement: its snapshot may go in this block.
        self._rounds.snapshot_wanted.wait(max(0.0, deadline - time.perf_counter()))
      cpu_started = time.thread_time()
      if result is not None:  # Training: every result is of a round handed over among the steps (`finish` serves).
        _, mean_L, latency_s, _ = result
        self._carry_L = (*self._carry_L[:2], mean_L)
        land_at, self._landing = 0, (step, latency_s, self._snapshot_step, self._handed_over_at)
      first_done = step >= self._first_snapshot_step
      if self._rounds.snapshot_wanted.is_set() and first_done and (not self._in_flight or self._landing is not None):
        self._rounds.snapshot_wanted.clear()
        hand_over_at, self._handing_over = steps, True
        self._snapshot_step, self._handed_over_at = step + steps, time.perf_counter()
        self._handed_over_in = self._blocks
      if self._landing is not None or self._handing_over:
        self._boundary_cpu_s += time.thread_time() - cpu_started
      self._blocks += 1
    if land_at == hand_over_at == _NEVER and self._never_flags_L is not None:
      flags_L, self._never_flags_L = self._never_flags_L, None  # The last block's, no copy to the devices.
    else:
      flags = (np.full(self._num_local, land_at, np.int32), np.full(self._num_local, hand_over_at, np.int32))
      flags_L = replicas.shard(flags, self._meshes.local)
    return Carry(*self._carry_L, *flags_L)

  def _result_wait_s(self, steps: int) -> float:
    """How long this block's carry may wait for the round in flight: none if its hand-over's block may still be
    running (the block just before this one), or no step time is known yet."""
    step_s = self._pacer.step_time_s()
    if not self._in_flight or self._blocks < self._handed_over_in + 2 or step_s is None:
      return 0.0
    return _RESULT_WAIT * step_s * steps

  def after_block(self, carry: Carry) -> None:
    """The block's carry, dispatched: what the next block goes on with; a snapshot handed over goes to the
    thread."""
    cpu_started, round_work = time.thread_time(), self._landing is not None or self._handing_over
    self._carry_L = (carry.sync_state, carry.snapshot, carry.exchange)
    self._sync_state_L = carry.sync_state
    self._never_flags_L = (carry.land_at, carry.hand_over_at)  # Every phase in the block set its flag to _NEVER.
    landed = self._landing is not None
    if landed:
      merged_at, latency_s, snapshot_step, handed_over_at = self._landing
      self._gaps.merged(merged_at, latency_s)
      self._merge_lags.append(merged_at - snapshot_step)
      self._merge_lags_s.append(time.perf_counter() - handed_over_at)
      self._handed_over, self._in_flight, self._landing = None, False, None
    if self._handing_over:
      self._rounds.hand_over(carry.exchange)
      self._carry_L = (carry.sync_state, carry.snapshot, self._zeros_L())  # The thread reads the block's.
      self._in_flight, self._handing_over = True, False
    if self._in_flight:  # The newest copies of the round's snapshot and start (those before went to this block).
      self._handed_over = (carry.snapshot, carry.sync_state)
    if round_work:
      self._boundary_cpu_s += time.thread_time() - cpu_started
    if landed:  # The training thread's work for the round: its hand-over's block and its landing's.
      self._boundary_costs_s.append(self._boundary_cpu_s)
      self._boundary_cost_s, self._boundary_cpu_s = statistics.fmean(self._boundary_costs_s), 0.0

  def before_block(self, b: hooks.Boundary) -> None:
    """Before the block from `b.step`: raise the thread's error (the block's carry lands and hands over)."""
    self._rounds.raise_if_failed()

  def at_boundary(self, b: hooks.Boundary) -> None:
    """After dispatching a block of `b.steps` steps: raise the thread's error, time the steps for the pace.

    If the loop's own work at the last boundary (metric writes, saves, its recovery's bookkeeping: `b.work_s`) was
    longer than a mean step between rounds, the interval to this boundary is left out of the pace: it carries a save
    or a write (which waits for the device), not a round's cost, and a few such intervals among a round's would make
    the round look many times dearer. Bookkeeping of microseconds leaves the interval timed, and so does everything
    before a step time is known (so that one gets known)."""
    self._rounds.raise_if_failed()
    step_s = self._pacer.step_time_s()
    if step_s is not None and b.work_s > step_s:
      self._clock.skip()
    self._clock.boundary(time.perf_counter(), b.steps, b.waited, b.paused_s)
    if b.step >= self._first_snapshot_step:
      self._rounds.training()
    self._pacer.observe_host_cost(self._rounds.host_cost_s + self._boundary_cost_s)
    self._rounds.interval_s = self._pacer.interval_s()

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
    if not self._rounds.started:
      return state_L
    if abandon:  # The thread may be waiting for a dead process: wait a little, not forever.
      self._rounds.abandon(_ABANDON_JOIN_S)
      state_L, _ = self.settled(state_L)  # The round in flight dropped whole: its lead too.
      self._handed_over = None
      return state_L
    self._rounds.finish_training()
    while self._rounds.alive():
      self._rounds.raise_if_failed()
      state_L = self._after_training(state_L)
      self._rounds.join(round_thread.POLL_S)
    self._rounds.raise_if_failed()
    return self._after_training(state_L)  # A result the thread posted as it ended.

  def consensus_rule(self) -> consensus.Rule:
    return consensus.Rule(self._name, self._groups, self._tables)

  def consensus(self, params_L: PyTree) -> PyTree:
    return consensus.materialize(self.consensus_rule(), params_L, self.sync_state(), self._meshes)

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
      'sync_job_interval_s': self._rounds.job_interval_s,
      'mean_merge_lag_steps': sum(lags) / len(lags) if lags else None,
    }

  def sync_state(self) -> PyTree:
    """The sync state of the last merged round (the job's arrays, this process's part of them)."""
    return None if self._sync_state_L is None else replicas.to_job(self._sync_state_L, self._meshes)

  def settled(self, state_L: Any) -> tuple[Any, PyTree]:
    """With a round in flight, the params without its lead (new buffers), and the last merged round's sync state:
    the round is not in the pair at all (its late part is not computed yet)."""
    if self._handed_over is None:
      return state_L, self.sync_state()
    snapshot_L, sync_state_L = self._handed_over
    unled = self._take_back_L(rounds.select(state_L.params, self._groups), snapshot_L, sync_state_L)
    return state_L._replace(params=rounds.with_synced(state_L.params, unled)), self.sync_state()

  def wait_for_rounds(self, rounds: int, step_boundary, timeout_s: float = 60.0) -> None:
    """Test helper: calls `step_boundary()` until `rounds` rounds were merged (or raises TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    while self._gaps.rounds < rounds:
      if time.monotonic() > deadline:
        raise TimeoutError(f'only {self._gaps.rounds} of {rounds} shadow rounds in {timeout_s} s.')
      step_boundary()

  def _after_training(self, state_L: Any) -> Any:
    """`finish`'s boundary, no block after it: lands the round handed over among the steps once its result comes
    (a round, no sync gap), then serves a wanted snapshot: the sums of the params as trained, landed nowhere
    here."""
    result = self._rounds.result(0.0)
    if result is not None:
      job_mean, _, latency_s, all_done = result
      if self._handed_over is None:  # A round served after the last step: its sums met the peers', it lands here not.
        if not all_done:  # A peer trains on and lands it: its sync state (EA's center, BMUF's) moves here too.
          led_L, snapshot_L, sync_state_L = self._served
          self._sync_state_L = self._land_L(led_L, snapshot_L, sync_state_L, job_mean)[1]
        self._served = None
      else:
        snapshot_L, sync_state_L = self._handed_over
        synced_L, sync_state_L = self._land_L(
          rounds.select(state_L.params, self._groups), snapshot_L, sync_state_L, job_mean
        )
        state_L = state_L._replace(params=rounds.with_synced(state_L.params, synced_L))
        self._sync_state_L = sync_state_L
        self._handed_over = None
        self._gaps.merged(None, latency_s)
      self._in_flight = False
    if self._rounds.snapshot_wanted.is_set() and not self._in_flight:
      self._rounds.snapshot_wanted.clear()
      sync_state_L = self._sync_state_L
      synced_L = rounds.copy(rounds.select(state_L.params, self._groups))
      led_L, snapshot_L, contributions_L = self._hand_over_L(synced_L, sync_state_L)
      self._served = (led_L, snapshot_L, sync_state_L)
      self._rounds.hand_over(contributions_L)
      self._in_flight = True
    return state_L
