"""ShadowSync where the devices run one program at a time for the whole job: one process, or a job whose every
step is itself a collective (sharded tables). The rounds are fused into the training blocks, between two steps, at
the pace their cost allows; nothing waits for them.

  driver = ScheduledShadowSync(algorithm, 'ma', meshes, groups=('mlp',), min_interval_s='auto', max_overhead=0.05)
  driver.start(state_L, driver.initial_sync_state(state_L))   # times a round
  train_block = dispatch.make_train_block(config, meshes, between=driver.between_steps())
  for block in ...:
    carry = driver.block_carry(step, n)          # the sync state and where this block's rounds fall
    state_L, _, carry = train_block(state_L, block_L, steps_L, carry)
    driver.after_block(carry)
    driver.at_boundary(b)                        # b: `hooks.Boundary`; times the blocks: the pace in steps
  state_L = driver.finish(state_L)               # no round after the last step

Why here, and not in a thread (`shadow.ShadowSync`, which runs one where processes step apart): a device runs the
programs given to it one after the other. In one process a round joins the process's own devices only, and runs
between two blocks whoever dispatches it; no peer can keep it waiting, so a thread buys nothing there and costs
what a round of its own costs: a program per round, a copy for the thread to read, and a boundary to hand it over
and one to merge it, each of which the loop had to cut a block for (at the default config's 8 replicas a boundary
cost the 2 cores as much as a step, and the blocks of 16 steps spaced rounds too far for EA's NE). In a job whose
steps are collectives (sharded lookups) the processes' collectives pair up only if every process issues them in the
same order (docs/design.md §3): a thread's rounds between different steps on different processes would wait for each
other's partners forever.

A round (docs/design.md §3) fused into a block: after the step where it is due, on each device, the block takes the
synced params' snapshot, computes the round over the replicas (the algorithm's own collectives, `between_steps`)
and lands it at once: no step ran beside it on these devices, so there are no local steps to keep (the merge
`w <- w + (s' - s)` with `w = s`, a lag of 0 steps, `mean_merge_lag_steps`). The rounds fall at steps the host
plans (`block_carry`): every `gap` steps from the first, whatever the blocks' lengths, so a fixed gap gives the same
rounds, and the same bits, at every K. A block runs its steps in stretches from one round to the next
(`between_steps`: where the next round falls, and the round), so that the steps between rounds run as they do
without any (behind a test after every step, XLA copied the train state through the untaken branch at every step:
`shadow_ea`'s blocks took 3-5% longer with no round in them).

Pace: a round costs the trainers its device time, which `start` times (a round as a program of its own, which costs
more than one inside a block: an upper bound) and `pacing.GapPacer` turns into a gap in steps for the budget
(`max_overhead` of the steps' time, measured over the blocks), or `min_interval_s` seconds set by hand over the step
time. Across processes (sharded) the gap is the job's, the largest of the processes' (a round carries each process's
gap and agrees on the largest; the host plans with the agreement of a block already done, the same everywhere;
until the first agreement, `FIRST_JOB_GAP`). No round follows the last step: the model is the one trained.
"""

import statistics
import time
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from shadowsync_jax import hooks
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import pacing
from shadowsync_jax.sync import restarts
from shadowsync_jax.sync import rounds

PyTree = Any
_NEVER = 2**30  # A block's first round beyond any block: none in it.
FIRST_JOB_GAP = 16  # Steps between a job's rounds until its processes agreed on a gap (at its first round).


class Carry(NamedTuple):
  """What a block with fused rounds takes and returns, per device: the sync state; steps from the block's start to
  its first round (a round after the step that brings the block to it) and from one round to the next; this
  process's gap, and (out) the job's, the largest any process proposed at the block's last round."""

  sync_state: PyTree
  first: jax.Array
  gap: jax.Array
  proposed_gap: jax.Array
  agreed_gap: jax.Array


def _varying_like(new: PyTree, old: PyTree) -> PyTree:
  """`new` typed per device as `old` is (a replica mean is the same on every device, which `shard_map` types apart
  from a per-device value; a while loop's carry keeps its type)."""

  def like(n, o):
    missing = tuple(set(jax.typeof(o).manual_axis_type.varying) - set(jax.typeof(n).manual_axis_type.varying))
    return lax.pcast(n, missing, to='varying') if missing else n

  return jax.tree.map(like, new, old)


class ScheduledShadowSync(hooks.Hook):
  """`shadow_*` where one program runs at a time for the whole job: rounds fused into the blocks (module
  docstring)."""

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
    pacer: pacing.GapPacer | None = None,
  ):
    """`first_round_after`: steps from the start to the first round (after the compiling step; after 'auto''s
    probe, whose timed blocks a round's work would stretch: `block_plan.steps_until_chosen`); `pacer`: in place of
    the one `min_interval_s` and `max_overhead` make (a test's fixed gap)."""
    self._algorithm, self._name, self._meshes, self._groups, self._tables = algorithm, name, meshes, groups, tables
    # What a restart builds its fresh driver from (`fresh`).
    self._settings = (algorithm, name, meshes, groups, min_interval_s, max_overhead, tables)
    self._first_round_after = first_round_after
    fixed_interval_s = None if min_interval_s == 'auto' else float(min_interval_s)
    self._pacer = pacer or pacing.GapPacer(max_overhead, fixed_interval_s)
    self._init_R, self._sync_R = algorithms.stacked(algorithm, meshes.job, donate=True)
    self._several = meshes.job is not meshes.local
    self._num_local = meshes.local.shape[replicas.REPLICA_AXIS]
    self._sync_state_R = None  # The newest block's (maybe not computed yet): what matches the params.
    self._next_round_step: int | None = None
    self._gap = 1  # Steps between the rounds the host plans: this process's pace, or the job's agreed one.
    self._agreed_L: jax.Array | None = None  # The gap the last block's rounds agreed on (0: none), not read yet.
    self._clock = pacing.BlockClock(self._pacer)
    self._gaps = rounds.GapTracker()
    self._placed: dict[tuple[int, ...], jax.Array] = {}

  def fresh(self) -> 'ScheduledShadowSync':
    """A new driver of this one's settings, not started: a restart's, its first round a step after it."""
    return ScheduledShadowSync(*self._settings)

  def restarted(self, state_L: Any, sync_state_R: PyTree) -> restarts.RestartedSync:
    """This driver ended at once and a fresh one started from (`state_L`, `sync_state_R`) (full recovery)."""
    return restarts.restart(self, state_L, sync_state_R)

  def initial_sync_state(self, state_L: Any) -> PyTree:
    return self._init_R(replicas.to_job(rounds.select(state_L.params, self._groups), self._meshes))

  def start(self, state_L: Any, sync_state_R: PyTree, first_round_after: int | None = None) -> None:
    """Times a round (`CALIBRATION_ROUNDS`, on a copy of the params: not among the timed steps); the first round
    goes `first_round_after` steps from here (the constructor's, unless given: `studies.shadow_overhead` starts each
    timed window at a random phase of the gap)."""
    if first_round_after is not None:
      self._first_round_after = first_round_after
    synced_L = rounds.select(state_L.params, self._groups)
    self._pacer.observe_round_cost(self._time_a_round(synced_L, sync_state_R))
    self._sync_state_R = sync_state_R
    first = int(state_L.step[0])
    self._gaps.reset(first)
    self._next_round_step, self._agreed_L = first + self._first_round_after, None
    self._first_timed_step = self._next_round_step
    # Across processes, until a round agreed on one, a gap every process plans with alike.
    self._gap = FIRST_JOB_GAP if self._several else self._pacer.gap_steps()
    self._clock.reset()

  def _time_a_round(self, synced_L: PyTree, sync_state_R: PyTree) -> float:
    """The device time of a round as a program of its own, the median of `CALIBRATION_ROUNDS` after a warm-up (the
    first compiles it), each on a fresh copy of the params and the state (the round donates them). Every process of
    the job times the same rounds (they are collectives)."""
    seconds = []
    for _ in range(pacing.CALIBRATION_ROUNDS + 1):
      params_R, state_R = rounds.copy((replicas.to_job(synced_L, self._meshes), sync_state_R))
      jax.block_until_ready((params_R, state_R))
      started = time.perf_counter()
      jax.block_until_ready(self._sync_R(params_R, state_R))
      seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[1:])

  def sync_state(self) -> PyTree:
    return self._sync_state_R

  def settled(self, state_L: Any) -> tuple[Any, PyTree]:
    return state_L, self._sync_state_R  # A round lands whole inside its block.

  def next_due(self, step: int) -> None:
    return None  # Rounds fall inside blocks: no boundary is needed.

  def between_steps(self) -> replicas.Between:
    """The rounds, per device, between a block's steps (module docstring): after the step that brings the block's
    steps done to `carry.first`, and every `carry.gap` steps after it."""
    algorithm, groups = self._algorithm, self._groups
    several = self._several

    def next_at(carry: Carry, done):
      after_first = carry.first + ((done - carry.first) // carry.gap + 1) * carry.gap
      return jnp.where(done < carry.first, carry.first, after_first)

    def round_(state, carry: Carry):
      synced_before = rounds.select(state.params, groups)
      synced, sync_state = algorithm.sync(synced_before, carry.sync_state)
      agreed = lax.pmax(carry.proposed_gap, replicas.REPLICA_AXIS) if several else carry.proposed_gap
      new_carry = carry._replace(sync_state=sync_state, agreed_gap=agreed)
      synced, new_carry = _varying_like((synced, new_carry), (synced_before, carry))
      return state._replace(params=rounds.with_synced(state.params, synced)), new_carry

    return replicas.Between(next_at, round_)

  def block_carry(self, step: int | None, steps: int) -> Carry:
    """The carry of the block of `steps` steps from `step` (None: a block of no step, which compiles), with this
    process's copies of the sync state; plans (and counts) the rounds that fall in it."""
    first = _NEVER
    if step is not None and self._next_round_step <= step + steps:
      first = self._next_round_step - step
      at = self._next_round_step
      while at <= step + steps:
        self._gaps.merged(at, 0.0)
        at += self._gap
      self._next_round_step = at
    return Carry(
      sync_state=replicas.to_local(self._sync_state_R, self._meshes),
      first=self._on_devices(first),
      gap=self._on_devices(self._gap),
      proposed_gap=self._on_devices(self._pacer.gap_steps()),
      agreed_gap=self._on_devices(0),
    )

  def after_block(self, carry: Carry) -> None:
    """The block's outputs: the sync state after its rounds; the gap of the rounds to plan next: this process's
    pace, or across processes the one they agreed on, read a block on (done by then, the same on every
    process)."""
    self._sync_state_R = replicas.to_job(carry.sync_state, self._meshes)
    if not self._several:
      self._gap = self._pacer.gap_steps()
      return
    if self._agreed_L is not None:
      self._gap = int(np.max(jax.device_get(self._agreed_L))) or self._gap  # 0: no round in that block agreed.
    self._agreed_L = carry.agreed_gap

  def at_boundary(self, b: hooks.Boundary) -> None:
    """Times the blocks from the first round's step on ('auto''s probe blocks, a step or eight each, would count
    their dispatches as steps); an interval that carried the loop's own work (a save, a write: `b.work_s`) longer
    than a step is left out of the step time. (The rounds are in the blocks: nothing before one.)"""
    step_s = self._pacer.step_time_s()
    if step_s is not None and b.work_s > step_s:
      self._clock.skip()
    if b.step <= self._first_timed_step:
      self._clock.reset()
    else:
      self._clock.boundary(time.perf_counter(), b.steps, b.waited, b.paused_s)

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    """Nothing more: every round planned among the steps has landed in its block, and no round follows the last
    step (the model is the one trained, as a foreground run's; a BMUF round there adds a momentum step that no
    training follows: +0.66% NE on one seed of the sync study, against -0.41% for `fr_bmuf` at the same gap)."""
    del abandon
    self._clock.skip()
    return state_L

  def consensus_rule(self) -> consensus.Rule:
    return consensus.Rule(self._name, self._groups, self._tables)

  def consensus(self, params_L: PyTree) -> PyTree:
    return consensus.materialize(self.consensus_rule(), params_L, self._sync_state_R, self._meshes)

  def stats(self) -> dict[str, Any]:
    """The rounds and sync gaps, the pace (`pacing.GapPacer.stats`), sync_gap_steps: the gap the rounds follow (the
    job's), and mean_merge_lag_steps: 0, a round lands at the step it was taken."""
    return {
      **self._gaps.stats(),
      **self._pacer.stats(),
      'sync_gap_steps': self._gap if self._several else self._pacer.gap_steps(),
      'mean_merge_lag_steps': 0.0 if self._gaps.gaps else None,
      'mean_merge_lag_s': 0.0 if self._gaps.gaps else None,
    }

  def _on_devices(self, value: int) -> jax.Array:
    """`value` on each of this process's devices ([L] int32), placed once per value."""
    key = (value,)
    if key not in self._placed:
      if len(self._placed) > 64:
        self._placed.clear()
      self._placed[key] = replicas.shard(np.full((self._num_local,), value, np.int32), self._meshes.local)
    return self._placed[key]
