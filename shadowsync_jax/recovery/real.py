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
- `cpr`: CPR's first mechanism (`cost_model.choose`), decided once after `schedule.CALIBRATION_STEPS` steps from the
  costs every process measured, and kept by the history for the restarts.
Every blocking save, every completed checkpoint and every start that trains is written into the history, from which
`overhead` splits the job's cost as CPR does (`summary.json`: `recovery_checkpoint_overhead_pct`,
`recovery_restart_overhead_pct`). A restart that would restore a checkpoint older than one its process had
completed (the newer one deleted or unreadable since) raises `UnrecoverableError`: one clear error (exit status 3),
never a silent rewind.
Checkpoint intervals: `train.checkpoint_every_steps` under `none`, and `train.checkpoint_every_s` seconds (at the first
block boundary after; processes that step together need their checkpoints on common steps, so theirs turn the seconds
into steps once, after `schedule.CALIBRATION_STEPS` timed steps, at the slowest process's pace: one exchange); Young's
interval from the measured save cost and `recovery.mtbf_steps` (the expected MTBF) under `full`; the longest interval
under `recovery.target_pls` (the parts being the processes) under the partial modes; `recovery.checkpoint_every_steps`
where set.

The policy composes its parts: who this process is in the job (`job_process`), its checkpoint schedule
(`schedule.JobSchedule`), its start (`job_start`), CPR-MFU/SSU's paced priority saves (`priority_saves`), its
accounts (`accounts.StartAccount`) and its end on a lost peer (`peer_loss`).
"""

import pathlib
import time
from typing import Any

import jax
import ml_collections

from shadowsync_jax import hooks
from shadowsync_jax.parallel import compilation_cache
from shadowsync_jax.parallel import cpu_time
from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import history
from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import accounts
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import incremental
from shadowsync_jax.recovery import job_process
from shadowsync_jax.recovery import job_start
from shadowsync_jax.recovery import live_state
from shadowsync_jax.recovery import modes
from shadowsync_jax.recovery import overhead
from shadowsync_jax.recovery import peer_loss
from shadowsync_jax.recovery import priority_saves
from shadowsync_jax.recovery import schedule
from shadowsync_jax.recovery import training_state

PyTree = Any
LIVE_MODES = (*modes.PARTIAL_MODES, 'cpr')  # Whose survivors keep their live state.
UnrecoverableError = job_start.UnrecoverableError  # A checkpoint the restart needs is gone (exit status 3).
_PER_PROCESS_CHECKPOINT_KEYS = (
  'checkpoint_saves',
  'checkpoint_baselines',
  'checkpoint_bytes_written',
  'checkpoint_blocked_s',
  'incremental',
)


class RealFailures(hooks.Hook):
  """Checkpoints, the restart plan and the exit on a lost peer, for one process of a job (any number of them):
  its checkpoint schedule (`schedule.JobSchedule`), priority saves (`priority_saves`), accounts (`accounts`), start
  (`job_start`) and end on a lost peer (`peer_loss`), composed."""

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
    self._warmup_steps = warmup_steps
    self.requested_mode = config.recovery.mode
    self._config, self._total_steps = config, total_steps
    self._job = job_process.JobProcess.here(config, meshes, workdir, total_steps)
    self._schedule = schedule.JobSchedule(self._job)
    self._checkpointer: checkpointing.Checkpointer | Any = None  # `resume`.
    self._live = None
    if self.requested_mode in LIVE_MODES:
      self._live = live_state.LiveKeeper(  # Its copy rate: set in `start`.
        self._job.workdir / 'live' / self._job.writer, max_overhead=config.recovery.live_max_overhead
      )
    self._account = accounts.StartAccount(self._live)
    self._loss = peer_loss.PeerLoss(
      self._job, self._live, lambda: self.mode in LIVE_MODES, self._account.records, self._finish_writing
    )
    self._priority: priority_saves.PacedPrioritySaves | None = None  # CPR-MFU/SSU's, made in `resume`.
    self._saved: list[int] = []  # Steps of this generation's saves, in order.
    self._unconfirmed: int | None = None  # A checkpoint being written (`_save`).
    self._step_s: float | None = None  # This start's mean step time without its saves (`finish`).
    self._trained_at: float | None = None  # When the last block was done (`end`).
    self._restored: dict[str, Any] = {}

  @property
  def mode(self) -> str:
    """The mode in force (`cpr`: `cpr_mfu` until it chose, then what it chose)."""
    return self._schedule.mode

  def _plan_mode(self) -> str:
    return 'partial' if self.mode in modes.PARTIAL_MODES else self.mode

  # The restart plan.

  def resume(self, fresh: training_state.FreshState) -> tuple[Any, PyTree, int]:
    """Restores what the restart plan gives this process (`fresh()`, built only then, on a fresh workdir); returns
    the state, the sync state (job-wide, as the sync drivers hold it) and the step the stream goes on from."""
    distributed.report(0, 'setup')
    initial_tree = lambda: training_state.training_tree(*self._local_pair(*fresh()))
    abstract = fresh.abstract()
    state_bytes = memory.state_bytes(abstract)
    self._checkpointer = job_start.make_checkpointer(self._job, state_bytes, initial_tree, self._keeps_cuts())
    if self._live is not None and isinstance(self._checkpointer, incremental.IncrementalCheckpointer):
      self._live.use_differentials(self._checkpointer)  # Its copies: the rows changed since the baseline.
    takes_rows = self.mode in ('cpr_mfu', 'cpr_ssu')
    rows_from = priority_saves.directory_of(self._job) if takes_rows else None
    started = job_start.restore(
      self._job, self._checkpointer, self._live, self._plan_mode(), abstract, initial_tree, rows_from
    )
    if started.kept is not None:
      self._saved = started.kept
    self._restored = started.record
    if takes_rows:
      self._priority = priority_saves.PacedPrioritySaves(
        self._job, self.mode, started.state_L, self._schedule.least_priority_interval, self._saved_for
      )
    return started.state_L, started.sync_state_R, started.position

  def start(self, step: int, state_L: Any, sync_state_R: PyTree) -> None:
    if self._live is not None:
      self._live.pace_for(training_state.training_tree(state_L, self._job.local(sync_state_R)))
      self._live.every_steps = self._schedule.survivor_copy_interval()
      self._live.covered(step)  # What it restored is on disk.
    # Only a live state is worth waiting for a boundary: otherwise a survivor stuck in a collective goes at once.
    keeps_live = self._live is not None and self.mode in LIVE_MODES
    distributed.handle_peer_loss(True, last_resort=self._loss.stop_stuck, boundary_matters=keeps_live)
    distributed.report(step, 'setup')
    control = self._job.control
    if control.due_at_start(step):  # It waited at its kill step when the job went down: the kill lands now.
      control.ready()  # (The launcher kills once every process trains: the peers' first boundaries.)
      control.step(step)
      control.reached(step, stop_waiting=lambda: distributed.peer_lost() is not None)
      self._loss.stop(step, state_L, self._job.local(sync_state_R), distributed.peer_lost())

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
    if self._job.lock_step and self._job.count > 1:
      return True
    control = self._job.control
    return control.fd is not None and step == control.kill_at_step

  def next_due(self, step: int) -> int | None:
    """The first step after `step` at whose boundary something is due: a kill asked for, the calibration's end, a
    checkpoint, a priority save (the same on every process that has the same config and history)."""
    timing = self._account.timing
    dues = [self._job.control.kill_at_step, *self._schedule.next_due(step, None if timing is None else timing[1])]
    if self._priority is not None:
      dues.append(self._priority.next_due(step))
    return min((due for due in dues if due is not None and due > step), default=None)

  def at_boundary(self, b: hooks.Boundary) -> None:
    """After a block of `b.steps` data steps that ends at `b.step` (`b.block`: its batches [L, K, B, ...];
    `b.trained`: the last step known trained, `b.step` if the loop waited for the block): a lost peer ends the
    process here (after saving the live state); otherwise the checkpoint and priority save due, and a kill the
    launcher was asked for. Its CPU besides saves and live takes is accounted (`accounts.StartAccount.boundary`)."""
    with self._account.boundary():
      self._at_boundary(b)

  def _at_boundary(self, b: hooks.Boundary) -> None:
    step, state_L, settled, trained = b.step, b.state, lambda: self._settled(b.state, b.driver), b.trained
    job, control = self._job, self._job.control
    self._loss.stop_if_lost(step, state_L, settled)
    if self._waits_for_step(step):  # The loop has waited for it already; a safeguard here.
      jax.block_until_ready(state_L.step)
      trained = step
    if self._account.timing is None:
      self._account.ready(step)  # The first step compiled: the clock starts after it.
      cpu_time.name_os_threads()  # The launcher reads their CPU by name (`cpu_time`); at each save, the newer.
      control.ready()
      history.append(job.workdir, job.writer, {'event': 'ready', 'generation': job.generation, 'step': step})
    if (hooks_s := self._account.paced_now(step, self._warmup_steps)) is not None:
      record = {'event': 'paced', 'generation': job.generation, 'process': job.index, 'step': step, 'trained': trained}
      # Its saves' and live copies' time since it was ready: their own parts (`overhead`), not the warm-up's.
      history.append(job.workdir, job.writer, {**record, 'hooks_s': hooks_s})
    distributed.report(trained, 'train', checkpoint=self._saved[-2] if len(self._saved) > 1 else None)
    if self._priority is not None:
      self._priority.count(b.block.sparse[:, : b.steps])
    if self._schedule.calibration_due(step, self._account.timing[1]):
      if self.requested_mode == 'none':  # Only the pace is needed: seconds between checkpoints as common steps.
        self._schedule.seconds_to_steps(self._account.mean_step_s(step))
      else:
        with self._account.elsewhere():  # Its blocking: `save_s`.
          self._calibrate(step, state_L, settled)
    elif self._schedule.due(step) or self._schedule.due_by_time(self._account.timing[0]):
      self._save(step, *settled())
    elif self._priority is not None and step % self._priority.interval() == 0:
      with self._account.elsewhere():
        self._priority.at_boundary(step, state_L)
    if self._live is not None:  # After the saves: a checkpoint just saved is a copy (`LiveKeeper.covered`).
      with self._account.elsewhere():  # Its takes: `live_s`.
        self._live.at_boundary(step, lambda: training_state.training_tree(*settled()))
    if self._unconfirmed is not None and not self._checkpointer.saving():
      record = {'event': 'saved', 'generation': job.generation, 'process': job.index}
      history.append(job.workdir, job.writer, {**record, 'step': self._unconfirmed, 'complete': self._unconfirmed})
      self._unconfirmed = None
    # Lost during this boundary's work: this step's state, read now, before the next block is dispatched (where its
    # steps are collectives, it would never end).
    self._loss.stop_if_lost(step, state_L, settled)
    control.step(trained)
    control.reached(trained, stop_waiting=lambda: distributed.peer_lost() is not None)
    self._loss.stop_if_lost(step, state_L, settled)  # Lost while it waited for its kill: a survivor after all.

  def end(self, b: hooks.Boundary) -> None:
    """After the last block: the time its steps were done (before the job's processes wait for each other)."""
    jax.block_until_ready(b.state.step)
    self._trained_at = time.time()
    self._loss.trained(b.step, lambda: self._settled(b.state, b.driver))  # Saved if a peer dies while it waits.

  def on_error(self, error: BaseException, step: int, state_L: Any, driver: Any) -> None:
    """An exception in the loop: if it is a collective that lost its partner, save what survives and exit (never
    returns then); otherwise returns, and the error goes on."""
    if distributed.active() and distributed.looks_like_a_lost_peer(error):
      self._loss.stop(step, *self._settled(state_L, driver), f'a collective failed: {str(error)[:200]}')

  def finish(self, step: int, state_L: Any, sync_state_R: PyTree) -> None:
    """After the last step: the final save (this process's part), waited for."""
    job = self._job
    self._step_s = self._account.mean_step_s(step)
    if self._step_s is None:  # This start trained nothing (its restore was the end): the pace an earlier one saw.
      paces = [r['step_s'] for r in history.read(job.workdir) if r.get('event') == 'save' and r.get('step_s')]
      self._step_s = paces[-1] if paces else None
    distributed.handle_peer_loss(False)  # The loop reported 'finish' before the rounds ended.
    self._loss.forget()
    self._checkpointer.save(step, training_state.training_tree(state_L, job.local(sync_state_R)))
    self.close()
    record = {'event': 'ended', 'generation': job.generation, 'process': job.index, 'step': step}
    if self._trained_at is not None:  # Where this start's steps ended (`overhead`: what the steps took).
      record['trained_at'] = self._trained_at
    history.append(job.workdir, job.writer, {**record, **self._account.records()})

  def close(self) -> None:
    self._checkpointer.close()
    if self._priority is not None:
      self._priority.close()

  def summary(self) -> dict[str, Any]:
    """What summary.json gains: the mode (and what `cpr` chose), the interval, the job's failures and restores
    from its history, the expected and actual PLS."""
    workdir, processes = self._job.workdir, self._job.count
    job = history.summarize(workdir, self._total_steps, processes)
    details = {'failures_are': 'real', 'generation': self._job.generation, 'this_process': self._restored, **job}
    checkpoint_pct = restart_pct = None
    if self._step_s and self.requested_mode != 'none':
      # As far as the history goes now: the launcher writes this start's threads' CPU (its background writes,
      # priority saves and live copies' thread) once it ended, so they are not in it (the studies split the job's
      # whole history after it: `studies.real_failures`).
      costs = overhead.split(history.read(workdir), self._step_s)
      failure_free_s = self._total_steps * self._step_s  # The steps' own time: the run without failures or saves.
      checkpoint_pct = 100 * costs['checkpoint_s'] / failure_free_s
      restart_pct = 100 * costs['restart_s'] / failure_free_s
      details['overhead_s'] = {**costs, 'failure_free_s': failure_free_s, 'step_s': self._step_s}
    if self._schedule.choice is not None:
      details['cpr_choice'] = self._schedule.choice.to_dict()
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
      'estimated_pls': self._schedule.estimated_pls(),
      'actual_pls': job['actual_pls'],  # Of every partial restart (none under full recovery).
      'checkpoint_interval_steps': self._schedule.interval,
      'checkpoints': stats,  # This process's: saves (blocking or not) and restores, timed.
      # Every process's, in process order: whole saves (baselines), all saves, bytes written, seconds blocked.
      **{key: [s[key] for s in everyone] for key in _PER_PROCESS_CHECKPOINT_KEYS},
      'recovery': details,
    }

  # Saves.

  def _calibrate(self, step: int, state_L: Any, settled: Any) -> None:
    """Measures a save (under `cpr` a restore too) with nothing in flight; the schedule agrees with every process
    on the interval (and, under `cpr`, the mode)."""
    jax.block_until_ready(state_L)  # The steps dispatched so far are done: theirs is the steps' time.
    mean_step_s = self._account.mean_step_s(step)  # The steps' own pace: the loop's saves before this one left out.
    self._checkpointer.wait()
    started = time.perf_counter()
    tree = training_state.training_tree(*settled())
    with compilation_cache.compiling() as compiled:  # Once a run (a differential's gather): left out of the costs.
      self._checkpointer.save(step, tree)
    save_s = time.perf_counter() - started
    self._checkpointer.wait()
    write_s = time.perf_counter() - started
    restore_s = 0.0  # Only `cpr` weighs a restore (its choice); elsewhere it would cost as much again for nothing.
    if self.requested_mode == 'cpr':
      started = time.perf_counter()
      jax.block_until_ready(self._checkpointer.restore(step, training_state.abstract_like(tree)))
      restore_s = time.perf_counter() - started
    self._checkpointed(step)
    self._saved_for(step, 'calibration', write_s + restore_s, complete=step)  # Written and read back: complete.
    once = compiled.seconds
    measured = {'step_s': mean_step_s, 'save_s': save_s - once, 'write_s': write_s - once, 'restore_s': restore_s}
    differential = self._checkpointer.last_save.get('kind') == 'differential'  # Then no recalibration.
    self._schedule.calibrated(measured, differential)
    if self.mode == 'full' and self._priority is not None:  # `cpr` chose full recovery.
      self._priority.close()
      self._priority = None

  def _save(self, step: int, state_L: Any, sync_state_L: PyTree) -> None:
    # The steps dispatched before the save are the steps' time, not the save's (one process never waits for them
    # at a boundary).
    jax.block_until_ready((state_L, sync_state_L))
    started = time.perf_counter()
    self._schedule.last_save_s = started
    with self._account.elsewhere(), compilation_cache.compiling() as compiled:  # Its blocking: `save_s`.
      self._checkpointer.save(step, training_state.training_tree(state_L, sync_state_L))
    fault_injection.kill_in_save(step, 'written', first=self._checkpointer.wait)  # (Tests.)
    written = {
      'written': self._checkpointer.last_save.get('kind'),
      'bytes_written': self._checkpointer.last_save.get('bytes'),
      # Embedding rows written (a whole save: all), and held: this process's rows over its devices.
      'rows_written': self._checkpointer.last_save.get('rows', int(state_L.row_steps.size)),
      'rows_held': int(state_L.row_steps.size),
    }
    self._saved_for(step, 'checkpoint', time.perf_counter() - started, complete=self._newest_complete(step), **written)
    self._checkpointed(step)
    self._unconfirmed = step  # Written down as complete once written (`at_boundary`).
    cost_s = time.perf_counter() - started - compiled.seconds  # A gather compiles once a start.
    self._schedule.saved(step, cost_s, self._account.mean_step_s, self._checkpointer.last_save.get('kind'))
    if self._priority is not None:
      self._priority.pace(step, self._account.mean_step_s(step))
    if self._keeps_cuts():  # Drop what no consistent cut can need any more (orbax keeps everything here).
      oldest_needed = min([self._saved[-2] if len(self._saved) > 1 else 0] + self._peer_checkpoints())
      self._checkpointer.delete_before(oldest_needed)

  def _checkpointed(self, step: int) -> None:
    """A checkpoint of `step` was saved (written in the background, maybe): one of this generation's, and a copy as
    good as a live one (`LiveKeeper.covered`)."""
    self._saved.append(step)
    if self._live is not None:
      self._live.covered(step)

  def _finish_writing(self) -> None:
    if self._checkpointer is not None:
      self._checkpointer.wait()

  def _keeps_cuts(self) -> bool:
    """Whether a restart may need a checkpoint older than this process's newest (a consistent cut of the job: full
    recovery, `cpr` before and after its choice, processes that step together); else orbax keeps the two newest."""
    return self.mode == 'full' or self.requested_mode == 'cpr' or self._job.lock_step

  def _newest_complete(self, step: int) -> int | None:
    """This process's newest complete checkpoint before `step` (`step`'s own save may still be written)."""
    return max((s for s in self._checkpointer.all_steps() if s < step), default=None)

  def _saved_for(self, step: int, kind: str, blocking_s: float, complete: int | None = None, **written: Any) -> None:
    """Writes down the time the loop was blocked on a save (CPR's checkpoint-related overhead: `overhead`), the
    pace so far (for a summary whose own start trains nothing), and what a checkpoint wrote (`written`)."""
    job = self._job
    self._account.blocked(blocking_s)
    cpu_time.name_os_threads()
    record = {'event': 'save', 'generation': job.generation, 'process': job.index, 'step': step, 'kind': kind}
    record.update(blocking_s=blocking_s, step_s=self._account.mean_step_s(step), complete=complete, **written)
    record.update(self._account.records())
    history.append(job.workdir, job.writer, record)

  def _peer_checkpoints(self) -> list[int]:
    return [status['checkpoint'] or 0 for status in distributed.peer_status().values()]

  def _local_pair(self, state_L: Any, sync_state_R: PyTree) -> tuple[Any, PyTree]:
    return state_L, self._job.local(sync_state_R)

  def _settled(self, state_L: Any, driver: Any) -> tuple[Any, PyTree]:
    """The pair to save now (`SyncDriver.settled`: no round half landed), with this process's sync state."""
    return self._local_pair(*driver.settled(state_L))
