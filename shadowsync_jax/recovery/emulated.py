"""Emulated failures and the recovery from them, at the training loop's step boundaries (docs/design.md §7, CPR).

  recovery = emulated.EmulatedFailures(config, meshes, workdir, total_steps)   # recovery.mode != 'none', 1 process
  state_L, sync_state_R, start_step = recovery.resume(fresh)   # the newest checkpoint, if any (`FreshState`)
  recovery.start(start_step, state_L, sync_state_R)       # the initial checkpoint the first failures reload
  for block in ...:                                       # n steps a dispatch, ending where `next_due` says
    ...                                                   # the loop's boundary b (`hooks.Boundary`), every block
    recovery.at_boundary(b)                               #   waited for; a full recovery sets b.state, b.driver
    recovery.next_due(step)                               #   and b.rewind_to (the data goes back to there)
  recovery.finish(step, state_L, sync_state_R)            # the final save
  recovery.summary()    # recovery_overhead_pct, num_failures, estimated_pls, actual_pls, checkpoint_interval_steps

Failures strike on the clock of `failures.FailureSchedule` (training steps executed, re-trained ones included):
each takes down one replica or one embedding shard (rows of every table, `failures.embedding_shard_rows`), and
the loop handles it at the boundary of the step it struck (a block ends there: `next_due`), before a checkpoint
due there. Recovery modes
(`recovery.mode`), after Maeng et al., "CPR: Understanding and Improving Failure Tolerant Training for Deep
Learning Recommendation with Partial Recovery" (MLSys 2021, arXiv:2011.02999):
- `full`: the whole train state and sync state reload the newest checkpoint, the data position rewinds to it and
  the lost steps are trained again. Checkpoints every Young's interval, sqrt(2 save cost MTBF).
- `partial`: only the failed part reloads, through orbax's partial restore (`Checkpointer.restore_partial`): a
  replica's train state, or a shard's rows of the tables and of their row-wise Adagrad accumulators in every
  replica. The rest trains on; the data does not rewind; the failed part's updates since the checkpoint are lost.
  Checkpoints every longest interval whose expected portion of lost samples (PLS) stays under
  `recovery.target_pls` (`intervals.partial_recovery_interval`).
- `cpr_mfu`, `cpr_ssu`: `partial`, and the most used rows are also saved several times per interval
  (`priority_rows`), counted exactly (MFU) or from a sub-sample of the lookups (SSU); a failed row in the newest
  such save comes back from it.
- `cpr`: CPR's first mechanism (`cost_model.choose`): `cpr_mfu` where partial recovery is expected to cost less,
  else `full`, decided from the save and restore costs (measured over the first
  `schedule.CALIBRATION_STEPS` steps, during
  which it recovers as `cpr_mfu`, or emulated), the MTBF and the PLS target; the summary says what it chose and why.
The sync state (EA center, BMUF global model) is the same on every replica and lives with the sync service, not
with a shard: partial recovery leaves it as it is, which is what copying it from a live replica gives. A replica
keeps its step counter (the data position, which does not rewind); with shared tables (one table updated by all
replicas, an embedding parameter server) a replica failure loses its MLP only. Under a shadow driver the failed
part changes at a step boundary in the training thread, as a merge does; a round in flight then merges its late
part into the restored params. Full recovery restarts the sync driver from the checkpoint's sync state.

Overhead (docs/design.md §7), measured in the training thread: time blocked on saves (the initial one included), steps
trained again, restores (waiting for a save in flight, reading, placing, restarting the sync driver), and handing
batches to the MFU/SSU lookup counter (which counts in a thread of its own, as an embedding server would); as a
percentage of the failure-free steps' time (steps trained for the first time, the compiled first one excluded).
Work in other threads (orbax's writes, counting, priority writes) is not blocking, but it shares the cores: it
shows in the step times and the wall time. The readers and restore programs are warmed up in `start`. Costs are
measured unless `recovery.save_cost_steps` / `restore_cost_steps` emulate a larger system: then a save or restore
holds the loop (sleeps) until it has taken that many mean step times, scaled by the bytes it moves for priority
saves and partial restores. A resumed run starts its clock and its accounts afresh at the resumed step.

The policy composes its parts: the checkpoint schedule (`schedule.EmulatedSchedule`: the interval, its calibration,
`cpr`'s choice), the failed parts and their reload (`failed_parts`), the priority saver (`priority_saves`) and the
account (`accounts.Account`); a full recovery asks the sync driver for its restart (`SyncDriver.restarted`).
"""

import pathlib
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from shadowsync_jax import hooks
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import accounts
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import failed_parts
from shadowsync_jax.recovery import failures
from shadowsync_jax.recovery import incremental
from shadowsync_jax.recovery import priority_rows
from shadowsync_jax.recovery import priority_saves
from shadowsync_jax.recovery import restore
from shadowsync_jax.recovery import row_usage
from shadowsync_jax.recovery import schedule as checkpoint_schedule
from shadowsync_jax.recovery import training_state

PyTree = Any


class EmulatedFailures(hooks.Hook):
  """Failures on a seeded schedule and their recovery (`full`, `partial`, `cpr_mfu`, `cpr_ssu`, `cpr`) in one
  process."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    meshes: replicas.ReplicaMeshes,
    workdir: str | pathlib.Path,
    total_steps: int,
    schedule: failures.FailureSchedule | None = None,
    checkpointer: checkpointing.Checkpointer | None = None,
    untimed_blocks: int = 1,
  ):
    """`untimed_blocks`: the blocks of the start that the calibration leaves out (the compiling one, and 'auto''s
    probe: `block_plan.blocks_until_chosen`, the caller's)."""
    recovery = config.recovery
    if meshes.job is not meshes.local:
      raise ValueError(f'recovery.mode={recovery.mode!r} emulates failures in one process only.')
    checkpointer = checkpointer or checkpointing.Checkpointer(pathlib.Path(workdir) / 'checkpoints', meshes)
    self._config, self._checkpointer, self._total_steps = config, checkpointer, total_steps
    self._num_parts = config.num_replicas if recovery.failure_target == 'replica' else recovery.num_embedding_shards
    self._failures_due = schedule or failures.FailureSchedule(
      config.seed, recovery.mtbf_steps, recovery.failure_target, config.num_replicas, recovery.num_embedding_shards
    )
    self._cardinalities = [int(c) for c in config.data.cardinalities]
    self._schedule = checkpoint_schedule.EmulatedSchedule(config, total_steps, self._num_parts)
    # Incremental checkpoints, modelled where saves are emulated (a larger system, whose whole saves block): a save
    # then costs the bytes of the rows changed since the last baseline (`incremental`), a baseline the whole.
    self._incremental = self._schedule.emulated_save is not None and incremental.enabled(config, saves_block=True)
    self._baseline_step: int | None = None
    self._save_fractions: list[float] = []  # Of a whole checkpoint's bytes, each save's (emulated costs only).
    self._saver: priority_rows.PrioritySaver | None = None  # CPR-MFU/SSU's, made in `start` (its size: the rows').
    self._workdir = pathlib.Path(workdir)
    self._priority_every = recovery.priority_every_steps or None
    partial = self._schedule.partial
    self._ledger = row_usage.LostLookups(config.num_replicas, self._cardinalities) if partial else None
    self.account = accounts.Account(untimed_blocks=untimed_blocks)
    self.failure_log: list[dict[str, Any]] = []
    self._failures: list[failures.Failure] = []
    self.checkpoint_steps: list[int] = []
    self.priority_steps: list[int] = []
    self._executed = 0
    self._last_mark: float | None = None
    self._abstract: PyTree = None  # Of the training tree, set by `start`.
    self._parts: failed_parts.FailedParts | None = None  # Set by `start`.
    self._sync_restarts: list[dict[str, Any]] = []
    self._warm_restore_s: dict[str, float] = {}  # A full and a partial restore, timed warm, for `cpr`.

  @property
  def requested_mode(self) -> str:
    return self._schedule.requested_mode

  @property
  def mode(self) -> str:
    """The mode in force (`cpr`: `cpr_mfu` until it chose, then what it chose)."""
    return self._schedule.mode

  def resume(self, fresh: training_state.FreshState) -> tuple[Any, PyTree, int]:
    """The newest checkpoint of a run that stopped (or the fresh state, and step 0, on a fresh workdir)."""
    if self._checkpointer.latest_step() is None:
      return (*fresh(), 0)
    tree, data = self._checkpointer.restore_latest(fresh.abstract())
    print(f'Resumed from the checkpoint at step {data["step"]} of {self._total_steps}.')
    return tree['train'], tree.get('sync'), data['step']

  def start(self, step: int, state_L: Any, sync_state_R: PyTree) -> None:
    """Before the first step: the clock starts at `step`; a fresh run saves its initial state to recover from."""
    tree = training_state.training_tree(state_L, sync_state_R)
    self._abstract = training_state.abstract_like(tree)
    if self.mode in ('cpr_mfu', 'cpr_ssu'):
      self._saver = priority_saves.make_saver(self._config, self.mode, self._workdir / 'priority_rows', state_L)
    self._parts = failed_parts.FailedParts(self._config, self._checkpointer, self._abstract)
    self._executed = self.account.high_water = step
    if self._checkpointer.latest_step() != step:
      started = time.perf_counter()
      self._checkpointer.save(step, tree)
      if not (self._incremental and step == incremental.INITIAL):  # A real job rebuilds it: nothing written.
        self.account.saves_s += time.perf_counter() - started
    self.checkpoint_steps.append(step)
    self._baseline_step = step if self._incremental else None  # The first baseline: the initial state.
    # Under `cpr` both kinds of restore are warmed up, then timed once more for the choice.
    full, cpr = self.mode == 'full' or self.requested_mode == 'cpr', self.requested_mode == 'cpr'
    rows = self._saver.rows_per_save if self._saver is not None else None
    timed = self._parts.warm_up(step, state_L, full=full, partial=self.mode != 'full', priority_rows=rows)
    if cpr:
      self._warm_restore_s = timed
    self._last_mark = time.perf_counter()

  # Each block is done before its boundary. The policy times its blocks from boundary to boundary and charges what
  # a save blocks (an emulated save sleeps) to the saves: with a block still in flight, the device ran it during the
  # save, the next interval came out short, the mean step too low, the save cost in steps too high and Young's
  # interval too short, so saves came more often and hid more steps (full recovery at 21-30 steps, not 127-141,
  # and 0.41 ms a step against 3.7 in one run of benchmarks.recovery at 8600ece).
  def waits_for(self, b: hooks.Boundary) -> bool:
    return True

  def next_due(self, step: int) -> int | None:
    """The first step after `step` at whose boundary something is due: a failure (on the clock of steps executed),
    the end of the calibration, a checkpoint, a priority save."""
    next_failure = self._failures_due.next_failure_after(self._executed)
    dues = [None if next_failure is None else step + next_failure - self._executed]
    dues += self._schedule.next_due(step, self.account.steps)
    dues.append(checkpoint_schedule.next_multiple(step, self._priority_interval()))
    return min((due for due in dues if due is not None), default=None)

  def at_boundary(self, b: hooks.Boundary) -> None:
    """After a block of `b.steps` data steps that ended at `b.step` (`b.block`: its batches [R, K, B, ...], the
    first `b.steps` of them trained): failures that struck it, then a checkpoint due here; a full recovery sets
    `b.state` to the restored state, `b.driver` to the driver restarted from its sync state and `b.rewind_to` to
    the step of the checkpoint the data must restart from."""
    b.state, b.driver, b.rewind_to = self._at_boundary(b.step, b.state, b.steps, b.block, b.driver)

  def _at_boundary(self, step: int, state_L: Any, steps: int, block: Batch, driver: Any) -> tuple[Any, Any, int | None]:
    self.account.time_block(step, steps, time.perf_counter() - self._last_mark)
    first_executed, self._executed = self._executed + 1, self._executed + steps
    sparse = block.sparse[:, :steps]
    if self._saver is not None:
      started = time.perf_counter()
      self._saver.count(sparse)
      self.account.counting_s += time.perf_counter() - started
    if self._ledger is not None:  # Instrumentation (lost lookups), outside every account.
      self._ledger.count(sparse.reshape(sparse.shape[0], -1, sparse.shape[-1]))
    rewind_to = None
    struck = self._failures_due.failures_between(first_executed, self._executed)  # At the last step: `next_due`.
    if struck and self.mode == 'full':
      state_L, driver, rewind_to = self._recover_fully(struck, step, driver)
    elif struck:
      for failure in struck:
        state_L = self._recover_partially(failure, step, state_L)
    if rewind_to is None:
      self._save_if_due(step, state_L, driver)
    self._last_mark = time.perf_counter()
    return state_L, driver, rewind_to

  def on_error(self, error: BaseException, step: int, state_L: Any, driver: Any) -> None:
    """An exception in the loop: nothing to save here (a run that dies resumes from its newest checkpoint)."""

  def finish(self, step: int, state_L: Any, sync_state_R: PyTree) -> None:
    """After the last step: the final save, waited for."""
    self._checkpointer.save(step, training_state.training_tree(state_L, sync_state_R))
    self.close()

  def close(self) -> None:
    self._checkpointer.close()
    if self._saver is not None:
      self._saver.close()

  def summary(self) -> dict[str, Any]:
    """What summary.json gains (`recovery_overhead_pct`, `num_failures`, `estimated_pls`, ...) and the details."""
    plan, account, mean_step_s = self._schedule, self.account, self.account.mean_step_s()
    estimated_pls = actual_pls = 0.0  # Full recovery loses no samples: it trains them again.
    if plan.partial or any('lost_lookups' in f for f in self.failure_log):
      estimated_pls, actual_pls = plan.pls(self._failures, self.checkpoint_steps)
    save_cost_steps = plan.save_cost_steps(mean_step_s)
    restores_s = [f['restore_s'] for f in self.failure_log]
    details = {
      'failure_target': self._config.recovery.failure_target,
      'mtbf_steps': plan.mtbf,
      'num_parts': self._num_parts,
      'failures': self.failure_log,
      'save_cost_steps': save_cost_steps,
      'save_cost': 'emulated' if plan.emulated_save else 'measured',
      'restore_cost': 'emulated' if plan.emulated_restore else 'measured',
      'mean_save_block_s': float(np.mean(plan.save_blocks_s)) if plan.save_blocks_s else None,
      'save_write_steps': plan.write_steps,
      'mean_restore_s': float(np.mean(restores_s)) if restores_s else None,
      'mean_step_s': mean_step_s,
      'checkpoint_steps': self.checkpoint_steps,
      'num_checkpoints': len(self.checkpoint_steps),
      'priority_interval_steps': self._priority_interval(),
      'num_priority_saves': len(self.priority_steps),
      'lost_lookup_fraction': self._ledger.lost_fraction() if self._ledger else 0.0,
      **account.figures(),
      'sync_driver_restarts': len(self._sync_restarts),
      # Emulated save costs: whether incremental checkpoints were modelled, and each save's share of a whole one.
      'incremental_model': self._incremental,
      'mean_save_fraction': float(np.mean(self._save_fractions)) if self._save_fractions else None,
      'baselines': sum(f == 1.0 for f in self._save_fractions) if self._incremental else None,
    }
    if self.mode == 'full' and plan.interval and save_cost_steps is not None and mean_step_s:
      restore_steps = plan.emulated_restore or (np.mean(restores_s) / mean_step_s if restores_s else 0.0)
      details['expected_overhead_pct'] = plan.expected_full_overhead_pct(save_cost_steps, float(restore_steps))
    if plan.choice is not None:
      details['cpr_choice'] = plan.choice.to_dict()
    overhead_pct = account.overhead_pct()
    return {
      'recovery_mode': self.requested_mode,
      'recovered_as': self.mode,
      'num_failures': len(self._failures),
      'recovery_overhead_pct': overhead_pct,
      # All of an emulated failure's cost is checkpoint-related (saves, restores, work again): no process restarts.
      'recovery_checkpoint_overhead_pct': overhead_pct,
      'recovery_restart_overhead_pct': 0.0 if overhead_pct is not None else None,
      'estimated_pls': estimated_pls,
      'actual_pls': actual_pls,
      'checkpoint_interval_steps': plan.interval,
      'recovery': details,
    }

  # Saves.

  def _save_if_due(self, step: int, state_L: Any, driver: Any) -> None:
    due = self._schedule.calibration_due(self.account.steps)
    if due == 'choose':
      self._choose(step, state_L, driver)
    elif due == 'calibrate':
      self._calibrate(step, state_L, driver)
    elif self._schedule.due(step):
      self._save(step, state_L, driver)
    elif self._saver is not None and step % self._priority_interval() == 0:
      self._save_priority(step, state_L)

  def _timed_save(self, step: int, state_L: Any, driver: Any) -> float:
    """A save with no write in flight, and the seconds until it was written; the waits around it serve the
    measurement only and are kept out of the accounts."""
    self._checkpointer.wait()
    started = time.perf_counter()
    self._save(step, state_L, driver)
    self._checkpointer.wait()
    return time.perf_counter() - started

  def _calibrate(self, step: int, state_L: Any, driver: Any) -> None:
    """Full recovery with a measured save cost: Young's interval from a save measured (`schedule`)."""
    self._schedule.calibrated(self._timed_save(step, state_L, driver), self.account.mean_step_s())

  def _choose(self, step: int, state_L: Any, driver: Any) -> None:
    """`cpr`: full or partial recovery from now on, whichever the cost model expects to cost less (CPR's first
    mechanism). A measured save cost comes from one save with no write in flight, as `_calibrate` measures it."""
    plan, mean_step_s = self._schedule, self.account.mean_step_s() or 1.0
    if plan.emulated_save is None:
      plan.write_steps = self._timed_save(step, state_L, driver) / mean_step_s
    if plan.emulated_restore:
      full_restore = plan.emulated_restore
      partial_restore = plan.emulated_restore * self._parts.failed_fraction()
    else:
      full_restore = self._warm_restore_s['full'] / mean_step_s
      partial_restore = self._warm_restore_s['partial'] / mean_step_s
    priority_fraction = (
      self._parts.row_bytes(self._saver.rows_per_save) / self._parts.checkpoint_bytes
      if self._saver is not None
      else 0.0
    )
    choice = plan.choose(
      self.account.mean_step_s(), full_restore, partial_restore, priority_fraction, self._priority_every
    )
    if choice.mode == 'full' and self._saver is not None:
      self._saver.close()
      self._saver = None
    if step % plan.interval == 0 and self.checkpoint_steps[-1] != step:
      self._save(step, state_L, driver)

  def _save(self, step: int, state_L: Any, driver: Any) -> None:
    started = time.perf_counter()
    self._checkpointer.save(step, training_state.training_tree(*driver.settled(state_L)))
    self._schedule.save_blocks_s.append(time.perf_counter() - started)
    if self._schedule.emulated_save:
      self._save_fractions.append(self._save_fraction(step, state_L))
      self.account.hold(self._schedule.emulated_save * self._save_fractions[-1], started)
    self.account.saves_s += time.perf_counter() - started
    self.checkpoint_steps.append(step)
    if self._ledger is not None:
      self._ledger.full_saved()

  def _save_priority(self, step: int, state_L: Any) -> None:
    started = time.perf_counter()
    rows_K = self._saver.save(step, restore.row_leaves(state_L))
    if self._schedule.emulated_save:
      cost = self._schedule.emulated_save * self._parts.row_bytes(len(rows_K)) / self._parts.checkpoint_bytes
      self.account.hold(cost, started)
    self.account.priority_saves_s += time.perf_counter() - started
    self.priority_steps.append(step)
    self._ledger.priority_saved(rows_K)

  def _save_fraction(self, step: int, state_L: Any) -> float:
    """The share of a whole checkpoint's bytes this save writes: all of it, or under modelled incremental
    checkpoints a differential's (the rows stamped since the baseline and the dense part), unless those rows are
    `recovery.rebaseline_fraction` of the tables' rows: a new baseline (`incremental.IncrementalCheckpointer`'s
    rule)."""
    if not self._incremental:
      return 1.0
    rows_bytes, checkpoint_bytes = self._parts.rows_bytes, self._parts.checkpoint_bytes
    changed = float(np.mean(np.asarray(state_L.row_steps) > (self._baseline_step or 0)))
    fraction = (changed * rows_bytes + checkpoint_bytes - rows_bytes) / checkpoint_bytes
    if self._baseline_step is None or changed >= self._config.recovery.rebaseline_fraction:
      self._baseline_step = step
      return 1.0
    return fraction

  def _priority_interval(self) -> int | None:
    if self._saver is None:
      return None
    return self._priority_every or self._schedule.least_priority_interval()

  # Recovery.

  def _recover_fully(self, struck: list[failures.Failure], step: int, driver: Any) -> tuple[Any, Any, int]:
    """Everything reloads the newest checkpoint (one restore however many parts failed); the sync driver restarts
    from its sync state (`SyncDriver.restarted`: a shadow thread and its round in flight belong to the lost run)."""
    started = time.perf_counter()
    tree, data = self._checkpointer.restore_latest(self._abstract)
    restored_step = data['step']
    state_L, sync_state_R = tree['train'], tree.get('sync')
    restarted = driver.restarted(state_L, sync_state_R)
    if restarted is not driver:  # A fresh driver took over.
      self._sync_restarts.append({'step': self._executed})
    self.account.hold(self._schedule.emulated_restore, started)
    seconds = time.perf_counter() - started
    self.account.restore_s += seconds
    for failure in struck:
      self._log(failure, step, restored_step, seconds, retrained_steps=step - restored_step)
    return state_L, restarted, restored_step

  def _recover_partially(self, failure: failures.Failure, step: int, state_L: Any) -> Any:
    """Only the failed part reloads the newest checkpoint (and, CPR, the newest priority save after it)."""
    started = time.perf_counter()
    self._checkpointer.wait()
    checkpoint = self._checkpointer.latest_step()
    priority = self._saver.latest() if self._saver is not None else None
    if priority is not None and priority[0] <= checkpoint:
      priority = None  # Older than the full checkpoint: nothing newer in it.
    failed_RxV = self._parts.failed_rows(failure, state_L)
    state_L = self._parts.reload(state_L, failure, checkpoint, failed_RxV, priority)
    jax.block_until_ready(state_L)
    if self._schedule.emulated_restore:
      self.account.hold(self._schedule.emulated_restore * self._parts.restore_fraction(failure, failed_RxV), started)
    seconds = time.perf_counter() - started
    self.account.restore_s += seconds
    failed_replicas, failed_rows = np.flatnonzero(failed_RxV.any(axis=1)), np.flatnonzero(failed_RxV.any(axis=0))
    failed_rows = failed_rows[failed_rows < sum(self._cardinalities)]  # Not the padding rows past the tables.
    lost_lookups = self._ledger.fail(failed_replicas, failed_rows)
    self._log(
      failure, step, checkpoint, seconds, priority_from=priority[0] if priority else None, lost_lookups=lost_lookups
    )
    return state_L

  def _log(self, failure: failures.Failure, position: int, restored_from: int, restore_s: float, **more: Any) -> None:
    self._failures.append(failure)
    self.failure_log.append(
      {**failure.to_dict(), 'position': position, 'restored_from': restored_from, 'restore_s': restore_s, **more}
    )
    print(f'Failure at {failure}; restored from the checkpoint at step {restored_from} ({self.mode} recovery).')
