"""An emulated straggler: a process whose training steps take `slowdown` times as long as they would.

  delay = straggler.Straggler(slowdown=2.0)
  for step in ...:
    state, metrics = train_step(state, batch)
    delay.after_step(metrics)      # waits for the step, then sleeps (slowdown - 1) x the time the step took
  delay.restart()                  # after a wait that is no step (another process compiling): not multiplied

The step's time is measured from the end of the previous `after_step` to the moment this step's results are ready
(data, dispatch and compute: everything the loop does per step), so the loop as a whole runs `slowdown` times
slower. Waiting for every step costs the straggler its one-step dispatch overlap; that is part of being slow.
"""

import time
from typing import Any

import jax


class Straggler:
  """Sleeps after each step so that the loop runs `slowdown` times slower (1.0: no delay, no waiting)."""

  def __init__(self, slowdown: float):
    if slowdown < 1:
      raise ValueError(f'slowdown={slowdown} must be >= 1.')
    self.slowdown = slowdown
    self.slept_s = 0.0
    self._last_end: float | None = None

  def after_step(self, step_result: Any) -> None:
    if self.slowdown == 1:
      return
    jax.block_until_ready(step_result)
    now = time.perf_counter()
    if self._last_end is not None:  # The first step compiles: it is not a step time.
      delay = (self.slowdown - 1) * (now - self._last_end)
      time.sleep(delay)
      self.slept_s += delay
    self._last_end = time.perf_counter()

  def restart(self) -> None:
    """The next step is timed from now: the wait since the last step (a compilation elsewhere, a checkpoint) is
    not part of its steps, and sleeping a multiple of it would stall the straggler for no step."""
    self._last_end = time.perf_counter()
