r"""Shadow rounds that pace themselves: the least interval between rounds that keeps their cost within a budget.

  pacer = pacing.Pacer(max_overhead=0.05)      # sync.min_interval_s='auto'; Pacer(0.05, fixed_interval_s=0.2) measures
  pacer.observe_step(seconds, in_round=True)   # the training thread, at every step boundary
  pacer.observe_round(latency_s)               # a round was merged
  pacer.interval_s()                           # least seconds from one round's start to the next
  pacer.stats()                                # sync_interval_s, sync_round_cost_s, step times, the overhead estimate

A round costs the trainers the time their steps lose to it. The steps made while it is in flight, and the two after
it hands its snapshot over or merges (they carry the snapshot copy and the merge: the training loop reads a step's
result one step late), take longer than the steps between rounds. Over the last `window_rounds` rounds, with t the
mean step time between rounds,

  cost of a round   c = (sum of the in-round step times - their count x t) / rounds
  throughput lost     = c / P   for rounds P seconds apart, so   P = c / max_overhead

(In a period P the trainers make (P - busy) / t + n_busy steps instead of P / t: a loss of (busy - n_busy t) / P.)
Measured as the run goes, the interval follows what a round costs here and now: a round that costs more (a bigger
model, a busier machine, a link whose traffic takes the trainers' cores) is spaced further apart; a slower link
makes a round longer, so more steps run beside it and c grows with them, and a round never starts before the last
one is merged. Two guards keep the estimate honest: until steps between rounds have been measured, a round is taken
to stop training for its whole latency (c = latency); and rounds stay far enough apart that a few steps between
them keep being measured (at least a round's in-round time plus `STEPS_BETWEEN_ROUNDS` steps).

Pure bookkeeping, no clock and no threads: the driver (`shadow.ShadowSync`) feeds it what it timed.
"""

import collections
from typing import Any, NamedTuple

STEPS_BETWEEN_ROUNDS = 3  # The least interval leaves room for this many steps between rounds.
MIN_STEPS_MEASURED = 5  # Steps between rounds before their mean time is trusted.


class _Round(NamedTuple):
  """What the training thread timed from one merge to the next."""

  in_round_s: float = 0.0
  in_round_steps: int = 0
  between_s: float = 0.0
  between_steps: int = 0
  latency_s: float = 0.0


class Pacer:
  """The interval between shadow rounds from their measured cost (module docstring)."""

  def __init__(self, max_overhead: float, fixed_interval_s: float | None = None, window_rounds: int = 16):
    """`max_overhead`: the share of the trainers' throughput rounds may cost; `fixed_interval_s`: an interval set
    by hand instead (the pacer then only measures); `window_rounds`: how many recent rounds the estimates use."""
    if not 0 < max_overhead < 1:
      raise ValueError(f'max_overhead={max_overhead} must be in (0, 1).')
    if fixed_interval_s is not None and not fixed_interval_s >= 0:
      raise ValueError(f'fixed_interval_s={fixed_interval_s} must be >= 0 (or None: paced).')
    if window_rounds < 1:
      raise ValueError(f'window_rounds={window_rounds} must be >= 1.')
    self.max_overhead, self.fixed_interval_s = max_overhead, fixed_interval_s
    self._rounds: collections.deque[_Round] = collections.deque(maxlen=window_rounds)
    self._open = _Round()  # The steps since the last merge.

  def observe_step(self, seconds: float, in_round: bool) -> None:
    """A training step took `seconds` (boundary to boundary); `in_round`: a round was in flight or touched it."""
    open_ = self._open
    if in_round:
      self._open = open_._replace(in_round_s=open_.in_round_s + seconds, in_round_steps=open_.in_round_steps + 1)
    else:
      self._open = open_._replace(between_s=open_.between_s + seconds, between_steps=open_.between_steps + 1)

  def observe_round(self, latency_s: float) -> None:
    """A round was merged; it took `latency_s` from its snapshot to its result."""
    self._rounds.append(self._open._replace(latency_s=latency_s))
    self._open = _Round()

  def step_time_s(self) -> float | None:
    """Mean time of a step between rounds, or None until `MIN_STEPS_MEASURED` were."""
    steps = sum(r.between_steps for r in self._rounds) + self._open.between_steps
    if steps < MIN_STEPS_MEASURED:
      return None
    return (sum(r.between_s for r in self._rounds) + self._open.between_s) / steps

  def round_cost_s(self) -> float | None:
    """The trainers' time one round costs (c above), or None before a round and a step time were measured."""
    step_s = self.step_time_s()
    if not self._rounds or step_s is None:
      return None
    extra_s = sum(r.in_round_s - r.in_round_steps * step_s for r in self._rounds)
    return max(0.0, extra_s / len(self._rounds))

  def interval_s(self) -> float:
    """The least seconds from one round's start to the next's: `fixed_interval_s` if set; else 0 before the first
    round, then the paced interval."""
    if self.fixed_interval_s is not None:
      return self.fixed_interval_s
    if not self._rounds:
      return 0.0
    cost_s, step_s = self.round_cost_s(), self.step_time_s()
    if cost_s is None:  # No step between rounds measured yet: the round may have stopped training throughout.
      return sum(r.latency_s for r in self._rounds) / len(self._rounds) / self.max_overhead
    in_round_s = sum(r.in_round_s for r in self._rounds) / len(self._rounds)
    return max(cost_s / self.max_overhead, in_round_s + STEPS_BETWEEN_ROUNDS * step_s)

  def stats(self) -> dict[str, Any]:
    """sync_interval_s (the pace now), sync_round_cost_s, step_time_s (between rounds), step_time_in_round_s, and
    sync_overhead_estimate (the share of throughput the recent rounds cost); None where nothing was measured."""
    in_round_steps = sum(r.in_round_steps for r in self._rounds)
    cost_s = self.round_cost_s()
    period_s = sum(r.in_round_s + r.between_s for r in self._rounds)
    return {
      'sync_interval_s': self.interval_s(),
      'sync_round_cost_s': cost_s,
      'step_time_s': self.step_time_s(),
      'step_time_in_round_s': sum(r.in_round_s for r in self._rounds) / in_round_steps if in_round_steps else None,
      'sync_overhead_estimate': cost_s * len(self._rounds) / period_s if cost_s is not None and period_s else None,
    }
