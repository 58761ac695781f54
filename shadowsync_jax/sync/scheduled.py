"""ShadowSync when every training step is itself a collective of the job (sharded tables): the training thread
dispatches each round, at a step every process agreed on, and never waits for it.

  driver = ScheduledShadowSync(algorithm, 'ma', meshes, groups=('mlp',), min_interval_s='auto', max_overhead=0.05)
  driver.start(state_L, driver.initial_sync_state(state_L))
  for block in ...:
    state_L, _ = train_block(state_L, block_L)   # sharded lookups: collectives across processes
    state_L = driver.at_boundary(step, state_L, n)   # merges a round that is done; at the agreed step, dispatches one
    driver.next_due(step)                        # the agreed step of the next round: the loop ends a block there
  state_L = driver.finish(state_L)               # merges the round in flight

Why not a thread (`shadow.ShadowSync`): a device runs the programs given to it in the order they were given, so
the processes' collectives pair up only if every process dispatches them in the same order (docs/design.md §3). A thread
dispatching rounds beside a training loop dispatching collective steps would slip its rounds between different
steps on different processes, and the two programs would wait for each other's partners forever. Here the one
thread that dispatches steps also dispatches the rounds, after the same step on every process:

- round n is dispatched after step s_n: a copy `s` of the synced params (the snapshot), and one program that
  computes the synced `s'` and agrees on the next gap, the largest of every process's pace in steps (its
  `pacing.Pacer` interval over its step time). The training thread goes on at once: the devices run the round
  between steps s_n and s_n + 1, and the host dispatches the next steps meanwhile.
- at every step boundary the loop merges a round whose results are ready, `w <- w + (s' - s)`, keeping the local
  steps made since the snapshot;
- round n + 1 goes after step s_{n+1} = s_n + g_{n-1}, the gap the round before agreed (known on every process by
  then: round n - 1 was merged at s_n at the latest, waiting for it if it was not done, which then costs the
  trainers that wait); the next round's sync state is round n's output, passed on without a wait.
The devices run a round between two blocks, in the order dispatched, so the block after its dispatch and the block
after its merge carry its cost and are timed as in the round (`pacing.BlockClock`); the loop ends a block one and
two steps after every dispatch (`next_due`, the same steps on every process), so that a round's cost lands in short
blocks and the rest of the gap is timed as between rounds. The pace comes from the same budget as the thread's
(`sync.max_overhead`). The job's steps are lock-step already (every lookup is a collective), so every
process reaches the same steps, and after the last step no round is dispatched: `finish` merges the one in flight.
"""

import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import pacing
from shadowsync_jax.sync import rounds

PyTree = Any
_SHORT_BLOCKS = 2  # Blocks of one step after each dispatch: a round's cost, and its merge's, lands in them.


class _InFlight:
  """A dispatched round: its snapshot, its (not yet ready) results, and when it went."""

  def __init__(self, snapshot_L, synced_R, sync_state_R, agreed_gap, step: int):
    self.snapshot_L, self.synced_R, self.sync_state_R, self.agreed_gap = snapshot_L, synced_R, sync_state_R, agreed_gap
    self.step, self.dispatched_s = step, time.perf_counter()

  def ready(self) -> bool:
    return all(leaf.is_ready() for leaf in jax.tree.leaves((self.synced_R, self.agreed_gap)))


class ScheduledShadowSync:
  """`shadow_*` for jobs whose steps are collectives: rounds dispatched by the training thread (module docstring)."""

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
    """`first_round_after`: steps from the start to the first round (after the compiling step; after 'auto''s
    probe, whose timed blocks a round's work would stretch: `block_plan.steps_until_chosen`)."""
    self._name, self._meshes, self._groups, self._tables = name, meshes, groups, tables
    self._first_round_after = first_round_after
    self._pacer = pacing.Pacer(max_overhead, None if min_interval_s == 'auto' else float(min_interval_s))
    self._init_R, self._sync_R = algorithms.stacked(algorithm, meshes.job)
    self._round_R = _round_program(self._sync_R, meshes.job)
    self._num_local = meshes.local.shape[replicas.REPLICA_AXIS]
    self._sync_state_R = None  # The newest round's output (maybe not computed yet): the next round's input.
    self._merged_sync_state_R = None  # That of the last merged round: what matches the params (safe to save).
    self._in_flight: _InFlight | None = None
    self._next_round_step: int | None = None
    self._agreed_gap: int | None = None
    self._clock = pacing.BlockClock(self._pacer, tail_blocks=1)
    self._dispatched_at: int | None = None  # The step after which the last round was dispatched.
    self._gaps = rounds.GapTracker()

  def initial_sync_state(self, state_L: Any) -> PyTree:
    return self._init_R(replicas.to_job(rounds.select(state_L.params, self._groups), self._meshes))

  def start(self, state_L: Any, sync_state_R: PyTree) -> None:
    """Compiles the copy, the round and the merge (not among the timed steps); the first round goes
    `first_round_after` steps from here."""
    synced_L = rounds.select(state_L.params, self._groups)
    rounds.copy.lower(synced_L).compile()
    self._round_R.lower(replicas.to_job(synced_L, self._meshes), sync_state_R, self._gap_array(1)).compile()
    rounds.merge.lower(synced_L, synced_L, synced_L).compile()
    self._sync_state_R = self._merged_sync_state_R = sync_state_R
    first = int(state_L.step[0])
    self._gaps.reset(first)
    self._next_round_step, self._in_flight, self._dispatched_at = first + self._first_round_after, None, None
    self._clock.reset()

  def sync_state(self) -> PyTree:
    return self._merged_sync_state_R

  def next_due(self, step: int) -> int | None:
    """The next round's step; before it, the boundaries one and two steps after the last dispatch (module
    docstring). Every process computes the same steps."""
    after = [] if self._dispatched_at is None else [self._dispatched_at + n for n in range(1, _SHORT_BLOCKS + 1)]
    due = [at for at in (*after, self._next_round_step) if at > step]
    return min(due) if due else None

  def at_boundary(self, step: int, state_L: Any, steps: int, waited: bool = False, paused_s: float = 0.0) -> Any:
    # Only the blocks after a touch carry a round.
    self._clock.boundary(time.perf_counter(), steps, False, waited, paused_s)
    due = step >= self._next_round_step
    if self._in_flight is not None and (due or self._in_flight.ready()):
      state_L = self._merge(state_L, step)  # When the next round is due, it waits for this one: its gap is needed.
    if due:
      state_L = self._dispatch(state_L, step)
    return state_L

  def loop_work(self, seconds: float) -> None:
    """As `shadow.ShadowSync.loop_work`: an interval that carries a save or a write is left out of the pace."""
    step_s = self._pacer.step_time_s()
    if step_s is not None and seconds > step_s:
      self._clock.skip()

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    """Merges the round in flight (none is dispatched after the last step); `abandon` drops it."""
    self._clock.skip()
    if self._in_flight is not None and not abandon:
      state_L = self._merge(state_L, step=None)
    self._in_flight = None
    return state_L

  def consensus_rule(self) -> consensus.Rule:
    return consensus.Rule(self._name, self._groups, self._tables)

  def consensus(self, params_L: PyTree) -> PyTree:
    return consensus.materialize(self.consensus_rule(), params_L, self._merged_sync_state_R, self._meshes)

  def stats(self) -> dict[str, Any]:
    """The rounds and sync gaps, this process's pace (`pacing.Pacer.stats`), and sync_job_gap_steps: the gap the
    processes agreed on at the last round."""
    return {**self._gaps.stats(), **self._pacer.stats(), 'sync_job_gap_steps': self._agreed_gap}

  def _dispatch(self, state_L: Any, step: int) -> Any:
    snapshot_L = rounds.copy(rounds.select(state_L.params, self._groups))
    synced_R, self._sync_state_R, agreed_gap = self._round_R(
      replicas.to_job(snapshot_L, self._meshes), self._sync_state_R, self._gap_array(self._my_gap_steps())
    )
    self._in_flight = _InFlight(snapshot_L, synced_R, self._sync_state_R, agreed_gap, step)
    self._next_round_step = step + (self._agreed_gap or 1)  # The gap the last round agreed on: known everywhere.
    self._dispatched_at = step
    self._clock.touched()
    return state_L

  def _merge(self, state_L: Any, step: int | None) -> Any:
    round_ = self._in_flight
    self._agreed_gap = int(replicas.fetch(round_.agreed_gap))  # Waits for the round if it is not done.
    latency_s = time.perf_counter() - round_.dispatched_s
    synced_L = replicas.to_local(round_.synced_R, self._meshes)
    merged = rounds.merge(rounds.select(state_L.params, self._groups), round_.snapshot_L, synced_L)
    state_L = state_L._replace(params=rounds.with_synced(state_L.params, merged))
    self._merged_sync_state_R = round_.sync_state_R
    self._gaps.merged(step, latency_s)
    if step is not None:
      self._pacer.observe_round(latency_s)
    self._in_flight = None
    self._clock.touched()
    return state_L

  def _my_gap_steps(self) -> int:
    """This process's pace in steps: its interval over its step time between rounds; until that step time is known,
    room for the round's steps and enough steps between rounds to measure it."""
    step_s = self._pacer.step_time_s()
    if step_s is None:
      return _SHORT_BLOCKS + pacing.MIN_STEPS_MEASURED + 1
    return max(_SHORT_BLOCKS + 1, math.ceil(self._pacer.interval_s() / step_s))

  def _gap_array(self, gap_steps: int) -> jax.Array:
    """This process's gap on each of its devices, as its part of a job-wide [R] array."""
    local = np.full((self._num_local,), gap_steps, np.int32)
    if self._meshes.job is self._meshes.local:
      return replicas.shard(local, self._meshes.local)
    return jax.make_array_from_process_local_data(replicas.replica_sharding(self._meshes.job), local)


def _round_program(sync_R, mesh):
  """One program: the round over the job's replicas, and the largest of the processes' gaps, whole on every device."""
  job_max = functools.partial(jnp.max, axis=0)

  def round_and_agreement(synced_R, sync_state_R, gaps_R):
    new_synced_R, new_sync_state_R = sync_R(synced_R, sync_state_R)
    return new_synced_R, new_sync_state_R, job_max(gaps_R)

  spec = replicas.replica_sharding(mesh)
  return jax.jit(round_and_agreement, out_shardings=(spec, spec, NamedSharding(mesh, P())))
