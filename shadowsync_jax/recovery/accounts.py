"""The overhead accounts: where the training thread's time went, besides the steps, as recovery measures it.

  account = accounts.Account(untimed_blocks=1)      # emulated failures (`emulated`), in one process
  account.time_block(step, steps, seconds)          # each block, timed from boundary to boundary
  account.saves_s += ...; account.hold(cost_steps, started)   # a cost charged; an emulated one held (slept)
  account.figures(); account.overhead_pct()         # the summary's time figures

  start = accounts.StartAccount(live)               # one start of a process of a job (`real`)
  start.ready(step); start.blocked(seconds); start.mean_step_s(step); start.records()

Emulated failures charge each second of the training thread to what it went to (`Account`): steps trained for the
first time (the failure-free work, the untimed blocks left out: the compiling one, 'auto''s probe), steps trained
again after a rewind, blocking saves and priority saves, restores and handing batches to the lookup counter. A real
job's cost is split from its history afterwards (`overhead`); what a start adds to it is its pace (its clock starts
after its first, compiling step), the time its saves blocked the loop and its live copies' takes (`StartAccount`).
"""

import contextlib
import dataclasses
import time
from typing import Any


@dataclasses.dataclass
class Account:
  """Where the training thread's time went, in seconds (emulated failures)."""

  step_s: float = 0.0  # Steps trained for the first time (the failure-free work), the compiled first one excluded.
  steps: int = 0
  retrained_s: float = 0.0  # Steps trained again after a full recovery's rewind.
  retrained_steps: int = 0
  saves_s: float = 0.0  # Blocked on full checkpoints.
  priority_saves_s: float = 0.0  # Blocked on CPR's priority saves.
  restore_s: float = 0.0
  counting_s: float = 0.0  # Blocked handing batches to the MFU/SSU lookup counter.
  # Blocks not timed: the first (it compiles) and 'auto''s probe (blocks of 1 and 8 steps, each waited for, the last
  # one compiling the K chosen). Timed, they made the calibration's mean step several times a K-block's, and full
  # recovery's interval (Young's, from the save cost in steps) several times too short.
  untimed_blocks: int = 1
  high_water: int = 0  # The furthest step reached: steps at or below it are trained again.

  def mean_step_s(self) -> float | None:
    return self.step_s / self.steps if self.steps else None

  def overhead_s(self) -> float:
    return self.saves_s + self.priority_saves_s + self.retrained_s + self.restore_s + self.counting_s

  def overhead_pct(self) -> float | None:
    """The overhead as a percentage of the failure-free steps' time."""
    return 100 * self.overhead_s() / self.step_s if self.step_s else None

  def time_block(self, step: int, steps: int, seconds: float) -> None:
    """A block of `steps` steps ending at `step` took `seconds`, an equal share each: steps trained again (at or
    below the furthest step reached) and steps trained for the first time."""
    if self.untimed_blocks:  # The compiling block, 'auto''s probe.
      self.untimed_blocks -= 1
    else:
      retrained = max(0, min(step, self.high_water) - (step - steps))
      self.retrained_s += seconds * retrained / steps
      self.retrained_steps += retrained
      self.step_s += seconds * (steps - retrained) / steps
      self.steps += steps - retrained
    self.high_water = max(self.high_water, step)

  def hold(self, cost_steps: float | None, started: float) -> None:
    """Emulation: sleeps until `cost_steps` mean step times have passed since `started` (once steps were timed)."""
    mean_step_s = self.mean_step_s()
    if cost_steps and mean_step_s:
      time.sleep(max(0.0, cost_steps * mean_step_s - (time.perf_counter() - started)))

  def figures(self) -> dict[str, Any]:
    """The summary's time figures."""
    return {
      'failure_free_s': self.step_s,
      'failure_free_steps': self.steps,
      'blocked_on_saves_s': self.saves_s,
      'blocked_on_priority_saves_s': self.priority_saves_s,
      'retrained_s': self.retrained_s,
      'retrained_steps': self.retrained_steps,
      'restore_s': self.restore_s,
      'row_counting_s': self.counting_s,
    }


class StartAccount:
  """One start of a process of a job: its clock, the time its saves blocked the loop, its live copies' takes."""

  def __init__(self, live: Any = None):
    """`live`: the `live_state.LiveKeeper` whose copies take the training core's time, if any."""
    self._live = live
    self.timing: tuple[float, int] | None = None  # (time, step) once the first step has run.
    self.blocked_s = 0.0  # This start's time blocked on saves (`blocked`).
    self._hooks_at_ready = 0.0
    self.paced = False
    self.boundary_s = 0.0  # CPU of the training thread in recovery's boundary work besides its saves and live takes.
    self._elsewhere_s = 0.0

  def ready(self, step: int) -> None:
    """The first step compiled and ran: the clock starts after it."""
    self.timing = (time.perf_counter(), step)
    self._hooks_at_ready = self.hooks_s()

  def paced_now(self, step: int, warmup_steps: int) -> float | None:
    """Once, where the start's warm-up steps end: its saves' and live copies' time since it was ready (their own
    parts, `overhead`, not the warm-up's); None before and after."""
    if self.paced or step - self.timing[1] < warmup_steps - 1:  # (The ready step was the first one.)
      return None
    self.paced = True
    return self.hooks_s() - self._hooks_at_ready

  @contextlib.contextmanager
  def boundary(self):
    """Around recovery's work at a boundary: its training-thread CPU, less what `elsewhere` counted, to
    `boundary_s`."""
    started, self._elsewhere_s = time.thread_time(), 0.0
    try:
      yield
    finally:
      self.boundary_s += max(0.0, time.thread_time() - started - self._elsewhere_s)

  @contextlib.contextmanager
  def elsewhere(self):
    """Around work inside `boundary` that another part counts (a save's blocking, a live take)."""
    started = time.thread_time()
    try:
      yield
    finally:
      self._elsewhere_s += time.thread_time() - started

  def blocked(self, seconds: float) -> None:
    self.blocked_s += seconds

  def mean_step_s(self, step: int) -> float | None:
    """This start's mean step time so far, its saves left out (None before two steps)."""
    if self.timing is None or step <= self.timing[1]:
      return None
    return max(0.0, time.perf_counter() - self.timing[0] - self.blocked_s) / (step - self.timing[1])

  def hooks_s(self) -> float:
    """Seconds this start's saves blocked the loop and its live copies took of the training core, so far."""
    return self.blocked_s + (self._live.spent_s if self._live is not None else 0.0)

  def records(self) -> dict[str, float]:
    """What this start spent so far on the training core outside the steps and the saves' blocking that only it
    can tell (`overhead`: the launcher reads the threads' CPU): its boundary work's CPU, its live copies' takes."""
    records = {'boundary_s': self.boundary_s}
    return records | ({'live_s': self._live.spent_s} if self._live is not None else {})
