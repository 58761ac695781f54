"""When sync rounds run: never, every k steps in the foreground, or off the training path at a paced gap.

  driver = drivers.make(config.sync, meshes, num_replicas)  # meshes = replicas.make_meshes(num_replicas)
  sync_state_R = driver.initial_sync_state(state_L)  # EA center, BMUF global model and momentum; None if no rounds
  driver.start(state_L, sync_state_R)          # or a sync state restored from a checkpoint
  for block in ...:                           # blocks of steps, one dispatch each (docs/design.md §13)
    driver.next_due(step)                       # the next step it must act at (the loop ends a block there), or None
    driver.before_block(b)                      # rounds and merges due here, on b.state, before the block
    state_L, _ = train_block(state_L, block_L)  # with `driver.between_steps()` fused in, if it has rounds there
    driver.at_boundary(b)                       # a foreground round due; the blocks' times (b.work_s: the
    ... metric writes, saves ...                #   loop's work at the boundary before, left out of a pace)
  state_L = driver.finish(state_L)             # ends the rounds (shadow: the round in flight lands, no later one)
  rule = driver.consensus_rule()               # the model to evaluate (docs/design.md §3), read where it lives
  driver.stats()                               # sync_rounds, mean/max sync gap, mean round latency; shadow: the pace
  driver = driver.restarted(state_L, sync_state_R)  # full recovery: the driver to go on with from a restored pair

The train state `state_L` holds this process's replicas (`meshes.local`); rounds and the consensus run over all
the job's replicas (`meshes.job`, the same mesh in a one-process job), so the sync state `sync_state_R` is a
job-wide array. The math of a round lives in `algorithms` (pure, testable on numbers); the drivers own timing and
threads: `foreground.NoSync` and `foreground.ForegroundSync` run on the training thread; the shadow rounds are fused
into the training blocks by `scheduled.ScheduledShadowSync` where one program runs at a time for the whole job (one
process, or steps that are collectives: sharded tables), and run in `shadow.ShadowSync`'s thread, the processes'
sums met on the host, where processes step apart; `pacing` paces them, `rounds` holds what the drivers share (the
synced groups, the sync-gap bookkeeping) and `consensus` the model they evaluate.
"""

from typing import Any, Protocol

import ml_collections

from shadowsync_jax import hooks
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import foreground
from shadowsync_jax.sync import rounds
from shadowsync_jax.sync import scheduled
from shadowsync_jax.sync import shadow

PyTree = Any


class SyncDriver(Protocol):
  """What the training loop calls at its step boundaries (module docstring): a hook of the loop (`hooks.Hook`:
  `next_due`, `before_block`, `waits_for`, `at_boundary`, `end`), and what a run asks of its rounds; every driver
  of this package has it."""

  def initial_sync_state(self, state_L: Any) -> PyTree | None: ...

  def start(self, state_L: Any, sync_state_R: PyTree | None) -> None:
    """Compiles what the rounds run (so that no compile happens among the timed training steps), then starts
    them."""

  def sync_state(self) -> PyTree | None:
    """The current sync state (None for algorithms without rounds)."""

  def settled(self, state_L: Any) -> tuple[Any, PyTree | None]:
    """(train state, sync state) as a pair a run can go on from, to checkpoint: every round in it whole, none half
    landed (a round in flight is in it whole or not at all; the live state is left as it is)."""

  def next_due(self, step: int) -> int | None:
    """The first step after `step` at whose boundary it must act (a round due); None: any boundary will do."""

  def between_steps(self) -> Any:
    """Rounds fused into the loop's blocks, run on each device between two of a block's steps
    (`replicas.Between`, `replicas.make_replicated_block`), or None. With them, the loop asks
    `block_carry(step, steps)` for each block's carry and hands the block's back to `after_block(carry)`."""

  def before_block(self, b: hooks.Boundary) -> None:
    """At the boundary `b.state` is at (`b.step`), right before the loop dispatches the next block: the device work
    due there (rounds, merges, hand-overs), on `b.state`. Work on the live params goes here, not after the next
    block is dispatched: a program whose inputs are not ready yet holds the thread that dispatches it until they
    are (XLA:CPU, for programs over several devices), so dispatched behind the next block it held the loop until
    that block was done, and the devices idle through the loop's own work at the boundary."""

  def at_boundary(self, b: hooks.Boundary) -> None:
    """After dispatching a block of `b.steps` steps that ends at `b.step`: a foreground round due there, on
    `b.state`; bookkeeping (the blocks' times: `b.waited`, the loop waited for this block before the boundary, it
    keeps one in flight otherwise; `b.paused_s`, seconds since the last boundary that were no training; `b.work_s`,
    the loop's own work at the last boundary after the driver's, metric writes and saves: for drivers that time
    the blocks)."""

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    """Ends the rounds (`abandon`: at once, the run is failing) and returns the final train state."""

  def restarted(self, state_L: Any, sync_state_R: PyTree | None) -> 'SyncDriver':
    """The driver to go on with from a restored (`state_L`, `sync_state_R`) (full recovery): this one started
    again (no thread of its own), or, where a thread and a round in flight belong to the lost run, this one ended
    and a fresh one like it started (`restarts.RestartedSync`: the stats add up)."""

  def consensus_rule(self) -> consensus.Rule:
    """Which model is evaluated (`consensus`): read where it lives, with `sync_state()`."""

  def consensus(self, params_L: PyTree) -> PyTree:
    """The model to evaluate, whole, one tree without the replica axis (read it with `replicas.fetch`): for small
    models and tests (`consensus.materialize` builds its tables)."""

  def stats(self) -> dict[str, Any]: ...


def make(
  sync: ml_collections.ConfigDict,
  meshes: replicas.ReplicaMeshes,
  num_replicas: int,
  keep_params: bool = False,
  first_round_after: int = 1,
) -> SyncDriver:
  """The driver for a run's `sync` section (`sync.algorithm`): NoSync, ForegroundSync (`fr_*`) or ShadowSync
  (`shadow_*`), for the job's `num_replicas`. `keep_params`: a foreground round leaves the params it replaces
  alive (under partial recovery a round whose peer died must leave the live params to be saved: no donation).
  `first_round_after`: the steps from the start before a shadow round (the compiling block, and 'auto''s probe: a
  round's work in its timed blocks made it choose one step a dispatch; `block_plan.steps_until_chosen`, the
  caller's); 1 where the loop's K is in use (a restart inside the loop) or given."""
  tables = consensus.Tables(sync.embedding_placement, sync.shard_exchange)
  if sync.algorithm in ('none', 'sync_sgd'):
    return foreground.NoSync(sync.algorithm, meshes, tables)
  mode, name = sync.algorithm.split('_', 1)
  algorithm = algorithms.make(
    name,
    replicas.REPLICA_AXIS,
    num_replicas,
    sync.elastic_alpha,
    sync.block_momentum,
    sync.block_lr,
    sync.nesterov,
  )
  groups = rounds.synced_groups(sync.what, sync.embedding_placement)
  if mode == 'fr':
    return foreground.ForegroundSync(
      algorithm, name, meshes, groups, sync.every_k_steps, donate=not keep_params, tables=tables
    )
  args = (algorithm, name, meshes, groups, sync.min_interval_s, sync.max_overhead, tables, first_round_after)
  if mode == 'shadow' and (meshes.job is meshes.local or sync.embedding_placement == 'sharded'):
    return scheduled.ScheduledShadowSync(*args)  # One program at a time for the whole job: rounds between blocks.
  if mode == 'shadow':
    return shadow.ShadowSync(*args)  # Processes that step apart: a thread of its own, none waits for a round.
  raise ValueError(f'sync.algorithm={sync.algorithm!r} has no driver.')


def keeps_params(recovery_mode: str) -> bool:
  """`make`'s `keep_params` under `recovery.mode`: whether a failed round must leave the live params (partial
  recovery saves them)."""
  return recovery_mode not in ('none', 'full')
