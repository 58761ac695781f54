r"""Shadow rounds that pace themselves: the least interval between rounds that keeps their cost within a budget.

  pacer = pacing.GapPacer(max_overhead=0.05)   # sync.min_interval_s='auto'; GapPacer(0.05, fixed_interval_s=0.2)
  pacer.observe_round_cost(0.003)              # a round's device time, timed by the driver
  pacer.observe_host_cost(0.001)               # its host work on the training process's cores (`shadow`'s thread)
  clock = pacing.BlockClock(pacer)
  clock.boundary(now, steps)                   # at every block boundary: the steps' time
  pacer.interval_s()                           # least seconds between two rounds (the thread's pace)
  pacer.gap_steps()                            # the same in steps (rounds fused into the blocks)
  pacer.stats()                                # sync_interval_s, sync_round_cost_s, step_time_s, overhead estimate

A round costs the trainers the device time of its own programs, and the host work it does on their cores: its
replicas meet without a collective that holds the devices (`shadow`: on the host; `scheduled`: inside a block, no
step beside it). So the device cost is timed directly, on copies of the params before training goes on
(`CALIBRATION_ROUNDS` after a warm-up: the median); the host cost (`shadow`'s thread: its sums read, sent, met and
averaged; and the training thread's work at the round's two boundaries: the CPU seconds of each, measured round by
round) is added as it is measured. For rounds P seconds
apart costing c in all, the throughput lost is c / P:

  P = c / max_overhead,   the gap in steps = ceil(P / t)   for a mean step time t.

The step time is measured as the run goes, over its blocks (`BlockClock`), as a mean that forgets what is older
than `memory_s` seconds of training, so the gap follows the machine. A round timed as a program of its own costs
more than one fused into a block (its dispatch): the pace errs toward rounds further apart.

(Before, the cost was inferred from the steps a round ran beside against those between rounds: on 2 shared cores
the steps scatter by 10% and more, the inference needed a round's steps apart from the others, blocks cut short
around each round, and two standard errors of margin; at the default config's 8 replicas it read 22-73 ms for a
round whose programs take 2-5 ms, and spaced model averaging's rounds 86 steps apart.)

Which block an interval belongs to (`BlockClock`): the loop keeps one block in flight (docs/design.md §13), so the
time from one boundary to the next is the device's time for the block dispatched at the boundary before, not for
the block just dispatched. Pure bookkeeping, no clock and no threads: the drivers feed it what they timed.
"""

import math
from typing import Any

MIN_STEPS_MEASURED = 5  # Steps timed before their mean time is trusted.
MEMORY_S = 20.0  # Step times older than about this (seconds of training) fade out of the mean.
CALIBRATION_ROUNDS = 5  # Rounds a driver times on copies (after one that warms up); the median is the cost.


class GapPacer:
  """The pace of shadow rounds from their measured cost (module docstring)."""

  def __init__(self, max_overhead: float, fixed_interval_s: float | None = None, memory_s: float = MEMORY_S):
    """`max_overhead`: the share of the trainers' throughput rounds may cost; `fixed_interval_s`: an interval set
    by hand instead; `memory_s`: how long (seconds of training) a step time counts in the mean."""
    if not 0 < max_overhead < 1:
      raise ValueError(f'max_overhead={max_overhead} must be in (0, 1).')
    if fixed_interval_s is not None and not fixed_interval_s >= 0:
      raise ValueError(f'fixed_interval_s={fixed_interval_s} must be >= 0 (or None: paced).')
    if not memory_s > 0:
      raise ValueError(f'memory_s={memory_s} must be > 0.')
    self.max_overhead, self.fixed_interval_s, self.memory_s = max_overhead, fixed_interval_s, memory_s
    self._seconds = self._steps = 0.0  # The blocks' seconds and steps, each weighted by how recent it is.
    self._steps_seen = 0
    self._cost_s: float | None = None
    self._host_cost_s = 0.0

  def observe_steps(self, seconds: float, steps: int) -> None:
    """A block of `steps` steps took `seconds` (the rounds' device time in it included)."""
    if steps <= 0:
      return
    self._steps_seen += steps
    keep = math.exp(-seconds / self.memory_s)  # What was timed longer ago than memory_s counts less and less.
    self._seconds, self._steps = keep * self._seconds + seconds, keep * self._steps + steps

  def observe_round_cost(self, seconds: float) -> None:
    """A round's device time (its programs, timed by the driver)."""
    self._cost_s = seconds

  def observe_host_cost(self, seconds: float) -> None:
    """The host work of a round on the training process's cores (CPU seconds, a recent mean), added to its
    device time."""
    self._host_cost_s = seconds

  def step_time_s(self) -> float | None:
    """Mean step time of the last `memory_s` seconds or so, or None until `MIN_STEPS_MEASURED` steps were timed."""
    return self._seconds / self._steps if self._steps_seen >= MIN_STEPS_MEASURED else None

  def round_cost_s(self) -> float | None:
    """A round's device time and host work (None before its device time was timed)."""
    return None if self._cost_s is None else self._cost_s + self._host_cost_s

  def interval_s(self) -> float:
    """Seconds from one round to the next: `fixed_interval_s`, or the cost over the budget (0 before a cost)."""
    if self.fixed_interval_s is not None:
      return self.fixed_interval_s
    cost_s = self.round_cost_s()
    return 0.0 if cost_s is None else cost_s / self.max_overhead

  def gap_steps(self) -> int:
    """Steps from one round to the next: the interval over the step time, at least 1 (1 before a step time)."""
    step_s = self.step_time_s()
    if step_s is None or step_s <= 0:
      return 1
    return max(1, math.ceil(self.interval_s() / step_s))

  def stats(self) -> dict[str, Any]:
    """sync_interval_s, sync_round_cost_s (device and host), sync_round_host_s (the host's part), step_time_s, and
    sync_overhead_estimate: the cost over the gap's time (None where nothing was measured)."""
    step_s, cost_s = self.step_time_s(), self.round_cost_s()
    gap_s = None if step_s is None else self.gap_steps() * step_s
    return {
      'sync_interval_s': self.interval_s(),
      'sync_round_cost_s': cost_s,
      'sync_round_host_s': self._host_cost_s,
      'step_time_s': step_s,
      'sync_overhead_estimate': cost_s / gap_s if cost_s is not None and gap_s else None,
    }


class BlockClock:
  """Feeds a `GapPacer` the interval between two block boundaries as the steps of the block it timed (module
  docstring).

    clock.boundary(now, steps, waited, paused_s)   # at every boundary, after dispatching a block
    clock.skip()                                   # the loop's own work fills the next interval: it is not timed
  """

  def __init__(self, pacer: GapPacer):
    self._pacer = pacer
    self.reset()

  def reset(self) -> None:
    """Nothing timed yet: the next boundary starts the first interval."""
    self._last_s: float | None = None
    self._timed_steps = 0  # The block the next interval times (the one dispatched before the last boundary).

  def boundary(self, now: float, steps: int, waited: bool = False, paused_s: float = 0.0) -> None:
    """A boundary at `now`, after dispatching a block of `steps`, before this boundary's own work; `waited`: the
    loop waited for this block before this boundary (the compiling block, 'auto''s probes, a straggler's blocks),
    so none is in flight; `paused_s`: seconds of the interval that were no training (compiling the programs of the
    K 'auto' chose), left out of it. The interval since the last boundary holds the blocks that ended in it: the one
    in flight then, and this one if it was waited for."""
    steps_done = self._timed_steps + (steps if waited else 0)
    if self._last_s is not None and steps_done:
      self._pacer.observe_steps(max(0.0, now - self._last_s - paused_s), steps_done)
    self._timed_steps = 0 if waited else steps
    self._last_s = now

  def skip(self) -> None:
    """The next interval is not a block's device time (the loop did its own work in it: a save, a metric read): it
    is left out, with the block it would have timed."""
    self._last_s = None
