"""An emulated straggler: a process whose own steps take `slowdown` times as long as they would.

  delay = straggler.Straggler(slowdown=2.0)
  for step in ...:
    state, metrics = train_step(state, batch)
    delay.after_step(metrics)      # waits for the step; once calibrated, sleeps until slowdown x its own step time
  delay.restart()                  # after a wait that is no step (another process compiling): not timed

Its own step time is measured before it is slowed: the median of its first `calibration_steps` steps after the
first (which compiles), each timed from the end of the previous `after_step` to the moment its results are ready
(data, dispatch, compute and the step's collectives: everything the loop does per step), while every process runs
at the same pace. From then on each of its steps lasts `slowdown` times that: after a step it sleeps what is left
of that period (nothing when the step alone took longer). So the slowdown is of its own work, never a multiple of
the time it waits for its peers: timing every step and sleeping a multiple of it multiplied the waits too (under
sync_sgd a "2x" straggler slowed the job 3.6x); and sleeping a fixed (slowdown - 1) x its step still overshot
(2.55x), because a straggler that wakes to a peer parked in the all-reduce steps slower than one in step with it.
Under sync_sgd a 2x straggler then holds a job of equal processes to about 1/2 of its pace; without per-step
collectives it runs at 1/2 of its own. Waiting for every step costs it its one-step dispatch overlap, in the
calibration too, so the period is measured against the same kind of step.
"""

import statistics
import time
from typing import Any

import jax

from shadowsync_jax.parallel import replicas

CALIBRATION_STEPS = 20  # Steps timed, not slowed, before the straggler sleeps after each.


class Straggler:
  """Sleeps after each step so that the process's steps last `slowdown` times its own step time (1.0: no delay, no
  waiting)."""

  def __init__(self, slowdown: float, calibration_steps: int = CALIBRATION_STEPS):
    if slowdown < 1:
      raise ValueError(f'slowdown={slowdown} must be >= 1.')
    if calibration_steps < 1:
      raise ValueError(f'calibration_steps={calibration_steps} must be >= 1.')
    self.slowdown = slowdown
    self.slept_s = 0.0
    self.own_step_s: float | None = None  # The median calibrated step time, once measured.
    self._calibration_steps = calibration_steps
    self._step_times: list[float] = []
    self._last_end: float | None = None

  def after_step(self, step_result: Any) -> None:
    if self.slowdown == 1:
      return
    jax.block_until_ready(step_result)
    if self.own_step_s is None:
      now = time.perf_counter()
      if self._last_end is not None:  # The first step compiles: it is not a step time.
        self._step_times.append(now - self._last_end)
      if len(self._step_times) == self._calibration_steps:
        self.own_step_s = statistics.median(self._step_times)
    else:
      delay = max(0.0, self.slowdown * self.own_step_s - (time.perf_counter() - self._last_end))
      time.sleep(delay)
      self.slept_s += delay
    self._last_end = time.perf_counter()

  def restart(self) -> None:
    """The next step is timed from now: the wait since the last step (a compilation elsewhere, a checkpoint) is
    not part of its steps."""
    self._last_end = time.perf_counter()


def summary(delay: Straggler, straggler_process: int) -> dict[str, float | None]:
  """The straggler process's figures for summary.json, on every process (a collective: every process calls it):
  straggler_sleep_s (its sleeps, summed) and straggler_step_s (the own step time they multiply); 0 and None
  without a straggler."""
  if straggler_process < 0:  # The same config on every process: none of them gathers.
    return {'straggler_sleep_s': 0.0, 'straggler_step_s': None}
  slept, own = (replicas.gather_from_processes(x) for x in (delay.slept_s, delay.own_step_s or 0.0))
  return {
    'straggler_sleep_s': float(slept[straggler_process]),
    'straggler_step_s': float(own[straggler_process]) or None,
  }
