"""Real failures: a process of the job dies (killed, crashed, hung) and the job comes back, fully or partially.

  recovery = real.RealFailures(config, meshes, workdir, total_steps)
  state_L, sync_state_R, step = recovery.resume(fresh)   # what the restart plan says to restore (`FreshState`)
  recovery.start(step, state_L, sync_state_R)
  for ...:
    ...
    recovery.at_boundary(b)                # b: the loop's `hooks.Boundary`; saves; a lost peer: save, exit
    recovery.next_due(step)                # a save, the calibration's end, a kill: a block ends there
  recovery.finish(step, state_L, driver.sync_state())                       # the final save
  recovery.summary()

Every process checkpoints its own part (`checkpointing`, no barrier) at its own pace, on step numbers shared by
all (every `interval` steps), and writes down in the job's history what it restored and when it lost a peer.
When a peer is lost (`distributed.peer_lost`, or a collective that failed), a process under partial recovery
first saves its live state (`live_state`: its train state and sync state of its last step, or of its newest host
copy when its devices are stuck), then every process exits with `exit_codes.PEER_LOST`, and whoever runs the job
(`supervisor`, or a cluster's restart loop) starts it again. Then all processes agree on what each restores
(`restart_plan`, through one exchange):
- `none` (no recovery configured): a resume from the newest checkpoints (a consistent cut for lock-step
  algorithms, each its own newest otherwise);
- `full`: the newest checkpoint all processes have; the data rewinds, the lost steps are trained again;
- `partial`, `cpr_mfu`, `cpr_ssu`: the survivors their live state, the dead process its newest checkpoint (and,
  CPR-MFU/SSU, the rows of its newest priority save newer than what it restored) and nobody rewinds: the steps the
  dead process missed are lost updates of its replicas, the PLS. With sharded tables a process's checkpoint and
  live state hold its own shards, so the dead process's shards alone go back (its priority rows are its shards'
  own, `priority_rows.HeldShards`), and every process goes on from the furthest position (their steps are
  collectives);
- `cpr`: CPR's first mechanism (`cost_model.choose`), decided once after `CALIBRATION_STEPS` steps from the costs
  every process measured, and kept by the history for the restarts.
Every blocking save, every completed checkpoint and every start that trains is written into the history, from which
`overhead` splits the job's cost as CPR does (`summary.json`: `recovery_checkpoint_overhead_pct`,
`recovery_restart_overhead_pct`). A restart that would restore a checkpoint older than one its process had
completed (the newer one deleted or unreadable since) raises `UnrecoverableError`: one clear error (exit status 3),
never a silent rewind.
Checkpoint intervals: `train.checkpoint_every_steps` under `none`, and `train.checkpoint_every_s` seconds (at the first
block boundary after; processes that step together need their checkpoints on common steps, so theirs turn the seconds
into steps once, after `CALIBRATION_STEPS` timed steps, at the slowest process's pace: one exchange); Young's
interval from the measured save cost and `recovery.mtbf_steps` (the expected MTBF) under `full`; the longest interval
under `recovery.target_pls` (the parts being the processes) under the partial modes; `recovery.checkpoint_every_steps`
where set.
"""

from collections.abc import Callable
import json
import pathlib
import time
from typing import Any

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np

from shadowsync_jax import hooks
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.model import table_placement
from shadowsync_jax.parallel import compilation_cache
from shadowsync_jax.parallel import control
from shadowsync_jax.parallel import cpu_time
from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import history
from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import cost_model
from shadowsync_jax.recovery import incremental
from shadowsync_jax.recovery import intervals
from shadowsync_jax.recovery import live_state
from shadowsync_jax.recovery import modes
from shadowsync_jax.recovery import overhead
from shadowsync_jax.recovery import priority_rows
from shadowsync_jax.recovery import restart_plan
from shadowsync_jax.recovery import restore

PyTree = Any
CALIBRATION_STEPS = 20  # Steps timed before a measured save cost sets an interval (and `cpr` chooses).
RECALIBRATE_EVERY = 8  # Full recovery's interval again from the mean blocking of a start's checkpoints, so often.
LIVE_MODES = (*modes.PARTIAL_MODES, 'cpr')  # Whose survivors keep their live state.
_PER_PROCESS_CHECKPOINT_KEYS = (
  'checkpoint_saves',
  'checkpoint_baselines',
  'checkpoint_bytes_written',
  'checkpoint_blocked_s',
  'incremental',
)


class UnrecoverableError(RuntimeError):
  """What this process's restart needs is gone: a checkpoint the job wrote is missing, or cannot be read."""


class RealFailures(hooks.Hook):
  """Checkpoints, the restart plan and the exit on a lost peer, for one process of a job (any number of them)."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    meshes: replicas.ReplicaMeshes,
    workdir: str | pathlib.Path,
    total_steps: int,
    warmup_steps: int = 0,
  ):
    """`warmup_steps`: a start's steps before the loop runs at its pace (its compiling block and 'auto''s probe):
    where they end, a `paced` record (`overhead`: a restart lasts until then)."""
    recovery = config.recovery
    self._warmup_steps, self._paced, self._hooks_at_ready = warmup_steps, False, 0.0
    self.requested_mode = recovery.mode
    self._config, self._meshes, self._workdir, self._total_steps = config, meshes, pathlib.Path(workdir), total_steps
    self._process, self._processes = jax.process_index(), jax.process_count()
    self._generation = control.generation()
    self._writer = f'process_{self._process}'
    algorithm = config.sync.algorithm
    # Processes that step together (a collective every step or every k) restore a common cut after a restart.
    sharded = config.sync.embedding_placement == 'sharded'
    self._lock_step = algorithm == 'sync_sgd' or algorithm.startswith('fr_') or sharded
    self._choice: cost_model.Choice | None = None
    self.mode = self._decided_mode()
    self._checkpointer: checkpointing.Checkpointer | incremental.IncrementalCheckpointer | None = None  # `resume`.
    self._live = None
    if self.requested_mode in LIVE_MODES:
      self._live = live_state.LiveKeeper(  # Its copy rate: set in `start`.
        self._workdir / 'live' / self._writer, max_overhead=config.recovery.live_max_overhead
      )
    self._interval = self._configured_interval()
    # Seconds between checkpoints, where every process must save at the same steps: turned into steps once timed.
    self._seconds_need_steps = bool(
      self.requested_mode == 'none' and config.train.checkpoint_every_s and self._lock_step and self._processes > 1
    )
    self._seconds_in_steps = False
    self._saver: priority_rows.PrioritySaver | None = None
    # CPR-MFU/SSU: steps between priority saves once their cost is known (`_pace_priority_saves`); the job's,
    # written down by process 0, where the processes step together.
    paced = history.latest(self._workdir, 'priority_pace') if self._lock_step else None
    self._priority_every: int | None = paced['every'] if paced else None
    self._control = control.ControlPipe.from_environment()
    self._saved: list[int] = []  # Steps of this generation's saves, in order.
    self._timing: tuple[float, int] | None = None  # (time, step) once the first step has run.
    self._blocked_s = 0.0  # This start's time blocked on saves (`_saved_for`).
    self._unconfirmed: int | None = None  # A checkpoint being written (`_save`).
    self._step_s: float | None = None  # This start's mean step time without its saves (`finish`).
    self._restored: dict[str, Any] = {}
    self._last_save_s = 0.0  # When `_save` last started.
    self._save_costs: list[float] = []  # This start's checkpoints' blocking, compiles left out (`_recalibrate`).

  # The restart plan.

  def resume(self, fresh: checkpointing.FreshState) -> tuple[Any, PyTree, int]:
    """Restores what the restart plan gives this process (`fresh()`, built only then, on a fresh workdir); returns
    the state, the sync state (job-wide, as the sync drivers hold it) and the step the stream goes on from."""
    distributed.report(0, 'setup')
    abstract = fresh.abstract()
    self._checkpointer = self._make_checkpointer(memory.state_bytes(abstract), lambda: self._initial_tree(fresh))
    if self._live is not None and isinstance(self._checkpointer, incremental.IncrementalCheckpointer):
      self._live.use_differentials(self._checkpointer)  # Its copies: the rows changed since the baseline.
    reached = history.positions_reached(self._workdir, self._generation - 1) if self._generation else {}
    live_steps = self._live.steps() if self._live is not None else []
    mine = restart_plan.Holdings(tuple(self._checkpointer.all_steps()), tuple(live_steps), reached)
    everyone = [restart_plan.Holdings.from_json(h) for h in distributed.exchange('holdings', mine.to_json())]
    plan = restart_plan.plan(self._plan_mode(), self._lock_step, everyone)
    source, restored_step = plan.restore[self._process]
    position = plan.position[self._process]
    self._check_nothing_went_missing(source, mine.checkpoints)
    if self._plan_mode() == 'full' or (self._plan_mode() == 'none' and self._lock_step):
      self._checkpointer.delete_after(restored_step)  # Everyone went back to a common cut: past it, a lost timeline.
      if source == 'checkpoint':  # Every process restores it: no later plan can go back past it.
        self._checkpointer.delete_before(restored_step)  # (Left to later saves, a run that fails more often than
        self._saved = [restored_step]  # each process saves twice kept them all: 6 x 1.1 GB a process at Kaggle size.)
    if source == 'init':
      tree = self._initial_tree(fresh)
      if isinstance(self._checkpointer, incremental.IncrementalCheckpointer):
        self._checkpointer.note_initial(tree)  # The differentials over it say which initial state they need.
    started = time.perf_counter()
    if source == 'live':
      try:
        tree = self._live.restore(restored_step, abstract)
      except checkpointing.MismatchError as error:  # Another run's state: say so.
        raise UnrecoverableError(str(error)) from error
    elif source == 'checkpoint':
      try:
        tree, _ = self._checkpointer.restore(restored_step, abstract)
      except checkpointing.MismatchError as error:  # Another run's checkpoint: say so, not "damaged".
        raise UnrecoverableError(str(error)) from error
      except Exception as error:  # pylint: disable=broad-except  (whatever a truncated or damaged file raises)
        raise UnrecoverableError(
          f'process {self._process} cannot read its checkpoint of step {restored_step} in '
          f'{self._checkpointer.directory} (truncated or damaged?): {type(error).__name__}: {str(error)[:300]}'
        ) from error
    state_L, sync_state_L = tree['train'], tree.get('sync')
    priority_step = None
    if self.mode in ('cpr_mfu', 'cpr_ssu') and position > restored_step:  # Its rows saved since, if any.
      state_L, priority_step = self._newer_priority_rows(state_L, restored_step, position)
    if position != restored_step:  # The replicas go on from the new position: their step counters too.
      counters = np.full(state_L.step.shape, position, state_L.step.dtype)
      state_L = state_L._replace(step=jax.device_put(counters, state_L.step.sharding))
    sync_state_L = self._agreed_sync_state(sync_state_L, plan)
    jax.block_until_ready((state_L, sync_state_L))
    sync_state_R = None if sync_state_L is None else replicas.to_job(sync_state_L, self._meshes)
    restore_s = time.perf_counter() - started
    self._restored = {
      'checkpoints_kept': self._checkpointer.all_steps(),  # On disk after the plan's deletions.
      'restored': source,
      'restored_step': restored_step,
      'position': position,
      'restore_s': restore_s,
      'priority_rows_step': priority_step,  # CPR-MFU/SSU: the step of the newer priority save restored, if any.
      'skipped_steps': plan.skipped(self._process),
      # Where the data rewinds (full recovery), the steps this process had trained past its restore are trained again.
      'retrained_steps': max(0, reached.get(self._process, position) - position),
    }
    history.append(
      self._workdir,
      self._writer,
      {'event': 'start', 'generation': self._generation, 'process': self._process, **self._restored},
    )
    if self._processes == 1 and source == 'checkpoint' and not self._generation:
      print(f'Resumed from the checkpoint at step {restored_step} of {self._total_steps} in {self._workdir}.')
    elif source != 'init' or self._generation:
      what = {'live': 'its live state', 'checkpoint': 'its checkpoint', 'init': 'the initial state'}[source]
      print(
        f'Process {self._process} restored {what} of step {restored_step}; its stream goes on at step {position} '
        f'({self._plan_mode()} plan, start {self._generation + 1}).'
      )
    if self.mode in ('cpr_mfu', 'cpr_ssu'):
      self._saver = self._make_saver(state_L)
    return state_L, sync_state_R, position

  def start(self, step: int, state_L: Any, sync_state_R: PyTree) -> None:
    if self._live is not None:
      self._live.pace_for(checkpointing.training_tree(state_L, self._local(sync_state_R)))
    # Only a live state is worth waiting for a boundary: otherwise a survivor stuck in a collective goes at once.
    keeps_live = self._live is not None and self.mode in LIVE_MODES
    distributed.handle_peer_loss(True, last_resort=self._stop_stuck, boundary_matters=keeps_live)
    distributed.report(step, 'setup')
    if self._control.due_at_start(step):  # It waited at its kill step when the job went down: the kill lands now.
      self._control.ready()  # (The launcher kills once every process trains: the peers' first boundaries.)
      self._control.step(step)
      self._control.reached(step, stop_waiting=lambda: distributed.peer_lost() is not None)
      self._stop_for_a_lost_peer(step, state_L, self._local(sync_state_R), distributed.peer_lost())

  # The loop.

  def waits_for(self, b: hooks.Boundary) -> bool:
    return self._waits_for_step(b.step)

  def _waits_for_step(self, step: int) -> bool:
    """Whether the block that ends at `step` must be done before its boundary: the one the launcher kills at (it
    tells the launcher it got there, and a kill must find that step trained). Elsewhere one block stays in flight, as
    in one process, and the steps reported (to the peers, the launcher and the restart plan) are the trained ones, a
    block behind (`at_boundary`'s `trained`). (Waiting for every block in a job of several processes left the
    devices idle through the host's work at each boundary: a 2 x 4 job ran at 0.72-0.82 of its step.) Where the
    steps are collectives of the job (sync SGD, sharded tables), every block: one in flight when a peer dies never
    ends, and the state a survivor saves then must be one that did."""
    if self._lock_step and self._processes > 1:
      return True
    return self._control.fd is not None and step == self._control.kill_at_step

  def next_due(self, step: int) -> int | None:
    """The first step after `step` at whose boundary something is due: a kill asked for, the calibration's end, a
    checkpoint, a priority save (the same on every process that has the same config and history)."""
    dues = [self._control.kill_at_step]
    if self._needs_calibration() and self._timing is not None:
      dues.append(self._timing[1] + CALIBRATION_STEPS)
    if self._interval:
      dues.append((step // self._interval + 1) * self._interval)
    if self._saver is not None:
      every = self._priority_interval()
      dues.append((step // every + 1) * every)
    return min((due for due in dues if due is not None and due > step), default=None)

  def at_boundary(self, b: hooks.Boundary) -> None:
    """After a block of `b.steps` data steps that ends at `b.step` (`b.block`: its batches [L, K, B, ...];
    `b.trained`: the last step known trained, `b.step` if the loop waited for the block): a lost peer ends the
    process here (after saving the live state); otherwise the checkpoint and priority save due, and a kill the
    launcher was asked for."""
    self._at_boundary(b.step, b.state, b.steps, b.block, b.driver, b.trained)

  def _at_boundary(self, step: int, state_L: Any, steps: int, block: Batch, driver: Any, trained: int) -> None:
    self._stop_if_a_peer_is_lost(step, state_L, driver)
    if self._waits_for_step(step):  # The loop has waited for it already; a safeguard here.
      jax.block_until_ready(state_L.step)
      trained = step
    if self._timing is None:
      self._timing = (time.perf_counter(), step)  # The first step compiled: the clock starts after it.
      cpu_time.name_os_threads()  # The launcher reads their CPU by name (`cpu_time`); at each save, the newer.
      self._hooks_at_ready = self._hooks_s()
      self._control.ready()
      history.append(self._workdir, self._writer, {'event': 'ready', 'generation': self._generation, 'step': step})
    if not self._paced and step - self._timing[1] >= self._warmup_steps - 1:  # (The ready step was the first one.)
      self._paced = True
      record = {'event': 'paced', 'generation': self._generation, 'process': self._process, 'step': step}
      # Its saves' and live copies' time since it was ready: their own parts (`overhead`), not the warm-up's.
      history.append(self._workdir, self._writer, {**record, 'hooks_s': self._hooks_s() - self._hooks_at_ready})
    distributed.report(trained, 'train', checkpoint=self._saved[-2] if len(self._saved) > 1 else None)
    if self._saver is not None:
      self._saver.count(block.sparse[:, :steps])
    if self._live is not None:
      self._live.at_boundary(step, lambda: checkpointing.training_tree(*self._settled(state_L, driver)))
    steps_timed = step - self._timing[1]
    if self._needs_calibration() and steps_timed >= CALIBRATION_STEPS:
      if self.requested_mode == 'none':  # Only the pace is needed: seconds between checkpoints as common steps.
        self._seconds_to_steps(step)
      else:
        self._calibrate(step, state_L, driver)
    elif (self._interval and step % self._interval == 0) or self._save_due_by_time():
      self._save(step, *self._settled(state_L, driver))
    elif self._saver is not None and step % self._priority_interval() == 0:
      if not self._saver.due():  # The last one is still being written, or its cost is over budget: skipped.
        history.append(
          self._workdir, self._writer, {'event': 'priority_skipped', 'step': step, 'process': self._process}
        )
      else:
        started, threads_s = time.perf_counter(), self._saver.last_cost_s  # The save before: done (`due`).
        self._saver.save(step, restore.row_leaves(state_L))
        self._saved_for(step, 'priority', time.perf_counter() - started, previous_threads_s=threads_s)
    if self._unconfirmed is not None and not self._checkpointer.saving():
      record = {'event': 'saved', 'generation': self._generation, 'process': self._process}
      history.append(self._workdir, self._writer, {**record, 'step': self._unconfirmed, 'complete': self._unconfirmed})
      self._unconfirmed = None
    # Lost during this boundary's work: this step's state, read now, before the next block is dispatched (where its
    # steps are collectives, it would never end).
    self._stop_if_a_peer_is_lost(step, state_L, driver)
    self._control.step(trained)
    self._control.reached(trained, stop_waiting=lambda: distributed.peer_lost() is not None)
    self._stop_if_a_peer_is_lost(step, state_L, driver)  # Lost while it waited for its kill: a survivor after all.

  def on_error(self, error: BaseException, step: int, state_L: Any, driver: Any) -> None:
    """An exception in the loop: if it is a collective that lost its partner, save what survives and exit (never
    returns then); otherwise returns, and the error goes on."""
    if distributed.active() and distributed.looks_like_a_lost_peer(error):
      self._stop_for_a_lost_peer(step, *self._settled(state_L, driver), f'a collective failed: {str(error)[:200]}')

  def finish(self, step: int, state_L: Any, sync_state_R: PyTree) -> None:
    """After the last step: the final save (this process's part), waited for."""
    self._step_s = self._mean_step_s(step)
    if self._step_s is None:  # This start trained nothing (its restore was the end): the pace an earlier one saw.
      paces = [r['step_s'] for r in history.read(self._workdir) if r.get('event') == 'save' and r.get('step_s')]
      self._step_s = paces[-1] if paces else None
    distributed.handle_peer_loss(False)  # The loop reported 'finish' before the rounds ended.
    self._checkpointer.save(step, checkpointing.training_tree(state_L, self._local(sync_state_R)))
    self.close()
    record = {'event': 'ended', 'generation': self._generation, 'process': self._process, 'step': step}
    history.append(self._workdir, self._writer, {**record, **self._accounts()})

  def _hooks_s(self) -> float:
    """Seconds this start's saves blocked the loop and its live copies took of the training core, so far."""
    return self._blocked_s + (self._live.spent_s if self._live is not None else 0.0)

  def _accounts(self) -> dict[str, float]:
    """What this start spent so far on the training core outside the steps and the saves' blocking that only it
    can tell (`overhead`: the launcher reads the threads' CPU): its live copies' takes."""
    return {'live_s': self._live.spent_s} if self._live is not None else {}

  def close(self) -> None:
    self._checkpointer.close()
    if self._saver is not None:
      self._saver.close()

  def summary(self) -> dict[str, Any]:
    """What summary.json gains: the mode (and what `cpr` chose), the interval, the job's failures and restores
    from its history, the expected and actual PLS."""
    job = history.summarize(self._workdir, self._total_steps, self._processes)
    estimated_pls = None
    if self.mode in modes.PARTIAL_MODES and self._interval:
      estimated_pls = intervals.expected_pls(
        self._interval, self._config.recovery.mtbf_steps, self._processes, self._total_steps
      )
    details = {'failures_are': 'real', 'generation': self._generation, 'this_process': self._restored, **job}
    checkpoint_pct = restart_pct = None
    if self._step_s and self.requested_mode != 'none':
      # As far as the history goes now: the launcher writes this start's threads' CPU (its background writes,
      # priority saves and live copies' thread) once it ended, so they are not in it (the studies split the job's
      # whole history after it: `studies.real_failures`).
      costs = overhead.split(history.read(self._workdir), self._step_s)
      failure_free_s = self._total_steps * self._step_s  # The steps' own time: the run without failures or saves.
      checkpoint_pct = 100 * costs['checkpoint_s'] / failure_free_s
      restart_pct = 100 * costs['restart_s'] / failure_free_s
      details['overhead_s'] = {**costs, 'failure_free_s': failure_free_s, 'step_s': self._step_s}
    if self._choice is not None:
      details['cpr_choice'] = self._choice.to_dict()
    if self.requested_mode == 'none' and not job['num_restarts']:
      details = None  # Nothing failed and nothing was asked: no details.
    stats = self._checkpointer.stats()
    everyone = distributed.exchange('checkpoint_stats', {key: stats[key] for key in _PER_PROCESS_CHECKPOINT_KEYS})
    return {
      'recovery_mode': self.requested_mode,
      'recovered_as': self.mode,
      'num_failures': job['num_failures'],
      'recovery_overhead_pct': None,  # Wall clock across restarts: the supervisor's figure (benchmarks.real_failures).
      # CPR's split (`overhead`), as % of the steps' own time: blocking saves + restores + work trained again, and
      # the restarts (from each death to every process training again, restores left out).
      'recovery_checkpoint_overhead_pct': checkpoint_pct,
      'recovery_restart_overhead_pct': restart_pct,
      'estimated_pls': estimated_pls,
      'actual_pls': job['actual_pls'],  # Of every partial restart (none under full recovery).
      'checkpoint_interval_steps': self._interval,
      'checkpoints': stats,  # This process's: saves (blocking or not) and restores, timed.
      # Every process's, in process order: whole saves (baselines), all saves, bytes written, seconds blocked.
      **{key: [s[key] for s in everyone] for key in _PER_PROCESS_CHECKPOINT_KEYS},
      'recovery': details,
    }

  def _initial_tree(self, fresh: checkpointing.FreshState) -> PyTree:
    """The training tree this process starts from when nothing is restored, built now (the same, bit for bit, at
    every start: from the config's seed)."""
    state_L, sync_state_R = fresh()
    return checkpointing.training_tree(state_L, self._local(sync_state_R))

  def _make_checkpointer(
    self, state_bytes: int, initial: Callable[[], PyTree]
  ) -> checkpointing.Checkpointer | incremental.IncrementalCheckpointer:
    """This process's checkpoints: whole, or incremental (`recovery.incremental`; the first baseline the `initial`
    tree, rebuilt and never written), keeping what a restart may need: everything a common cut may need under full
    recovery, `cpr` and lock-step algorithms; else the two newest."""
    directory, keep = self._workdir / 'checkpoints', None if self._keeps_cuts() else 2
    # Kills at a save (tests): inside its write, so they land in it every time.
    kills_at = self._control.fd is not None and self._control.kill_at_step
    during = self._kill_in_write if kills_at or fault_injection.kills_in_saves() else None
    if not incremental.enabled(self._config, saves_block=checkpointing.saves_block(state_bytes)):
      return checkpointing.Checkpointer(directory, self._meshes, max_to_keep=keep, during_save=during)
    full = checkpointing.Checkpointer(directory, self._meshes, max_to_keep=None, during_save=during)
    fraction = self._config.recovery.rebaseline_fraction
    return incremental.IncrementalCheckpointer(
      full,
      self._meshes,
      fraction,
      keep=keep,
      initial=initial,
      settings=_settings(self._config),
      during_write=during,
    )

  def _kill_in_write(self, step: int) -> None:
    """Inside a save's write (not complete yet): a kill point of this save (`fault_injection.kill_in_save`), or the
    launcher's kill at `step`, asked for and waited for (a peer's death first: the save goes on, this process a
    survivor)."""
    fault_injection.kill_in_save(step, 'writing')
    if step == self._control.kill_at_step:
      self._control.step(step)  # Trained (the save waited for it): the launcher's record of where it died.
    self._control.reached(step, stop_waiting=lambda: distributed.peer_lost() is not None)

  # Modes and intervals.

  def _decided_mode(self) -> str:
    """The mode in force: `cpr` recovers partially until it chose, and keeps its choice across restarts."""
    if self.requested_mode != 'cpr':
      return self.requested_mode
    choice = history.latest(self._workdir, 'cpr_choice')
    if choice is None:
      return 'cpr_mfu'
    self._choice = cost_model.Choice(**choice['choice'])
    return 'cpr_mfu' if self._choice.mode == 'partial' else 'full'

  def _plan_mode(self) -> str:
    return 'partial' if self.mode in modes.PARTIAL_MODES else self.mode

  def _configured_interval(self) -> int | None:
    """The checkpoint interval known before any step runs; None: measured first (`_calibrate`)."""
    recovery = self._config.recovery
    if self.requested_mode == 'none':
      return self._config.train.checkpoint_every_steps or None
    if recovery.checkpoint_every_steps:
      return recovery.checkpoint_every_steps
    calibrated = history.latest(self._workdir, 'calibration')
    if calibrated is not None and (self.mode == 'full' or self._choice is not None):
      return calibrated['interval']
    if self.mode == 'full':
      return None
    return self._partial_interval()

  def _partial_interval(self) -> int:
    recovery = self._config.recovery
    try:
      return intervals.partial_recovery_interval(
        recovery.target_pls, recovery.mtbf_steps, self._processes, self._total_steps
      )
    except ValueError:  # Unreachable (validated away but under `cpr`, which then chooses full).
      return 1

  def _needs_calibration(self) -> bool:
    if self.requested_mode == 'cpr':
      return self._choice is None
    if self.requested_mode == 'none':
      return self._seconds_need_steps and not self._seconds_in_steps
    return self._interval is None and self.mode == 'full'

  def _seconds_to_steps(self, step: int) -> None:
    """`train.checkpoint_every_s` as a common interval in steps for processes that step together: the seconds at
    the slowest process's mean step time (one exchange), or `train.checkpoint_every_steps` where that is shorter."""
    step_s = max(1e-9, *distributed.exchange('checkpoint_step_s', self._mean_step_s(step)))
    steps = max(1, round(self._config.train.checkpoint_every_s / step_s))
    self._interval = min(steps, self._interval or steps)
    self._seconds_in_steps = True

  def _calibrate(self, step: int, state_L: Any, driver: Any) -> None:
    """Measures a save (under `cpr` a restore too) with nothing in flight, and agrees with every process on the
    interval (and, under `cpr`, the mode): one exchange; process 0 writes the outcome into the history for the
    restarts."""
    jax.block_until_ready(state_L)  # The steps dispatched so far are done: theirs is the steps' time.
    mean_step_s = self._mean_step_s(step)  # The steps' own pace: the loop's saves before this one left out.
    self._checkpointer.wait()
    started = time.perf_counter()
    tree = checkpointing.training_tree(*self._settled(state_L, driver))
    with compilation_cache.compiling() as compiled:  # Once a run (a differential's gather): left out of the costs.
      self._checkpointer.save(step, tree)
    save_s = time.perf_counter() - started
    self._checkpointer.wait()
    write_s = time.perf_counter() - started
    restore_s = 0.0  # Only `cpr` weighs a restore (its choice); elsewhere it would cost as much again for nothing.
    if self.requested_mode == 'cpr':
      started = time.perf_counter()
      jax.block_until_ready(self._checkpointer.restore(step, checkpointing.abstract_like(tree)))
      restore_s = time.perf_counter() - started
    self._saved.append(step)
    self._saved_for(step, 'calibration', write_s + restore_s, complete=step)  # Written and read back: complete.
    once = compiled.seconds
    measured = {'step_s': mean_step_s, 'save_s': save_s - once, 'write_s': write_s - once, 'restore_s': restore_s}
    costs = distributed.exchange('calibration', measured)
    worst = {key: max(c[key] for c in costs) for key in measured}  # The job goes at its slowest process's pace.
    save_steps, restore_steps = worst['save_s'] / worst['step_s'], worst['restore_s'] / worst['step_s']
    recovery = self._config.recovery
    write_steps = int(np.ceil(worst['write_s'] / worst['step_s']))
    full_interval = max(write_steps, intervals.young_interval_steps(save_steps, recovery.mtbf_steps, self._total_steps))
    if self.requested_mode == 'cpr':
      self._choice = cost_model.choose(
        save_steps,
        restore_steps,
        restore_steps,  # A dead process restores its whole part either way.
        recovery.mtbf_steps,
        self._processes,
        recovery.target_pls,
        self._total_steps,
        min_full_interval_steps=write_steps,
      )
      self.mode = 'cpr_mfu' if self._choice.mode == 'partial' else 'full'
      self._interval = self._partial_interval() if self._choice.mode == 'partial' else self._choice.full_interval_steps
      if self._choice.mode == 'full' and self._saver is not None:
        self._saver.close()
        self._saver = None
      print(f'cpr: {self._choice.why}')
    else:
      self._interval = full_interval
    if self._process == 0:
      differential = self._checkpointer.last_save.get('kind') == 'differential'  # Then no recalibration.
      record = {'event': 'calibration', 'interval': self._interval, 'costs': worst, 'differential': differential}
      history.append(self._workdir, 'process_0', record)
      if self._choice is not None:
        history.append(self._workdir, 'process_0', {'event': 'cpr_choice', 'choice': self._choice._asdict()})

  def _recalibrates(self) -> bool:
    """Whether full recovery's own interval is due to be computed again: every `RECALIBRATE_EVERY` checkpoints of a
    start (the same saves on every process: they save at the same steps)."""
    if self.mode != 'full' or self._config.recovery.checkpoint_every_steps or not self._interval:
      return False
    return len(self._save_costs) % RECALIBRATE_EVERY == 0

  def _recalibrate(self, blocking_s: float) -> None:
    """Young's interval again from the mean blocking of this start's checkpoints, `blocking_s`: the calibration's
    one save cannot stand for them (it comes early, when few rows changed, with a restart's standby starting beside
    it; differentials grow with the interval, and a baseline now and then blocks seconds). One exchange at this
    common save step; process 0 writes it down."""
    step = self._saved[-1]
    measured = {'save_s': blocking_s, 'step_s': self._mean_step_s(step)}
    costs = distributed.exchange(f'recalibration/{step}', measured)  # A name a start uses once.
    worst = {key: max(c[key] or 0.0 for c in costs) for key in measured}
    if not worst['step_s']:
      return
    self._interval = intervals.young_interval_steps(
      worst['save_s'] / worst['step_s'], self._config.recovery.mtbf_steps, self._total_steps
    )
    if self._process == 0:
      incremental = self._checkpointer.last_save.get('kind') in ('differential', 'baseline')
      record = {'event': 'calibration', 'interval': self._interval, 'costs': worst, 'differential': incremental}
      history.append(self._workdir, 'process_0', {**record, 'step': step, 'saves': len(self._save_costs)})

  # Saves.

  def _save_due_by_time(self) -> bool:
    """`train.checkpoint_every_s` (no recovery configured): a save at the first boundary that long after the last
    (or after the first step); never a block cut (any boundary will do)."""
    every_s = self._config.train.checkpoint_every_s
    if not every_s or self.requested_mode != 'none' or self._timing is None or self._seconds_need_steps:
      return False
    return time.perf_counter() - max(self._timing[0], self._last_save_s) >= every_s

  def _save(self, step: int, state_L: Any, sync_state_L: PyTree) -> None:
    # The steps dispatched before the save are the steps' time, not the save's (one process never waits for them
    # at a boundary).
    jax.block_until_ready((state_L, sync_state_L))
    started = time.perf_counter()
    self._last_save_s = started
    with compilation_cache.compiling() as compiled:
      self._checkpointer.save(step, checkpointing.training_tree(state_L, sync_state_L))
    fault_injection.kill_in_save(step, 'written', first=self._checkpointer.wait)  # (Tests.)
    written = {
      'written': self._checkpointer.last_save.get('kind'),
      'bytes_written': self._checkpointer.last_save.get('bytes'),
      # Embedding rows written (a whole save: all), and held: this process's rows over its devices.
      'rows_written': self._checkpointer.last_save.get('rows', int(state_L.row_steps.size)),
      'rows_held': int(state_L.row_steps.size),
    }
    self._saved_for(step, 'checkpoint', time.perf_counter() - started, complete=self._newest_complete(step), **written)
    self._saved.append(step)
    self._unconfirmed = step  # Written down as complete once written (`at_boundary`).
    self._save_costs.append(time.perf_counter() - started - compiled.seconds)  # A gather compiles once a start.
    if self._recalibrates():
      self._recalibrate(sum(self._save_costs) / len(self._save_costs))
    if self._saver is not None and not self._config.recovery.priority_every_steps:
      self._pace_priority_saves(step)
    if self._keeps_cuts():  # Drop what no consistent cut can need any more (orbax keeps everything here).
      oldest_needed = min([self._saved[-2] if len(self._saved) > 1 else 0] + self._peer_checkpoints())
      self._checkpointer.delete_before(oldest_needed)

  def _keeps_cuts(self) -> bool:
    """Whether a restart may need a checkpoint older than this process's newest (a consistent cut of the job: full
    recovery, `cpr` before and after its choice, processes that step together); else orbax keeps the two newest."""
    return self.mode == 'full' or self.requested_mode == 'cpr' or self._lock_step

  def _newest_complete(self, step: int) -> int | None:
    """This process's newest complete checkpoint before `step` (`step`'s own save may still be written)."""
    return max((s for s in self._checkpointer.all_steps() if s < step), default=None)

  def _saved_for(self, step: int, kind: str, blocking_s: float, complete: int | None = None, **written: Any) -> None:
    """Writes down the time the loop was blocked on a save (CPR's checkpoint-related overhead: `overhead`), the
    pace so far (for a summary whose own start trains nothing), and what a checkpoint wrote (`written`)."""
    self._blocked_s += blocking_s
    cpu_time.name_os_threads()
    record = {'event': 'save', 'generation': self._generation, 'process': self._process, 'step': step, 'kind': kind}
    record.update(blocking_s=blocking_s, step_s=self._mean_step_s(step), complete=complete, **written)
    record.update(self._accounts())
    history.append(self._workdir, self._writer, record)

  def _mean_step_s(self, step: int) -> float | None:
    """This start's mean step time so far, its saves left out (None before two steps)."""
    if self._timing is None or step <= self._timing[1]:
      return None
    return max(0.0, time.perf_counter() - self._timing[0] - self._blocked_s) / (step - self._timing[1])

  def _peer_checkpoints(self) -> list[int]:
    return [status['checkpoint'] or 0 for status in distributed.peer_status().values()]

  def _priority_interval(self) -> int:
    return self._config.recovery.priority_every_steps or self._priority_every or self._least_priority_interval()

  def _least_priority_interval(self) -> int:
    return max(1, (self._interval or 4) // 4)

  def _pace_priority_saves(self, step: int) -> None:
    """At each checkpoint, once a priority save's cost is known (its ranking and writing, in threads): priority saves
    from now on every as many steps as keep the costliest process's within `recovery.priority_max_overhead` of the
    time at the slowest pace so far, never more often than a quarter interval. Where the processes step together,
    one exchange (they cut their blocks at the same steps) and process 0 writes a new pace down for the restarts.
    Before it, a saver that could not keep up skipped its turns, each of which cut a block: at Criteo Kaggle's size
    blocks of 4 steps, and 494 of 528 turns skipped in a CPR-MFU run."""
    measured = {'cost_s': self._saver.last_cost_s, 'step_s': self._mean_step_s(step) or 0.0}
    everyone = (
      distributed.exchange(f'priority_pace/{self._generation}/{step}', measured) if self._lock_step else [measured]
    )
    cost_s, step_s = max(m['cost_s'] for m in everyone), max(m['step_s'] for m in everyone)
    if not (cost_s > 0 and step_s > 0):
      return  # No priority save timed yet: at the next checkpoint.
    budget, least = self._config.recovery.priority_max_overhead, self._least_priority_interval()
    every = intervals.budget_interval_steps(cost_s, step_s, budget, least)
    if every != self._priority_every and self._lock_step and self._process == 0:
      record = {'event': 'priority_pace', 'step': step, 'every': every, 'cost_s': cost_s, 'step_s': step_s}
      history.append(self._workdir, 'process_0', record)
    self._priority_every = every

  def _make_saver(self, state_L: Any) -> priority_rows.PrioritySaver:
    recovery = self._config.recovery
    shards = None
    if self._config.sync.embedding_placement == 'sharded':
      num_rows, num_local = int(sum(self._config.data.cardinalities)), self._meshes.local.shape[replicas.REPLICA_AXIS]
      shards = priority_rows.HeldShards(
        table_placement.ShardLayout(num_rows, self._config.num_replicas),
        first=self._process * num_local,
        count=num_local,
        rows_held=table_placement.rows_held('sharded', num_rows, self._config.num_replicas),
      )
    return priority_rows.PrioritySaver(
      self._priority_directory(),
      [int(c) for c in self._config.data.cardinalities],
      recovery.priority_fraction,
      sample_rate=recovery.ssu_sample_rate if self.mode == 'cpr_ssu' else None,
      seed=self._config.seed,
      shards=shards,
      max_bytes=recovery.priority_max_bytes,
      bytes_per_row=restore.bytes_per_row(state_L),
      max_overhead=0.0 if recovery.priority_every_steps else recovery.priority_max_overhead,
    )

  def _priority_directory(self) -> pathlib.Path:
    return self._workdir / 'priority_rows' / self._writer

  def _newer_priority_rows(self, state_L: Any, checkpoint_step: int, position: int) -> tuple[Any, int | None]:
    """The rows of this process's newest priority save newer than its checkpoint (and not past `position`) over
    the restored ones, and that save's step (None: none newer): CPR-MFU/SSU's gain for a process that died."""
    saved = priority_rows.read_latest(self._priority_directory())
    if saved is None or not checkpoint_step < saved[0] <= position:
      return state_L, None
    step, rows, values = saved
    live = restore.row_leaves(state_L)
    if rows.ndim == 1:  # Replicated tables: the same rows of every replica's table.
      rows = np.broadcast_to(rows, (state_L.step.shape[0], rows.shape[0]))
    recovered = restore.write_rows_per_replica(live, jnp.asarray(rows), values)
    state_L = restore.with_row_leaves(state_L, restore.placed_like(recovered, live))
    # Rows written outside a step: stamped, so that the next incremental checkpoint holds them.
    stamps = incremental.stamp_rows(state_L.row_steps, jnp.asarray(rows), jnp.int32(position))
    return state_L._replace(row_steps=jax.device_put(stamps, state_L.row_steps.sharding)), step

  def _local(self, sync_state_R: PyTree) -> PyTree:
    """This process's copies of the job-wide sync state (what its checkpoints hold)."""
    return None if sync_state_R is None else replicas.to_local(sync_state_R, self._meshes)

  def _settled(self, state_L: Any, driver: Any) -> tuple[Any, PyTree]:
    """The pair to save now (`SyncDriver.settled`: no round half landed), with this process's sync state."""
    state_L, sync_state_R = driver.settled(state_L)
    return state_L, self._local(sync_state_R)

  # A lost peer.

  def _stop_if_a_peer_is_lost(self, step: int, state_L: Any, driver: Any) -> None:
    if (reason := distributed.peer_lost()) is not None:
      self._stop_for_a_lost_peer(step, *self._settled(state_L, driver), reason)

  def _stop_for_a_lost_peer(self, step: int, state_L: Any, sync_state_L: PyTree, reason: str) -> None:
    """At a block boundary: saves what survives (this step's live state, under partial recovery), writes it down,
    and exits PEER_LOST. Where the state of `step` cannot be read (its block failed in a collective, or was
    donated), the newest host copy is saved, and the step written down is the last one reported done: the block
    that failed trained nothing. Where nothing is saved, `step` is written down only if its block ended (a block
    of collectives dispatched after the peer died never does: it once counted 2 steps trained again that never
    were)."""
    saved = None
    if self._live is not None and self.mode in LIVE_MODES:
      try:
        saved = self._live.save(step, checkpointing.training_tree(state_L, sync_state_L))
      except Exception as error:  # pylint: disable=broad-except  (a donated buffer: the newest host copy will do)
        print(f'Process {self._process} could not save its live state: {type(error).__name__}: {error}')
        saved, step = self._live.save_latest(), min(step, distributed.my_step())
    elif not _ended(state_L):
      step = min(step, distributed.my_step())
    self._write_down_and_exit(step, reason, saved)

  def _stop_stuck(self, reason: str) -> None:
    """From the watchdog, when the training thread never reached a step boundary (its devices wait on a collective
    that will not complete): saves the newest host copy of the live state, writes it down, exits PEER_LOST."""
    saved, waited_s, started = None, distributed.lost_for_s(), time.perf_counter()
    if self._live is not None and self.mode in LIVE_MODES:
      saved = self._live.save_latest()
    self._write_down_and_exit(
      distributed.my_step(),
      reason + '; the training thread was stuck',
      saved,
      timing={'waited_s': waited_s, 'live_write_s': time.perf_counter() - started},
    )

  def _write_down_and_exit(self, step: int, reason: str, live_step: int | None, timing: dict | None = None) -> None:
    """`timing` (from the watchdog): how long after the loss it gave up on the loop, and the newest copy's write."""
    live_saved = live_step is not None
    history.append(
      self._workdir,
      self._writer,
      {
        'event': 'peer_lost',
        'generation': self._generation,
        'process': self._process,
        'step': step,
        'peer_steps': {str(q): status['step'] for q, status in distributed.peer_status().items()},
        'reason': reason,
        'live_saved': live_saved,
        'live_step': live_step,
        **(timing or {}),
        **self._accounts(),
      },
    )
    distributed.exit_peer_lost(reason + (f'; live state of step {live_step} saved' if live_saved else ''))

  def _check_nothing_went_missing(self, source: str, checkpoints: tuple[int, ...]) -> None:
    """Raises `UnrecoverableError` where this process restores a checkpoint (not its live state) and the newest
    one it had completed is gone (its files deleted or moved since): the plan would otherwise take it, or under a
    common cut every process, silently back to an older one or to the start."""
    if source == 'live':
      return
    mine = [r for r in history.read(self._workdir) if r.get('writer') == self._writer]
    starts = [i for i, r in enumerate(mine) if r.get('event') == 'start']
    if not starts:  # A fresh workdir.
      return
    before = mine[starts[-1] :]  # This process's previous start (whoever numbered it) and what it saved since.
    complete = [r['complete'] for r in before if r.get('event') in ('save', 'saved') and r.get('complete') is not None]
    complete += [r['restored_step'] for r in before[:1] if r['restored'] == 'checkpoint']
    expected = max(complete, default=None)
    if expected is not None and not any(step >= expected for step in checkpoints):
      raise UnrecoverableError(
        f'process {self._process} completed a checkpoint of step {expected} in {self._checkpointer.directory}, '
        f'and it is gone (complete checkpoints there now: {self._checkpointer.all_steps() or "none"}): put it back, '
        'or start the job in a new workdir'
      )

  def _agreed_sync_state(self, sync_state_L: PyTree, plan: restart_plan.Plan) -> PyTree:
    """Where the processes restored different steps, one sync state for all (EA's center, BMUF's global model):
    that of the process furthest on, broadcast once before any round runs."""
    if sync_state_L is None or len(set(step for _, step in plan.restore)) <= 1:
      return sync_state_L
    source = max(range(self._processes), key=lambda p: (plan.restore[p][1], -p))
    host = jax.tree.map(np.asarray, sync_state_L)
    agreed = multihost_utils.broadcast_one_to_all(host, is_source=self._process == source)
    return jax.tree.map(lambda x, like: jax.device_put(np.asarray(x), like.sharding), agreed, sync_state_L)


def _ended(state_L: Any) -> bool:
  """Whether the block that made `state_L` has ended (without waiting for it; a donated state has not)."""
  try:
    return state_L.step.is_ready()
  except RuntimeError:  # Deleted: donated to a block dispatched after it.
    return False


def _settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The run's config as {dotted key: JSON value}: each differential carries it, so that a restore it refuses names
  the settings that differ."""
  flat = {}

  def walk(values: dict[str, Any], prefix: str) -> None:
    for key, value in values.items():
      if isinstance(value, dict):
        walk(value, f'{prefix}{key}.')
      else:
        flat[f'{prefix}{key}'] = value

  walk(config.to_dict(), '')
  return json.loads(json.dumps(flat, default=str))
