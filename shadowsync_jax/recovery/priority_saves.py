"""CPR-MFU/SSU's priority saves as a policy runs them: the saver, how often it saves, what a restart takes from it.

  saver = priority_saves.make_saver(config, mode, directory, state_L)        # emulated failures' (one process)
  saves = priority_saves.PacedPrioritySaves(process, mode, state_L, every)   # a process of a job's (`real`)
  saves.count(sparse); saves.next_due(step); saves.at_boundary(step, state_L) # count lookups; save when due
  saves.pace(step, step_s)                                                   # at each checkpoint: the pace again
  state_L, step = priority_saves.newer_rows(directory, state_L, checkpoint_step, position)   # at a restart

The saver (`priority_rows.PrioritySaver`) counts the lookups and writes the most used rows in threads of its own.
Emulated failures save every `recovery.priority_every_steps`, or four times a checkpoint interval. A process of a
job paces them instead: once a priority save's cost is known, every as many steps as keep the costliest process's
within `recovery.priority_max_overhead` of the time at the slowest pace, never more often than a quarter interval
(where the processes step together, one exchange, and process 0 writes the pace down for the restarts). A process
that died takes back the rows of its newest priority save newer than the checkpoint it restored.
"""

from collections.abc import Callable
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from shadowsync_jax.model import table_placement
from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import history
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import differentials
from shadowsync_jax.recovery import intervals
from shadowsync_jax.recovery import job_process
from shadowsync_jax.recovery import priority_rows
from shadowsync_jax.recovery import restore


def make_saver(
  config: ml_collections.ConfigDict,
  mode: str,
  directory: pathlib.Path,
  state_L: Any,
  shards: priority_rows.HeldShards | None = None,
  max_overhead: float = 0.0,
) -> priority_rows.PrioritySaver:
  """The saver of `mode` (`cpr_mfu`: exact counts, `cpr_ssu`: a sub-sample), its rows capped by bytes."""
  recovery = config.recovery
  return priority_rows.PrioritySaver(
    directory,
    [int(c) for c in config.data.cardinalities],
    recovery.priority_fraction,
    sample_rate=recovery.ssu_sample_rate if mode == 'cpr_ssu' else None,
    seed=config.seed,
    shards=shards,
    max_bytes=recovery.priority_max_bytes,
    bytes_per_row=restore.bytes_per_row(state_L),
    max_overhead=max_overhead,
  )


def directory_of(process: job_process.JobProcess) -> pathlib.Path:
  return process.workdir / 'priority_rows' / process.writer


def newer_rows(directory: pathlib.Path, state_L: Any, checkpoint_step: int, position: int) -> tuple[Any, int | None]:
  """The rows of the newest priority save in `directory` newer than a restored checkpoint (and not past
  `position`) over the restored ones, and that save's step (None: none newer): CPR-MFU/SSU's gain for a process that
  died."""
  saved = priority_rows.read_latest(directory)
  if saved is None or not checkpoint_step < saved[0] <= position:
    return state_L, None
  step, rows, values = saved
  live = restore.row_leaves(state_L)
  if rows.ndim == 1:  # Replicated tables: the same rows of every replica's table.
    rows = np.broadcast_to(rows, (state_L.step.shape[0], rows.shape[0]))
  rows = jnp.asarray(rows)
  changed = restore.rows_that_differ(live, rows, values)
  recovered = restore.write_rows_per_replica(live, rows, values)
  state_L = restore.with_row_leaves(state_L, restore.placed_like(recovered, live))
  # Rows written outside a step, and changed by it: stamped, so that the next incremental checkpoint holds them. A
  # row the save holds as restored (unused since the checkpoint, or never: the saves are padded to K rows) keeps the
  # checkpoint's stamp. (Stamping all K once made every later differential of the process hold them: at Criteo
  # Kaggle's size about a million rows more, 1.6x the bytes a save for the rest of the run.)
  unchanged = state_L.row_steps.shape[1]  # Out of range: `stamp_rows` drops it.
  stamps = differentials.stamp_rows(state_L.row_steps, jnp.where(changed, rows, unchanged), jnp.int32(position))
  return state_L._replace(row_steps=jax.device_put(stamps, state_L.row_steps.sharding)), step


class PacedPrioritySaves:
  """A process of a job's priority saves (module docstring)."""

  def __init__(
    self,
    process: job_process.JobProcess,
    mode: str,
    state_L: Any,
    least_interval: Callable[[], int],
    saved_for: Callable[..., None],
  ):
    """`least_interval`: the most often they may come (a quarter checkpoint interval); `saved_for(step, kind,
    blocking_s, **written)`: writes a save's blocking down."""
    self._process, self._least_interval, self._saved_for = process, least_interval, saved_for
    config = process.config
    recovery = config.recovery
    shards = None
    if config.sync.embedding_placement == 'sharded':
      num_rows, num_local = int(sum(config.data.cardinalities)), process.meshes.local.shape[replicas.REPLICA_AXIS]
      shards = priority_rows.HeldShards(
        table_placement.ShardLayout(num_rows, config.num_replicas),
        first=process.index * num_local,
        count=num_local,
        rows_held=table_placement.rows_held('sharded', num_rows, config.num_replicas),
      )
    max_overhead = 0.0 if recovery.priority_every_steps else recovery.priority_max_overhead
    self.saver = make_saver(config, mode, directory_of(process), state_L, shards, max_overhead)
    # Steps between priority saves once their cost is known (`pace`); the job's, written down by process 0, where
    # the processes step together.
    paced = history.latest(process.workdir, 'priority_pace') if process.lock_step else None
    self.every: int | None = paced['every'] if paced else None

  def interval(self) -> int:
    return self._process.config.recovery.priority_every_steps or self.every or self._least_interval()

  def next_due(self, step: int) -> int:
    every = self.interval()
    return (step // every + 1) * every

  def count(self, sparse: Any) -> None:
    self.saver.count(sparse)

  def at_boundary(self, step: int, state_L: Any) -> None:
    """A priority save due at `step`, or, where the last one is still being written or its cost is over budget,
    a turn skipped (written down)."""
    process = self._process
    if not self.saver.due():
      history.append(
        process.workdir, process.writer, {'event': 'priority_skipped', 'step': step, 'process': process.index}
      )
    else:
      started, threads_s = time.perf_counter(), self.saver.last_cost_s  # The save before: done (`due`).
      self.saver.save(step, restore.row_leaves(state_L))
      self._saved_for(step, 'priority', time.perf_counter() - started, previous_threads_s=threads_s)

  def pace(self, step: int, step_s: float | None) -> None:
    """At each checkpoint, once a priority save's cost is known (its ranking and writing, in threads): priority saves
    from now on every as many steps as keep the costliest process's within `recovery.priority_max_overhead` of the
    time at the slowest pace so far (`step_s`: this process's), never more often than a quarter interval. Where the
    processes step together, one exchange (they cut their blocks at the same steps) and process 0 writes a new pace
    down for the restarts. Before it, a saver that could not keep up skipped its turns, each of which cut a block: at
    Criteo Kaggle's size blocks of 4 steps, and 494 of 528 turns skipped in a CPR-MFU run."""
    process = self._process
    if process.config.recovery.priority_every_steps:
      return  # Set: no pace.
    measured = {'cost_s': self.saver.last_cost_s, 'step_s': step_s or 0.0}
    everyone = (
      distributed.exchange(f'priority_pace/{process.generation}/{step}', measured) if process.lock_step else [measured]
    )
    cost_s, step_s = max(m['cost_s'] for m in everyone), max(m['step_s'] for m in everyone)
    if not (cost_s > 0 and step_s > 0):
      return  # No priority save timed yet: at the next checkpoint.
    budget, least = process.config.recovery.priority_max_overhead, self._least_interval()
    every = intervals.budget_interval_steps(cost_s, step_s, budget, least)
    if every != self.every and process.lock_step and process.index == 0:
      record = {'event': 'priority_pace', 'step': step, 'every': every, 'cost_s': cost_s, 'step_s': step_s}
      history.append(process.workdir, 'process_0', record)
    self.every = every

  def close(self) -> None:
    self.saver.close()
