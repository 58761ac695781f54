"""The checkpoint schedule: every how many steps a save is due, how that interval is found, and when it is due.

  schedule = schedule.JobSchedule(process)              # a process of a job (`real`)
  schedule = schedule.EmulatedSchedule(config, total_steps, num_parts)   # emulated failures (`emulated`)
  schedule.interval                                     # steps between saves (None: measured first)
  schedule.due(step); schedule.next_due(step, ...)      # a save at `step`; the next step something is due
  schedule.mode, schedule.choice                        # the recovery mode in force; what `cpr` chose

The interval is set (`recovery.checkpoint_every_steps`; without recovery `train.checkpoint_every_steps`, or
`train.checkpoint_every_s` seconds, turned into common steps once timed where processes step together), or derived
(`intervals`): under partial recovery the longest interval whose expected PLS stays under `recovery.target_pls`;
under full recovery Young's, sqrt(2 save cost MTBF), from a save cost measured after `CALIBRATION_STEPS` timed
steps (or emulated, `recovery.save_cost_steps`), never shorter than a save takes to be written. `cpr` decides there
between full and partial recovery (`cost_model.choose`, CPR's first mechanism), and recovers partially until then.
A job's processes agree on what they measured (the slowest's pace, one exchange), process 0 writes the outcome into
the job's history for the restarts, and full recovery's interval is computed again from the mean blocking of every
`RECALIBRATE_EVERY` checkpoints of a start.
"""

from collections.abc import Callable
import math
import time
from typing import Any

import ml_collections
import numpy as np

from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import history
from shadowsync_jax.recovery import cost_model
from shadowsync_jax.recovery import intervals
from shadowsync_jax.recovery import job_process
from shadowsync_jax.recovery import modes

CALIBRATION_STEPS = 20  # Steps timed before a measured save cost sets an interval (and `cpr` chooses).
RECALIBRATE_EVERY = 8  # Full recovery's interval again from the mean blocking of a start's checkpoints, so often.


def next_multiple(step: int, every: int | None) -> int | None:
  """The first multiple of `every` after `step` (None: no `every`)."""
  return None if not every else (step // every + 1) * every


class Schedule:
  """An interval in steps (None: not known yet) and the recovery mode it serves."""

  interval: int | None
  requested_mode: str
  mode: str
  choice: cost_model.Choice | None = None

  def due(self, step: int) -> bool:
    """Whether a checkpoint is due at `step`."""
    return bool(self.interval) and step % self.interval == 0

  def least_priority_interval(self) -> int:
    """Steps between priority saves (CPR-MFU/SSU) at most: a quarter interval."""
    return max(1, (self.interval or 4) // 4)


class JobSchedule(Schedule):
  """The checkpoints of a process of a job (`real`), on step numbers every process shares."""

  def __init__(self, process: job_process.JobProcess):
    self._process = process
    config = process.config
    self.requested_mode = config.recovery.mode
    self.mode = self._decided_mode()
    self.interval = self._configured_interval()
    # Seconds between checkpoints, where every process must save at the same steps: turned into steps once timed.
    self._seconds_need_steps = bool(
      self.requested_mode == 'none' and config.train.checkpoint_every_s and process.lock_step and process.count > 1
    )
    self._seconds_in_steps = False
    self.last_save_s = 0.0  # When the last save started.
    self.save_costs: list[float] = []  # This start's checkpoints' blocking, compiles left out (`saved`).

  def _decided_mode(self) -> str:
    """The mode in force: `cpr` recovers partially until it chose, and keeps its choice across restarts."""
    if self.requested_mode != 'cpr':
      return self.requested_mode
    choice = history.latest(self._process.workdir, 'cpr_choice')
    if choice is None:
      return 'cpr_mfu'
    self.choice = cost_model.Choice(**choice['choice'])
    return 'cpr_mfu' if self.choice.mode == 'partial' else 'full'

  def _configured_interval(self) -> int | None:
    """The checkpoint interval known before any step runs; None: measured first (`calibrated`)."""
    config = self._process.config
    if self.requested_mode == 'none':
      return config.train.checkpoint_every_steps or None
    if config.recovery.checkpoint_every_steps:
      return config.recovery.checkpoint_every_steps
    calibrated = history.latest(self._process.workdir, 'calibration')
    if calibrated is not None and (self.mode == 'full' or self.choice is not None):
      return calibrated['interval']
    if self.mode == 'full':
      return None
    return self._partial_interval()

  def survivor_copy_interval(self) -> int | None:
    """Steps a survivor's newest copy of its state may be old (`intervals.survivor_copy_interval`; None: one
    process)."""
    recovery = self._process.config.recovery
    return intervals.survivor_copy_interval(
      recovery.target_pls, recovery.mtbf_steps, self._process.count, self._process.total_steps
    )

  def _partial_interval(self) -> int:
    recovery = self._process.config.recovery
    try:
      return intervals.partial_recovery_interval(
        recovery.target_pls, recovery.mtbf_steps, self._process.count, self._process.total_steps
      )
    except ValueError:  # Unreachable (validated away but under `cpr`, which then chooses full).
      return 1

  def needs_calibration(self) -> bool:
    if self.requested_mode == 'cpr':
      return self.choice is None
    if self.requested_mode == 'none':
      return self._seconds_need_steps and not self._seconds_in_steps
    return self.interval is None and self.mode == 'full'

  def calibration_due(self, step: int, ready_step: int) -> bool:
    """Whether the calibration (or the seconds' turn into steps) is due at `step`, timed from `ready_step`."""
    return self.needs_calibration() and step - ready_step >= CALIBRATION_STEPS

  def next_due(self, step: int, ready_step: int | None) -> list[int | None]:
    """The steps after `step` something of the schedule is due at: the calibration's end, a checkpoint."""
    dues = []
    if self.needs_calibration() and ready_step is not None:
      dues.append(ready_step + CALIBRATION_STEPS)
    return [*dues, next_multiple(step, self.interval)]

  def due_by_time(self, ready_s: float | None) -> bool:
    """`train.checkpoint_every_s` (no recovery configured): a save at the first boundary that long after the last
    (or after the first step, at `ready_s`); never a block cut (any boundary will do)."""
    every_s = self._process.config.train.checkpoint_every_s
    if not every_s or self.requested_mode != 'none' or ready_s is None or self._seconds_need_steps:
      return False
    return time.perf_counter() - max(ready_s, self.last_save_s) >= every_s

  def seconds_to_steps(self, step_s: float | None) -> None:
    """`train.checkpoint_every_s` as a common interval in steps for processes that step together: the seconds at
    the slowest process's mean step time (one exchange), or `train.checkpoint_every_steps` where that is shorter."""
    step_s = max(1e-9, *distributed.exchange('checkpoint_step_s', step_s))
    steps = max(1, round(self._process.config.train.checkpoint_every_s / step_s))
    self.interval = min(steps, self.interval or steps)
    self._seconds_in_steps = True

  def calibrated(self, measured: dict[str, float], differential: bool) -> None:
    """From this process's measured costs (`step_s`, `save_s`, `write_s`, `restore_s`), agrees with every process
    on the interval (and, under `cpr`, the mode): one exchange; process 0 writes the outcome into the history for
    the restarts. `differential`: whether the measured save was one (then no recalibration)."""
    costs = distributed.exchange('calibration', measured)
    worst = {key: max(c[key] for c in costs) for key in measured}  # The job goes at its slowest process's pace.
    save_steps, restore_steps = worst['save_s'] / worst['step_s'], worst['restore_s'] / worst['step_s']
    recovery, total_steps = self._process.config.recovery, self._process.total_steps
    write_steps = int(np.ceil(worst['write_s'] / worst['step_s']))
    full_interval = max(write_steps, intervals.young_interval_steps(save_steps, recovery.mtbf_steps, total_steps))
    if self.requested_mode == 'cpr':
      self.choice = cost_model.choose(
        save_steps,
        restore_steps,
        restore_steps,  # A dead process restores its whole part either way.
        recovery.mtbf_steps,
        self._process.count,
        recovery.target_pls,
        total_steps,
        min_full_interval_steps=write_steps,
      )
      self.mode = 'cpr_mfu' if self.choice.mode == 'partial' else 'full'
      self.interval = self._partial_interval() if self.choice.mode == 'partial' else self.choice.full_interval_steps
      print(f'cpr: {self.choice.why}')
    else:
      self.interval = full_interval
    if self._process.index == 0:
      record = {'event': 'calibration', 'interval': self.interval, 'costs': worst, 'differential': differential}
      history.append(self._process.workdir, 'process_0', record)
      if self.choice is not None:
        history.append(self._process.workdir, 'process_0', {'event': 'cpr_choice', 'choice': self.choice._asdict()})

  def saved(self, step: int, cost_s: float, mean_step_s: Callable[[int], float | None], kind: str | None) -> None:
    """A checkpoint of `step` blocked the loop `cost_s` (compiles left out); `kind`: the save's (whole, baseline,
    differential). Every `RECALIBRATE_EVERY` checkpoints of a start, full recovery's own interval again."""
    self.save_costs.append(cost_s)
    if self._recalibrates():
      self._recalibrate(step, sum(self.save_costs) / len(self.save_costs), mean_step_s(step), kind)

  def _recalibrates(self) -> bool:
    """Whether full recovery's own interval is due to be computed again: every `RECALIBRATE_EVERY` checkpoints of a
    start (the same saves on every process: they save at the same steps)."""
    if self.mode != 'full' or self._process.config.recovery.checkpoint_every_steps or not self.interval:
      return False
    return len(self.save_costs) % RECALIBRATE_EVERY == 0

  def _recalibrate(self, step: int, blocking_s: float, step_s: float | None, kind: str | None) -> None:
    """Young's interval again from the mean blocking of this start's checkpoints, `blocking_s`: the calibration's
    one save cannot stand for them (it comes early, when few rows changed, with a restart's standby starting beside
    it; differentials grow with the interval, and a baseline now and then blocks seconds). One exchange at this
    common save step; process 0 writes it down."""
    measured = {'save_s': blocking_s, 'step_s': step_s}
    costs = distributed.exchange(f'recalibration/{step}', measured)  # A name a start uses once.
    worst = {key: max(c[key] or 0.0 for c in costs) for key in measured}
    if not worst['step_s']:
      return
    self.interval = intervals.young_interval_steps(
      worst['save_s'] / worst['step_s'], self._process.config.recovery.mtbf_steps, self._process.total_steps
    )
    if self._process.index == 0:
      incremental = kind in ('differential', 'baseline')
      record = {'event': 'calibration', 'interval': self.interval, 'costs': worst, 'differential': incremental}
      history.append(self._process.workdir, 'process_0', {**record, 'step': step, 'saves': len(self.save_costs)})

  def estimated_pls(self) -> float | None:
    """The expected portion of lost samples at this interval (partial modes), the parts being the processes: the
    failed part's since its checkpoint, and the survivors' since their newest copy (a checkpoint, or a live copy
    where `survivor_copy_interval` is shorter)."""
    if self.mode not in modes.PARTIAL_MODES or not self.interval:
      return None
    recovery, count, total_steps = self._process.config.recovery, self._process.count, self._process.total_steps
    failed = intervals.expected_pls(self.interval, recovery.mtbf_steps, count, total_steps)
    if count < 2:
      return failed
    copies = min(self.interval, self.survivor_copy_interval())
    return failed + intervals.expected_pls(copies, recovery.mtbf_steps / (count - 1), count, total_steps)


class EmulatedSchedule(Schedule):
  """The checkpoints of emulated failures (`emulated`), on the clock of the failure-free steps timed."""

  def __init__(self, config: ml_collections.ConfigDict, total_steps: int, num_parts: int):
    recovery = config.recovery
    self._config, self._total_steps, self._num_parts = config, total_steps, num_parts
    self.requested_mode = recovery.mode
    self.mode = 'cpr_mfu' if recovery.mode == 'cpr' else recovery.mode  # `cpr` recovers partially until it chose.
    self.mtbf = recovery.mtbf_steps
    self.emulated_save = recovery.save_cost_steps if recovery.save_cost_steps > 0 else None
    self.emulated_restore = recovery.restore_cost_steps if recovery.restore_cost_steps > 0 else None
    if self.requested_mode == 'cpr' and not recovery.checkpoint_every_steps:
      try:
        intervals.partial_recovery_interval(recovery.target_pls, self.mtbf, num_parts, total_steps)
      except ValueError:  # Partial recovery cannot hold the target at all: full, from the start.
        self.mode = 'full'
    self.interval = recovery.checkpoint_every_steps or None
    if self.interval is None and self.partial:
      self.interval = intervals.partial_recovery_interval(recovery.target_pls, self.mtbf, num_parts, total_steps)
    elif self.interval is None and self.emulated_save is not None:
      self.interval = intervals.young_interval_steps(self.emulated_save, self.mtbf, total_steps)
    self.write_steps: float | None = None  # How long a full save takes to be written, in steps (`calibrated`).
    self.save_blocks_s: list[float] = []  # Each save's blocking, measured.

  @property
  def partial(self) -> bool:
    return self.mode in modes.PARTIAL_MODES

  def _calibrating(self) -> bool:
    return self.requested_mode == 'cpr' and self.choice is None or self.interval is None

  def next_due(self, step: int, timed_steps: int) -> list[int | None]:
    """The steps after `step` something of the schedule is due at: the calibration's end (after `timed_steps`
    failure-free steps timed so far), a checkpoint."""
    dues = []
    if self._calibrating() and timed_steps < CALIBRATION_STEPS:
      dues.append(step + CALIBRATION_STEPS - timed_steps)
    return [*dues, next_multiple(step, self.interval)]

  def calibration_due(self, timed_steps: int) -> str | None:
    """What is due instead of a plain save: 'choose' (`cpr`'s choice), 'calibrate' (full recovery's interval from
    a measured save) or None."""
    if (
      self.requested_mode == 'cpr' and self.choice is None and (self.emulated_save or timed_steps >= CALIBRATION_STEPS)
    ):
      return 'choose'
    if self.interval is None and timed_steps >= CALIBRATION_STEPS:
      return 'calibrate'
    return None

  def save_cost_steps(self, mean_step_s: float | None) -> float | None:
    """A save's cost in steps: emulated, or its measured blocking over the mean step."""
    if self.emulated_save:
      return self.emulated_save
    if not self.save_blocks_s or not mean_step_s:
      return None
    return float(np.mean(self.save_blocks_s)) / mean_step_s

  def calibrated(self, write_s: float, mean_step_s: float) -> None:
    """Full recovery with a measured save cost: Young's interval from the time a save blocks the loop, but no
    shorter than the save takes to be written (`write_s`; or each save would wait for the previous one)."""
    self.write_steps = write_s / mean_step_s
    self.interval = max(
      math.ceil(self.write_steps),
      intervals.young_interval_steps(self.save_cost_steps(mean_step_s), self.mtbf, self._total_steps),
    )

  def choose(
    self,
    mean_step_s: float,
    full_restore: float,
    partial_restore: float,
    priority_fraction_of_bytes: float,
    priority_every: int | None,
  ) -> cost_model.Choice:
    """`cpr`: full or partial recovery from now on, whichever the cost model expects to cost less (CPR's first
    mechanism), from the save cost and the restores' (in steps) and a priority save's share of a save's bytes."""
    save = self.save_cost_steps(mean_step_s)
    recovery = self._config.recovery
    self.choice = cost_model.choose(
      save,
      full_restore,
      partial_restore,
      self.mtbf,
      self._num_parts,
      recovery.target_pls,
      self._total_steps,
      min_full_interval_steps=math.ceil(self.write_steps or 1),
      priority_cost_steps=save * priority_fraction_of_bytes,
      priority_fraction_of_interval=None if priority_every else 0.25,
    )
    print(f'cpr: {self.choice.why}')
    if self.choice.mode == 'full':
      self.mode = 'full'
      self.interval = self.choice.full_interval_steps
    return self.choice

  def pls(self, failures_struck: list[Any], checkpoint_steps: list[int]) -> tuple[float, float]:
    """(expected, measured) portions of lost samples."""
    expected = intervals.expected_pls(self.interval, self.mtbf, self._num_parts, self._total_steps)
    lost = intervals.lost_steps(failures_struck, checkpoint_steps)
    return expected, intervals.measured_pls(lost, self._num_parts, self._total_steps)

  def expected_full_overhead_pct(self, save_cost_steps: float, restore_steps: float) -> float:
    return 100 * intervals.expected_full_recovery_overhead(
      self.interval, save_cost_steps, restore_steps, self.mtbf, self._total_steps
    )
