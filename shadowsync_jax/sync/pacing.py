r"""Shadow rounds that pace themselves: the least interval between rounds that keeps their cost within a budget.

  pacer = pacing.Pacer(max_overhead=0.05)      # sync.min_interval_s='auto'; Pacer(0.05, fixed_interval_s=0.2) measures
  pacer.observe_steps(seconds, steps, in_round=True)   # the training thread, at every block boundary
  pacer.observe_round(latency_s)               # a round was merged
  pacer.interval_s()                           # least seconds from one round's start to the next
  pacer.stats()                                # sync_interval_s, sync_round_cost_s, step times, overhead estimate

A round costs the trainers the time their steps lose to it. The steps made while it is in flight, and the blocks
of steps dispatched just after its snapshot is handed over or it is merged (they carry the snapshot copy and the
merge, which the device runs before them), take longer than the steps between rounds. Over the last
`window_rounds` rounds, with t the mean step time between rounds,

  cost of a round   c = (sum of the in-round step times - their count x t) / rounds
  throughput lost     = c / P   for rounds P seconds apart, so   P = c / max_overhead

(In a period P the trainers make (P - busy) / t + n_busy steps instead of P / t: a loss of (busy - n_busy t) / P.)
Measured as the run goes, the interval follows what a round costs here and now: a round that costs more (a bigger
model, a busier machine, a link whose traffic takes the trainers' cores) is spaced further apart; a slower link
makes a round longer, so more steps run beside it and c grows with them, and a round never starts before the last
one is merged. Four guards keep the estimate honest. The first round of a run (`WARMUP_ROUNDS`) runs the round's
programs and opens the collectives' connections for the first time, at a cost the next rounds do not pay: it is left
out, and the next round follows it at once. A measured cost is noisy (steps on a shared machine scatter by
10% and more), and a pace aimed at the mean would exceed the budget half the time: the pace uses an upper bound of
c, its mean plus two standard errors (from the spread of the rounds' costs and of the steps between rounds), so a
noisy machine spaces rounds further and a steady one gets close to the budget. Until steps between rounds have been
measured, a round is taken to stop training for its whole latency (c = latency). And rounds stay far enough apart
that a few steps between them keep being measured (at least a round's in-round time plus `STEPS_BETWEEN_ROUNDS`
steps). The estimates forget: they use the rounds merged in the last `memory_s` seconds of training (at most the
last `window_rounds`), so one costly round (a busy moment of the machine, a page-fault storm) spaces the rounds
after it further for that long and no longer. With no round left in that memory the next one starts at once and is
measured afresh; so rounds are never more than `memory_s` apart, and one that costs the trainers more than
`memory_s` x `max_overhead` (1 s at the defaults) overruns the budget rather than leave the replicas unsynced.
What the driver feeds it leaves out the steps that carry the training loop's own work (a checkpoint save,
a metric write: `ShadowSync.loop_work`), which are neither a round's cost nor a step's.

Which block an interval belongs to (`BlockClock`): the loop keeps one block in flight (docs/design.md §3), so the
time from one boundary to the next is the device's time for the block dispatched at the boundary before (and what
that boundary put on the device ahead of it), not for the block just dispatched. Blocks cut to different lengths
(a boundary due every quarter of the pace, a log step) made the two differ by up to K times: a block of 16 steps
timed as one of 1 step read steps between rounds 3 times as slow as those in rounds, and spaced rounds by that.

Pure bookkeeping, no clock and no threads: the drivers (`shadow.ShadowSync`, `scheduled.ScheduledShadowSync`) feed
it what they timed.
"""

import collections
import math
from typing import Any, NamedTuple

STEPS_BETWEEN_ROUNDS = 3  # The least interval leaves room for this many steps between rounds.
WARMUP_ROUNDS = 1  # Rounds left out of the estimates: the first runs its programs and opens connections first.
MIN_STEPS_MEASURED = 5  # Steps between rounds before their mean time is trusted.
CONFIDENCE_Z = 2.0  # The pace uses the cost's mean plus this many standard errors (about a 97.5% upper bound).
MEMORY_S = 20.0  # Rounds merged longer ago than this (seconds of training) leave the estimates.
# Blocks after a boundary that handed over a snapshot or merged a round timed as in the round. The loop dispatches
# block i, then (at boundary i) the copy or merge, which the device runs after block i and before block i + 1: block
# i + 1 carries its cost (block i + 2: a margin).
TAIL_BLOCKS = 2


class _Round(NamedTuple):
  """What the training thread timed from one merge to the next."""

  in_round_s: float = 0.0
  in_round_steps: int = 0
  between_s: float = 0.0
  between_sq_s2: float = 0.0  # Sum of the squared step times, for their spread.
  between_steps: int = 0
  latency_s: float = 0.0
  merged_at_s: float = 0.0  # Seconds of training (the steps' times summed) when the round was merged.


class _Window(NamedTuple):
  """Sums over the rounds in the window, so that the pace costs the training thread a few microseconds a step."""

  rounds: int = 0
  in_round_s: float = 0.0
  in_round_steps: int = 0
  in_round_sq_s2: float = 0.0  # Of each round's in-round seconds.
  in_round_s_x_steps: float = 0.0
  in_round_steps_sq: int = 0
  between_s: float = 0.0
  between_sq_s2: float = 0.0
  between_steps: int = 0
  latency_s: float = 0.0


class Pacer:
  """The interval between shadow rounds from their measured cost (module docstring)."""

  def __init__(
    self,
    max_overhead: float,
    fixed_interval_s: float | None = None,
    window_rounds: int = 32,
    memory_s: float = MEMORY_S,
  ):
    """`max_overhead`: the share of the trainers' throughput rounds may cost; `fixed_interval_s`: an interval set
    by hand instead (the pacer then only measures); `window_rounds`: how many recent rounds the estimates use at
    most; `memory_s`: how long (seconds of training) a round stays in them."""
    if not 0 < max_overhead < 1:
      raise ValueError(f'max_overhead={max_overhead} must be in (0, 1).')
    if fixed_interval_s is not None and not fixed_interval_s >= 0:
      raise ValueError(f'fixed_interval_s={fixed_interval_s} must be >= 0 (or None: paced).')
    if window_rounds < 1:
      raise ValueError(f'window_rounds={window_rounds} must be >= 1.')
    if not memory_s > 0:
      raise ValueError(f'memory_s={memory_s} must be > 0.')
    self.memory_s = memory_s
    self.max_overhead, self.fixed_interval_s = max_overhead, fixed_interval_s
    self._rounds: collections.deque[_Round] = collections.deque(maxlen=window_rounds)
    self._window = _Window()
    self._open = _Round()  # The steps since the last merge.
    self._warmup_rounds_left = WARMUP_ROUNDS
    self._elapsed_s = 0.0  # Every step's time, summed: the pacer's clock.

  def observe_step(self, seconds: float, in_round: bool) -> None:
    """A training step took `seconds` (boundary to boundary); `in_round`: a round was in flight or touched it."""
    self.observe_steps(seconds, 1, in_round)

  def observe_steps(self, seconds: float, steps: int, in_round: bool) -> None:
    """A block of `steps` training steps (one dispatch) took `seconds`, each step an equal share of it."""
    r = self._open
    self._elapsed_s += seconds
    if self._rounds and self._rounds[0].merged_at_s < self._elapsed_s - self.memory_s:
      self._forget()
    if in_round:
      self._open = r._replace(in_round_s=r.in_round_s + seconds, in_round_steps=r.in_round_steps + steps)
    else:
      self._open = r._replace(
        between_s=r.between_s + seconds,
        between_sq_s2=r.between_sq_s2 + seconds**2 / steps,
        between_steps=r.between_steps + steps,
      )

  def observe_round(self, latency_s: float) -> None:
    """A round was merged; it took `latency_s` from its snapshot to its result."""
    measured, self._open = self._open._replace(latency_s=latency_s, merged_at_s=self._elapsed_s), _Round()
    if self._warmup_rounds_left:
      self._warmup_rounds_left -= 1
      return
    self._rounds.append(measured)
    self._forget()

  def _forget(self) -> None:
    """Drops the rounds merged more than `memory_s` ago; the window's sums from the rounds left."""
    rounds = self._rounds
    while rounds and rounds[0].merged_at_s < self._elapsed_s - self.memory_s:
      rounds.popleft()
    self._window = _Window(
      rounds=len(rounds),
      in_round_s=sum(r.in_round_s for r in rounds),
      in_round_steps=sum(r.in_round_steps for r in rounds),
      in_round_sq_s2=sum(r.in_round_s**2 for r in rounds),
      in_round_s_x_steps=sum(r.in_round_s * r.in_round_steps for r in rounds),
      in_round_steps_sq=sum(r.in_round_steps**2 for r in rounds),
      between_s=sum(r.between_s for r in rounds),
      between_sq_s2=sum(r.between_sq_s2 for r in rounds),
      between_steps=sum(r.between_steps for r in rounds),
      latency_s=sum(r.latency_s for r in rounds),
    )

  def step_time_s(self) -> float | None:
    """Mean time of a step between rounds, or None until `MIN_STEPS_MEASURED` were."""
    steps = self._window.between_steps + self._open.between_steps
    return (self._window.between_s + self._open.between_s) / steps if steps >= MIN_STEPS_MEASURED else None

  def round_cost_s(self) -> float | None:
    """The trainers' time one round costs (c above), or None before a round and a step time were measured."""
    w, step_s = self._window, self.step_time_s()
    if not w.rounds or step_s is None:
      return None
    return max(0.0, (w.in_round_s - w.in_round_steps * step_s) / w.rounds)

  def round_cost_bound_s(self) -> float | None:
    """The cost's upper bound the pace uses: its mean plus `CONFIDENCE_Z` standard errors, from the spread of the
    rounds' costs and of the steps between rounds (a lone round counts as uncertain as it is large)."""
    w, step_s = self._window, self.step_time_s()
    if not w.rounds or step_s is None:
      return None
    mean_s = (w.in_round_s - w.in_round_steps * step_s) / w.rounds  # Of e_r = in_round_s_r - steps_r x step_s.
    if w.rounds > 1:
      sum_sq = w.in_round_sq_s2 - 2 * step_s * w.in_round_s_x_steps + step_s**2 * w.in_round_steps_sq
      rounds_var = max(0.0, sum_sq - w.rounds * mean_s**2) / (w.rounds - 1) / w.rounds
    else:
      rounds_var = mean_s**2
    steps = w.between_steps + self._open.between_steps
    sum_sq = w.between_sq_s2 + self._open.between_sq_s2
    step_var = max(0.0, sum_sq - steps * step_s**2) / max(1, steps - 1) / steps  # Of the mean step time.
    in_round_steps = w.in_round_steps / w.rounds
    return max(0.0, mean_s + CONFIDENCE_Z * math.sqrt(rounds_var + in_round_steps**2 * step_var))

  def interval_s(self) -> float:
    """The least seconds from one round's start to the next's: `fixed_interval_s` if set; else 0 until a round
    after the warm-up was measured, then the paced interval, `memory_s` at most (a driver that fixes the next
    round's step when it dispatches one, `scheduled`'s, would otherwise keep a costly round's gap past the time
    the estimates forget it, with no round in between to measure afresh)."""
    if self.fixed_interval_s is not None:
      return self.fixed_interval_s
    w = self._window
    if not w.rounds:
      return 0.0
    cost_s, step_s = self.round_cost_bound_s(), self.step_time_s()
    if cost_s is None:  # No step between rounds measured yet: the round may have stopped training throughout.
      return min(self.memory_s, w.latency_s / w.rounds / self.max_overhead)
    paced_s = max(cost_s / self.max_overhead, w.in_round_s / w.rounds + STEPS_BETWEEN_ROUNDS * step_s)
    return min(self.memory_s, paced_s)

  def stats(self) -> dict[str, Any]:
    """sync_interval_s (the pace now), sync_round_cost_s and its bound, step_time_s (between rounds),
    step_time_in_round_s, and sync_overhead_estimate (the share of throughput the recent rounds cost, by the mean
    cost); None where nothing was measured."""
    w, cost_s = self._window, self.round_cost_s()
    period_s = w.in_round_s + w.between_s
    return {
      'sync_interval_s': self.interval_s(),
      'sync_round_cost_s': cost_s,
      'sync_round_cost_bound_s': self.round_cost_bound_s(),
      'step_time_s': self.step_time_s(),
      'step_time_in_round_s': w.in_round_s / w.in_round_steps if w.in_round_steps else None,
      'sync_overhead_estimate': cost_s * w.rounds / period_s if cost_s is not None and period_s else None,
    }


class BlockClock:
  """Feeds a `Pacer` the interval between two block boundaries as the steps of the block it timed (module
  docstring), in a round or between rounds.

    clock.boundary(now, steps, in_flight, waited, paused_s)   # at every boundary, after dispatching a block
    clock.touched()                         # this boundary handed over a snapshot or merged a round
    clock.skip()                            # the loop's own work fills the next interval: it is not timed
  """

  def __init__(self, pacer: Pacer, tail_blocks: int = TAIL_BLOCKS):
    """`tail_blocks`: the blocks dispatched after a hand-over or a merge that are timed as in the round."""
    self._pacer, self._tail_blocks = pacer, tail_blocks
    self.reset()

  def reset(self) -> None:
    """Nothing timed yet: the next boundary starts the first interval."""
    self._last_s: float | None = None
    self._timed_steps = 0  # The block the next interval times (the one dispatched before the last boundary),
    self._timed_in_round = False  # and whether it ran in a round.
    self._tail = 0  # Blocks still to be dispatched that carry a hand-over's or a merge's cost.

  def boundary(self, now: float, steps: int, in_flight: bool, waited: bool = False, paused_s: float = 0.0) -> None:
    """A boundary at `now`, after dispatching a block of `steps`, before this boundary's own work; `in_flight`: a
    round is in flight (since the last boundary's work); `waited`: the loop waited for this block before this
    boundary (the compiling block, 'auto''s probes, a straggler's blocks), so none is in flight; `paused_s`: seconds
    of the interval that were no training (compiling the programs of the K 'auto' chose), left out of it. The
    interval since the last boundary holds the blocks that ended in it: the one in flight then, and this one if it
    was waited for.
    The block just dispatched runs after the last boundary's work: in a round if one was in flight then, or if a
    hand-over or a merge was among that work (or the one before)."""
    in_round = self.in_round(in_flight)
    steps_done, in_round_done = self._timed_steps, self._timed_in_round
    if waited:
      steps_done, in_round_done = steps_done + steps, in_round_done or in_round
    if self._last_s is not None and steps_done:
      self._pacer.observe_steps(max(0.0, now - self._last_s - paused_s), steps_done, in_round=in_round_done)
    self._timed_steps, self._timed_in_round = (0, False) if waited else (steps, in_round)
    self._tail = max(0, self._tail - 1)
    self._last_s = now

  def touched(self) -> None:
    self._tail = self._tail_blocks

  def in_round(self, in_flight: bool) -> bool:
    """Whether the block dispatched next is timed as in a round (`in_flight`: a round is in flight)."""
    return in_flight or self._tail > 0

  def skip(self) -> None:
    """The next interval is not a block's device time (the loop did its own work in it: a save, a metric read): it
    is left out, with the block it would have timed."""
    self._last_s = None
