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
  else `full`, decided from the save and restore costs (measured over the first `CALIBRATION_STEPS` steps, during
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
"""

import dataclasses
import math
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from shadowsync_jax import hooks
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import cost_model
from shadowsync_jax.recovery import failures
from shadowsync_jax.recovery import incremental
from shadowsync_jax.recovery import intervals
from shadowsync_jax.recovery import modes
from shadowsync_jax.recovery import priority_rows
from shadowsync_jax.recovery import restore
from shadowsync_jax.recovery import row_usage
from shadowsync_jax.sync import drivers as sync_drivers
from shadowsync_jax.sync import foreground

PyTree = Any
CALIBRATION_STEPS = 20  # Failure-free steps timed before a measured save cost picks the full-recovery interval.


@dataclasses.dataclass
class Account:
  """Where the training thread's time went, in seconds."""

  step_s: float = 0.0  # Steps trained for the first time (the failure-free work), the compiled first one excluded.
  steps: int = 0
  retrained_s: float = 0.0  # Steps trained again after a full recovery's rewind.
  retrained_steps: int = 0
  saves_s: float = 0.0  # Blocked on full checkpoints.
  priority_saves_s: float = 0.0  # Blocked on CPR's priority saves.
  restore_s: float = 0.0
  counting_s: float = 0.0  # Blocked handing batches to the MFU/SSU lookup counter.

  def mean_step_s(self) -> float | None:
    return self.step_s / self.steps if self.steps else None

  def overhead_s(self) -> float:
    return self.saves_s + self.priority_saves_s + self.retrained_s + self.restore_s + self.counting_s


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
    self.requested_mode = recovery.mode
    self.mode = 'cpr_mfu' if recovery.mode == 'cpr' else recovery.mode  # `cpr` recovers partially until it chose.
    self._choice: cost_model.Choice | None = None
    self._config, self._checkpointer, self._meshes = config, checkpointer, meshes
    self._total_steps = total_steps
    self._mtbf = recovery.mtbf_steps
    self._num_shards = recovery.num_embedding_shards
    self._num_parts = config.num_replicas if recovery.failure_target == 'replica' else self._num_shards
    self._schedule = schedule or failures.FailureSchedule(
      config.seed, self._mtbf, recovery.failure_target, config.num_replicas, self._num_shards
    )
    self._shared_tables = config.sync.embedding_placement == 'shared'
    self._cardinalities = [int(c) for c in config.data.cardinalities]
    self._emulated_save = recovery.save_cost_steps if recovery.save_cost_steps > 0 else None
    self._emulated_restore = recovery.restore_cost_steps if recovery.restore_cost_steps > 0 else None
    # Incremental checkpoints, modelled where saves are emulated (a larger system, whose whole saves block): a save
    # then costs the bytes of the rows changed since the last baseline (`incremental`), a baseline the whole.
    self._incremental = self._emulated_save is not None and incremental.enabled(config, saves_block=True)
    self._baseline_step: int | None = None
    self._save_fractions: list[float] = []  # Of a whole checkpoint's bytes, each save's (emulated costs only).
    if self.requested_mode == 'cpr' and not recovery.checkpoint_every_steps:
      try:
        intervals.partial_recovery_interval(recovery.target_pls, self._mtbf, self._num_parts, total_steps)
      except ValueError:  # Partial recovery cannot hold the target at all: full, from the start.
        self.mode = 'full'
    self._partial = self.mode in modes.PARTIAL_MODES
    self._interval = recovery.checkpoint_every_steps or None
    if self._interval is None and self._partial:
      self._interval = intervals.partial_recovery_interval(
        recovery.target_pls, self._mtbf, self._num_parts, total_steps
      )
    elif self._interval is None and self._emulated_save is not None:
      self._interval = intervals.young_interval_steps(self._emulated_save, self._mtbf, total_steps)
    self._saver: priority_rows.PrioritySaver | None = None  # CPR-MFU/SSU's, made in `start` (its size: the rows').
    self._workdir = pathlib.Path(workdir)
    self._priority_every = recovery.priority_every_steps or None
    self._ledger = row_usage.LostLookups(config.num_replicas, self._cardinalities) if self._partial else None
    self.account = Account()
    self.failure_log: list[dict[str, Any]] = []
    self._failures: list[failures.Failure] = []
    self.checkpoint_steps: list[int] = []
    self.priority_steps: list[int] = []
    self._save_blocks_s: list[float] = []
    self._executed = self._high_water = 0
    self._last_mark: float | None = None
    # Blocks not timed: the first (it compiles) and 'auto''s probe (blocks of 1 and 8 steps, each waited for, the
    # last one compiling the K chosen). Timed, they made the calibration's mean step several times a K-block's, and
    # full recovery's interval (Young's, from the save cost in steps) several times too short.
    self._untimed_blocks = untimed_blocks
    self._abstract: PyTree = None  # Of the training tree, set by `start`.
    self._checkpoint_bytes = self._rows_bytes = 0
    self._sync_restarts: list[dict[str, Any]] = []
    self._write_steps: float | None = None  # How long a full save takes to be written, measured by `_calibrate`.
    self._warm_restore_s: dict[str, float] = {}  # A full and a partial restore, timed warm (`_warm_up`), for `cpr`.

  def resume(self, fresh: checkpointing.FreshState) -> tuple[Any, PyTree, int]:
    """The newest checkpoint of a run that stopped (or the fresh state, and step 0, on a fresh workdir)."""
    if self._checkpointer.latest_step() is None:
      return (*fresh(), 0)
    tree, data = self._checkpointer.restore_latest(fresh.abstract())
    print(f'Resumed from the checkpoint at step {data["step"]} of {self._total_steps}.')
    return tree['train'], tree.get('sync'), data['step']

  def start(self, step: int, state_L: Any, sync_state_R: PyTree) -> None:
    """Before the first step: the clock starts at `step`; a fresh run saves its initial state to recover from."""
    tree = checkpointing.training_tree(state_L, sync_state_R)
    self._abstract = checkpointing.abstract_like(tree)
    if self.mode in ('cpr_mfu', 'cpr_ssu'):
      recovery = self._config.recovery
      self._saver = priority_rows.PrioritySaver(
        self._workdir / 'priority_rows',
        self._cardinalities,
        recovery.priority_fraction,
        sample_rate=recovery.ssu_sample_rate if self.mode == 'cpr_ssu' else None,
        seed=self._config.seed,
        max_bytes=recovery.priority_max_bytes,
        bytes_per_row=restore.bytes_per_row(state_L),
      )
    self._checkpoint_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(self._abstract))
    # Of the leaves indexed by row (tables, their optimizer state, stamps): what a differential writes a share of.
    self._rows_bytes = memory.state_bytes([x for _, x in incremental.row_and_dense_leaves(self._abstract)[0]])
    self._executed = self._high_water = step
    if self._checkpointer.latest_step() != step:
      started = time.perf_counter()
      self._checkpointer.save(step, tree)
      if not (self._incremental and step == incremental.INITIAL):  # A real job rebuilds it: nothing written.
        self.account.saves_s += time.perf_counter() - started
    self.checkpoint_steps.append(step)
    self._baseline_step = step if self._incremental else None  # The first baseline: the initial state.
    self._warm_up(step, state_L)
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
    next_failure = self._schedule.next_failure_after(self._executed)
    dues = [None if next_failure is None else step + next_failure - self._executed]
    calibrating = self.requested_mode == 'cpr' and self._choice is None or self._interval is None
    if calibrating and self.account.steps < CALIBRATION_STEPS:
      dues.append(step + CALIBRATION_STEPS - self.account.steps)
    dues += [_next_multiple(step, self._interval), _next_multiple(step, self._priority_interval())]
    return min((due for due in dues if due is not None), default=None)

  def at_boundary(self, b: hooks.Boundary) -> None:
    """After a block of `b.steps` data steps that ended at `b.step` (`b.block`: its batches [R, K, B, ...], the
    first `b.steps` of them trained): failures that struck it, then a checkpoint due here; a full recovery sets
    `b.state` to the restored state, `b.driver` to the restarted driver and `b.rewind_to` to the step of the
    checkpoint the data must restart from."""
    b.state, b.driver, b.rewind_to = self._at_boundary(b.step, b.state, b.steps, b.block, b.driver)

  def _at_boundary(self, step: int, state_L: Any, steps: int, block: Batch, driver: Any) -> tuple[Any, Any, int | None]:
    self._time_block(step, steps, time.perf_counter() - self._last_mark)
    first_executed, self._executed = self._executed + 1, self._executed + steps
    sparse = block.sparse[:, :steps]
    if self._saver is not None:
      started = time.perf_counter()
      self._saver.count(sparse)
      self.account.counting_s += time.perf_counter() - started
    if self._ledger is not None:  # Instrumentation (lost lookups), outside every account.
      self._ledger.count(sparse.reshape(sparse.shape[0], -1, sparse.shape[-1]))
    rewind_to = None
    struck = self._schedule.failures_between(first_executed, self._executed)  # At the last step: `next_due`.
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
    self._checkpointer.save(step, checkpointing.training_tree(state_L, sync_state_R))
    self.close()

  def close(self) -> None:
    self._checkpointer.close()
    if self._saver is not None:
      self._saver.close()

  def summary(self) -> dict[str, Any]:
    """What summary.json gains (`recovery_overhead_pct`, `num_failures`, `estimated_pls`, ...) and the details."""
    account, mean_step_s = self.account, self.account.mean_step_s()
    estimated_pls = actual_pls = 0.0  # Full recovery loses no samples: it trains them again.
    if self._partial or any('lost_lookups' in f for f in self.failure_log):
      estimated_pls = intervals.expected_pls(self._interval, self._mtbf, self._num_parts, self._total_steps)
      actual_pls = intervals.measured_pls(
        intervals.lost_steps(self._failures, self.checkpoint_steps), self._num_parts, self._total_steps
      )
    save_cost_steps = self._save_cost_steps()
    restores_s = [f['restore_s'] for f in self.failure_log]
    details = {
      'failure_target': self._config.recovery.failure_target,
      'mtbf_steps': self._mtbf,
      'num_parts': self._num_parts,
      'failures': self.failure_log,
      'save_cost_steps': save_cost_steps,
      'save_cost': 'emulated' if self._emulated_save else 'measured',
      'restore_cost': 'emulated' if self._emulated_restore else 'measured',
      'mean_save_block_s': float(np.mean(self._save_blocks_s)) if self._save_blocks_s else None,
      'save_write_steps': self._write_steps,
      'mean_restore_s': float(np.mean(restores_s)) if restores_s else None,
      'mean_step_s': mean_step_s,
      'checkpoint_steps': self.checkpoint_steps,
      'num_checkpoints': len(self.checkpoint_steps),
      'priority_interval_steps': self._priority_interval(),
      'num_priority_saves': len(self.priority_steps),
      'lost_lookup_fraction': self._ledger.lost_fraction() if self._ledger else 0.0,
      'failure_free_s': account.step_s,
      'failure_free_steps': account.steps,
      'blocked_on_saves_s': account.saves_s,
      'blocked_on_priority_saves_s': account.priority_saves_s,
      'retrained_s': account.retrained_s,
      'retrained_steps': account.retrained_steps,
      'restore_s': account.restore_s,
      'row_counting_s': account.counting_s,
      'sync_driver_restarts': len(self._sync_restarts),
      # Emulated save costs: whether incremental checkpoints were modelled, and each save's share of a whole one.
      'incremental_model': self._incremental,
      'mean_save_fraction': float(np.mean(self._save_fractions)) if self._save_fractions else None,
      'baselines': sum(f == 1.0 for f in self._save_fractions) if self._incremental else None,
    }
    if self.mode == 'full' and self._interval and save_cost_steps is not None and mean_step_s:
      restore_steps = self._emulated_restore or (np.mean(restores_s) / mean_step_s if restores_s else 0.0)
      details['expected_overhead_pct'] = 100 * intervals.expected_full_recovery_overhead(
        self._interval, save_cost_steps, float(restore_steps), self._mtbf, self._total_steps
      )
    if self._choice is not None:
      details['cpr_choice'] = self._choice.to_dict()
    overhead_pct = 100 * account.overhead_s() / account.step_s if account.step_s else None
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
      'checkpoint_interval_steps': self._interval,
      'recovery': details,
    }

  def _time_block(self, step: int, steps: int, seconds: float) -> None:
    """A block of `steps` steps ending at `step` took `seconds`, an equal share each: steps trained again (at or
    below the furthest step reached) and steps trained for the first time."""
    if self._untimed_blocks:  # The compiling block, 'auto''s probe (`__init__`).
      self._untimed_blocks -= 1
    else:
      retrained = max(0, min(step, self._high_water) - (step - steps))
      self.account.retrained_s += seconds * retrained / steps
      self.account.retrained_steps += retrained
      self.account.step_s += seconds * (steps - retrained) / steps
      self.account.steps += steps - retrained
    self._high_water = max(self._high_water, step)

  # Saves.

  def _save_if_due(self, step: int, state_L: Any, driver: Any) -> None:
    if (
      self.requested_mode == 'cpr'
      and self._choice is None
      and (self._emulated_save or self.account.steps >= CALIBRATION_STEPS)
    ):
      self._choose(step, state_L, driver)
    elif self._interval is None and self.account.steps >= CALIBRATION_STEPS:
      self._calibrate(step, state_L, driver)
    elif self._interval and step % self._interval == 0:
      self._save(step, state_L, driver)
    elif self._saver is not None and step % self._priority_interval() == 0:
      self._save_priority(step, state_L)

  def _calibrate(self, step: int, state_L: Any, driver: Any) -> None:
    """Full recovery with a measured save cost: Young's interval from the time a save blocks the loop, but no
    shorter than the save takes to be written (or each save would wait for the previous one). Measured on a save
    with no write in flight; the waits around it serve the measurement only and are kept out of the accounts."""
    self._checkpointer.wait()
    started = time.perf_counter()
    self._save(step, state_L, driver)
    self._checkpointer.wait()
    self._write_steps = (time.perf_counter() - started) / self.account.mean_step_s()
    self._interval = max(
      math.ceil(self._write_steps),
      intervals.young_interval_steps(self._save_cost_steps(), self._mtbf, self._total_steps),
    )

  def _choose(self, step: int, state_L: Any, driver: Any) -> None:
    """`cpr`: full or partial recovery from now on, whichever the cost model expects to cost less (CPR's first
    mechanism). A measured save cost comes from one save with no write in flight, as `_calibrate` measures it."""
    mean_step_s = self.account.mean_step_s() or 1.0
    if self._emulated_save is None:
      self._checkpointer.wait()
      started = time.perf_counter()
      self._save(step, state_L, driver)
      self._checkpointer.wait()
      self._write_steps = (time.perf_counter() - started) / mean_step_s
    save = self._save_cost_steps()
    if self._emulated_restore:
      full_restore = self._emulated_restore
      partial_restore = self._emulated_restore * self._failed_fraction()
    else:
      full_restore = self._warm_restore_s['full'] / mean_step_s
      partial_restore = self._warm_restore_s['partial'] / mean_step_s
    recovery = self._config.recovery
    self._choice = cost_model.choose(
      save,
      full_restore,
      partial_restore,
      self._mtbf,
      self._num_parts,
      recovery.target_pls,
      self._total_steps,
      min_full_interval_steps=math.ceil(self._write_steps or 1),
      priority_cost_steps=save * self._priority_fraction_of_bytes(),
      priority_fraction_of_interval=None if self._priority_every else 0.25,
    )
    print(f'cpr: {self._choice.why}')
    if self._choice.mode == 'full':
      self.mode, self._partial = 'full', False
      self._interval = self._choice.full_interval_steps
      if self._saver is not None:
        self._saver.close()
        self._saver = None
    if step % self._interval == 0 and self.checkpoint_steps[-1] != step:
      self._save(step, state_L, driver)

  def _priority_fraction_of_bytes(self) -> float:
    """The share of the checkpoint's bytes a priority save writes (none without a priority saver)."""
    return self._row_bytes(self._saver.rows_per_save) / self._checkpoint_bytes if self._saver is not None else 0.0

  def _failed_fraction(self) -> float:
    """The share of the checkpoint's bytes one failure reloads under partial recovery."""
    if self._config.recovery.failure_target == 'replica':
      return 1 / self._config.num_replicas
    rows = failures.embedding_shard_rows(self._cardinalities, self._num_shards, 0)
    return self._row_bytes(len(rows)) / self._checkpoint_bytes

  def _save(self, step: int, state_L: Any, driver: Any) -> None:
    started = time.perf_counter()
    self._checkpointer.save(step, checkpointing.training_tree(*driver.settled(state_L)))
    self._save_blocks_s.append(time.perf_counter() - started)
    if self._emulated_save:
      self._save_fractions.append(self._save_fraction(step, state_L))
      self._hold(self._emulated_save * self._save_fractions[-1], started)
    self.account.saves_s += time.perf_counter() - started
    self.checkpoint_steps.append(step)
    if self._ledger is not None:
      self._ledger.full_saved()

  def _save_priority(self, step: int, state_L: Any) -> None:
    started = time.perf_counter()
    rows_K = self._saver.save(step, restore.row_leaves(state_L))
    if self._emulated_save:
      self._hold(self._emulated_save * self._row_bytes(len(rows_K)) / self._checkpoint_bytes, started)
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
    changed = float(np.mean(np.asarray(state_L.row_steps) > (self._baseline_step or 0)))
    fraction = (changed * self._rows_bytes + self._checkpoint_bytes - self._rows_bytes) / self._checkpoint_bytes
    if self._baseline_step is None or changed >= self._config.recovery.rebaseline_fraction:
      self._baseline_step = step
      return 1.0
    return fraction

  def _save_cost_steps(self) -> float | None:
    if self._emulated_save:
      return self._emulated_save
    mean_step_s = self.account.mean_step_s()
    if not self._save_blocks_s or not mean_step_s:
      return None
    return float(np.mean(self._save_blocks_s)) / mean_step_s

  def _priority_interval(self) -> int | None:
    if self._saver is None:
      return None
    return self._priority_every or max(1, self._interval // 4)

  # Recovery.

  def _recover_fully(self, struck: list[failures.Failure], step: int, driver: Any) -> tuple[Any, Any, int]:
    """Everything reloads the newest checkpoint (one restore however many parts failed)."""
    started = time.perf_counter()
    tree, data = self._checkpointer.restore_latest(self._abstract)
    restored_step = data['step']
    state_L, sync_state_R = tree['train'], tree.get('sync')
    driver = self._restart_sync(driver, state_L, sync_state_R)
    self._hold(self._emulated_restore, started)
    seconds = time.perf_counter() - started
    self.account.restore_s += seconds
    for failure in struck:
      self._log(failure, step, restored_step, seconds, retrained_steps=step - restored_step)
    return state_L, driver, restored_step

  def _restart_sync(self, driver: Any, state_L: Any, sync_state_R: PyTree) -> Any:
    """The sync driver from the checkpoint's sync state: a shadow thread (and its round in flight and its own
    copy of the sync state) belongs to the lost run, so a new driver takes over; statistics add up."""
    driver.finish(state_L, abandon=True)
    if isinstance(driver, (foreground.NoSync, foreground.ForegroundSync)):
      driver.start(state_L, sync_state_R)
      return driver
    restarted = sync_drivers.RestartedSync(sync_drivers.make_driver(self._config, self._meshes), driver)
    restarted.start(state_L, sync_state_R)
    self._sync_restarts.append({'step': self._executed})
    return restarted

  def _recover_partially(self, failure: failures.Failure, step: int, state_L: Any) -> Any:
    """Only the failed part reloads the newest checkpoint (and, CPR, the newest priority save after it)."""
    started = time.perf_counter()
    self._checkpointer.wait()
    checkpoint = self._checkpointer.latest_step()
    priority = self._saver.latest() if self._saver is not None else None
    if priority is not None and priority[0] <= checkpoint:
      priority = None  # Older than the full checkpoint: nothing newer in it.
    failed_RxV = np.zeros((self._config.num_replicas, state_L.params['embedding'].shape[1]), bool)  # Padded rows.
    if failure.kind == 'embedding_shard':
      failed_RxV[:, failures.embedding_shard_rows(self._cardinalities, self._num_shards, failure.index)] = True
    else:
      failed_RxV[failure.index] = not self._shared_tables  # Shared tables live on: they lose nothing.
    state_L = self._reload(state_L, failure, checkpoint, failed_RxV, priority)
    jax.block_until_ready(state_L)
    if self._emulated_restore:
      fraction = (
        1 / self._config.num_replicas
        if failure.kind == 'replica'
        else self._row_bytes(int(failed_RxV[0].sum())) / self._checkpoint_bytes
      )
      self._hold(self._emulated_restore * fraction, started)
    seconds = time.perf_counter() - started
    self.account.restore_s += seconds
    failed_replicas, failed_rows = np.flatnonzero(failed_RxV.any(axis=1)), np.flatnonzero(failed_RxV.any(axis=0))
    failed_rows = failed_rows[failed_rows < sum(self._cardinalities)]  # Not the padding rows past the tables.
    lost_lookups = self._ledger.fail(failed_replicas, failed_rows)
    self._log(
      failure, step, checkpoint, seconds, priority_from=priority[0] if priority else None, lost_lookups=lost_lookups
    )
    return state_L

  def _reload(
    self,
    state_L: Any,
    failure: failures.Failure,
    checkpoint: int,
    failed_RxV: np.ndarray,
    priority: tuple[int, np.ndarray, dict[str, np.ndarray]] | None,
  ) -> Any:
    """The failed part's leaves read from the checkpoint through orbax's partial restore: a replica's slice of
    its train state, or the failed (replica, row) entries of the tables and accumulators; then the failed rows of
    the priority save."""
    if failure.kind == 'embedding_shard':
      restored = self._checkpointer.restore_partial(
        checkpoint, self._keep(lambda p: p in (restore.TABLE_PATH, restore.ACCUMULATOR_PATH))
      )
    else:
      restored = self._checkpointer.restore_partial(checkpoint, self._keep(self._replica_leaf))
      state_L = restore.with_replica(state_L, restored['train'], failure.index)
    if not failed_RxV.any():
      return state_L
    live = restore.row_leaves(state_L)
    if priority is None:
      priority_K, priority_values = np.zeros(0, np.int32), jax.tree.map(lambda x: x[:, :0], live)
    else:
      _, priority_K, priority_values = priority
    recovered = restore.recover_rows(
      live,
      jnp.asarray(failed_RxV),
      restore.row_leaves(restored['train']),
      jnp.asarray(priority_K),
      priority_values,
      jnp.asarray(failed_RxV[:, priority_K]),
    )
    return restore.with_row_leaves(state_L, restore.placed_like(recovered, live))

  def _warm_up(self, step: int, state_L: Any) -> None:
    """Opens the checkpoint readers and compiles the restore programs before the clock starts, as the train step
    is compiled before timing starts: a restore then costs what it costs in a running system. Under `cpr` both
    kinds are warmed up, then timed once more for the choice."""
    if self.mode == 'full' or self.requested_mode == 'cpr':
      self._checkpointer.restore_latest(self._abstract)
      started = time.perf_counter()
      jax.block_until_ready(self._checkpointer.restore_latest(self._abstract))
      self._warm_restore_s['full'] = time.perf_counter() - started
      if self.mode == 'full':
        return
    failure = failures.Failure(step, self._config.recovery.failure_target, 0)
    rows_lost = not (failure.kind == 'replica' and self._shared_tables)  # Whether a failure reloads table rows.
    failed_RxV = np.full((self._config.num_replicas, state_L.params['embedding'].shape[1]), rows_lost)
    self._reload(state_L, failure, step, failed_RxV, None)
    if self.requested_mode == 'cpr':
      one_part_RxV = np.zeros_like(failed_RxV)
      if failure.kind == 'embedding_shard':
        one_part_RxV[:, failures.embedding_shard_rows(self._cardinalities, self._num_shards, 0)] = True
      else:
        one_part_RxV[0] = rows_lost
      started = time.perf_counter()
      jax.block_until_ready(self._reload(state_L, failure, step, one_part_RxV, None))
      self._warm_restore_s['partial'] = time.perf_counter() - started
    if self._saver is not None:
      rows_K = np.zeros(self._saver.rows_per_save, np.int32)
      values = {
        name: np.zeros((x.shape[0], len(rows_K), *x.shape[2:]), x.dtype)
        for name, x in restore.row_leaves(state_L).items()
      }
      self._reload(state_L, failure, step, failed_RxV, (step, rows_K, values))

  def _replica_leaf(self, path: str) -> bool:
    """What a failed replica reloads: its whole train state but the step counter and the gather scratch, and with
    shared tables its MLP only (the table lives on, like a parameter server)."""
    if not path.startswith("['train']") or path == "['train'].step" or 'owner_scratch' in path:
      return False
    return not (
      self._shared_tables and (path == restore.TABLE_PATH or path.startswith("['train'].embedding_opt_state"))
    )

  def _keep(self, keep) -> PyTree:
    return checkpointing.keep_leaves(self._abstract, keep)

  def _log(self, failure: failures.Failure, position: int, restored_from: int, restore_s: float, **more: Any) -> None:
    self._failures.append(failure)
    self.failure_log.append(
      {**failure.to_dict(), 'position': position, 'restored_from': restored_from, 'restore_s': restore_s, **more}
    )
    print(f'Failure at {failure}; restored from the checkpoint at step {restored_from} ({self.mode} recovery).')

  # Costs.

  def _hold(self, cost_steps: float | None, started: float) -> None:
    """Emulation: sleeps until `cost_steps` mean step times have passed since `started` (once steps were timed)."""
    mean_step_s = self.account.mean_step_s()
    if cost_steps and mean_step_s:
      time.sleep(max(0.0, cost_steps * mean_step_s - (time.perf_counter() - started)))

  def _row_bytes(self, num_rows: int) -> float:
    """Bytes of `num_rows` rows of the tables and accumulators of every replica."""
    rows = [
      x
      for path, x in jax.tree_util.tree_flatten_with_path(self._abstract)[0]
      if jax.tree_util.keystr(path) in (restore.TABLE_PATH, restore.ACCUMULATOR_PATH)
    ]
    return sum(math.prod(x.shape) * x.dtype.itemsize / x.shape[1] for x in rows) * num_rows


def _next_multiple(step: int, every: int | None) -> int | None:
  return None if not every else (step // every + 1) * every
