"""How often to checkpoint (docs/design.md §7): Young's interval for full recovery, the PLS bound for partial recovery.

  save_cost_steps = checkpoint_interval.steps_from_seconds(measured_save_s, step_time_s)
  full_every = checkpoint_interval.young_interval_steps(save_cost_steps, mtbf_steps, total_steps)
  partial_every = checkpoint_interval.partial_recovery_interval(target_pls=0.01, mtbf_steps=mtbf_steps,
                                                                num_parts=num_shards, total_steps=total_steps)
  estimated = checkpoint_interval.expected_pls(partial_every, mtbf_steps, num_shards, total_steps)
  lost_S = checkpoint_interval.lost_steps(schedule_failures, completed_checkpoint_steps)
  actual = checkpoint_interval.measured_pls(lost_S, num_shards, total_steps)

Units are training steps throughout (convert seconds with `steps_from_seconds`), on the clock of
`failures.FailureSchedule`: failures strike while a step runs, the loop handles them at the step's end, before a
checkpoint due there is saved; a checkpoint "at step c" holds the state after c steps, and the initial state
counts as a checkpoint at step 0.

PLS, the portion of lost samples (Maeng et al., "CPR", MLSys 2021, arXiv:2011.02999): under partial recovery a
failed part (one of N replicas or embedding shards) reloads the last checkpoint c, losing its updates of steps
c+1..s, a fraction 1/N of those steps' samples; a second failure of the same part before the next checkpoint
loses only the steps since the first. PLS = (sum over failures of newly lost steps) / (N * total steps).

Expected PLS. Each part fails independently, Poisson with rate mu = 1 / (N * mtbf) per step (the schedule's
failures thinned by the uniform target), so a step sees at least one failure of it with probability 1 - e^-mu.
Over an interval of L steps a part loses the steps up to its last failure there, on average

  g(L) = sum_{i=1..L} P(a failure in steps i..L) = L - e^-mu (1 - e^-(mu L)) / (1 - e^-mu),

and with T = q k + r (q whole intervals of k steps, one of r),

  E[PLS] = (q g(k) + g(r)) / T  ~=  (k + 1) / (2 N mtbf)   (k divides T, k << N mtbf),

the first-order form being CPR's estimate k / (2 N mtbf) in discrete steps: each of T / mtbf failures loses on
average half an interval of one part's updates. E[PLS] grows with k, so the longest interval under a target is
found by bisection.
"""

import bisect
from collections.abc import Sequence
import math

from shadowsync_jax.recovery.failures import Failure


def steps_from_seconds(seconds: float, step_time_s: float) -> float:
  """A duration in training steps of `step_time_s` seconds each (a save cost, an MTBF in seconds)."""
  if not step_time_s > 0:
    raise ValueError(f'step_time_s={step_time_s} must be positive.')
  return seconds / step_time_s


def young_interval(save_cost: float, mtbf: float) -> float:
  """Young's optimal interval between full checkpoints, sqrt(2 save_cost mtbf), in the units of its arguments.

  J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974: it minimizes
  save_cost / k + k / (2 mtbf), the time per unit of work spent saving plus re-training half an interval per
  failure. `save_cost` is the time the training loop is blocked by one save, not the whole async write.
  """
  if save_cost < 0 or not mtbf > 0:
    raise ValueError(f'need save_cost >= 0 and mtbf > 0; got {save_cost}, {mtbf}.')
  return math.sqrt(2.0 * save_cost * mtbf)


def young_interval_steps(save_cost_steps: float, mtbf_steps: float, total_steps: int) -> int:
  """Young's interval rounded to whole steps, between 1 and the run length."""
  return min(max(1, round(young_interval(save_cost_steps, mtbf_steps))), max(1, total_steps))


def _expected_lost_in_interval(length: int, rate: float) -> float:
  """g(L): expected steps one part loses over an interval of L steps when it fails at `rate` per step."""
  if length <= 0:
    return 0.0
  # L - e^-mu (1 - e^-(mu L)) / (1 - e^-mu), with expm1 for accuracy at small mu.
  return length - math.exp(-rate) * math.expm1(-rate * length) / math.expm1(-rate)


def expected_pls(interval_steps: int, mtbf_steps: float, num_parts: int, total_steps: int) -> float:
  """Expected portion of lost samples of partial recovery with a checkpoint every `interval_steps` steps.

  Exact for the discrete schedule of `failures.FailureSchedule` (see the module docstring); an interval longer
  than the run means the only checkpoint is the initial state.
  """
  if interval_steps < 1 or num_parts < 1 or total_steps < 1 or not mtbf_steps > 0:
    raise ValueError(
      f'need interval_steps, num_parts, total_steps >= 1 and mtbf_steps > 0; got '
      f'{interval_steps}, {num_parts}, {total_steps}, {mtbf_steps}.'
    )
  rate = 1.0 / (num_parts * mtbf_steps)
  whole, rest = divmod(total_steps, interval_steps)
  lost = whole * _expected_lost_in_interval(interval_steps, rate) + _expected_lost_in_interval(rest, rate)
  return lost / total_steps


def partial_recovery_interval(target_pls: float, mtbf_steps: float, num_parts: int, total_steps: int) -> int:
  """The longest interval (in steps, at most `total_steps`) whose expected PLS stays at or under `target_pls`.

  CPR's interval selection: partial recovery trades lost updates for saves, so it saves as rarely as the accuracy
  budget allows. Raises ValueError when even a checkpoint every step exceeds the target.
  """
  pls = lambda k: expected_pls(k, mtbf_steps, num_parts, total_steps)
  if pls(1) > target_pls:
    raise ValueError(
      f'target_pls={target_pls} is unreachable: a checkpoint every step already loses an expected '
      f'{pls(1):.3g} of the samples (mtbf_steps={mtbf_steps}, num_parts={num_parts}).'
    )
  good, bad = 1, total_steps + 1  # pls(good) <= target; bad is past the cap or over the target.
  while bad - good > 1:
    middle = (good + bad) // 2
    if pls(middle) <= target_pls:
      good = middle
    else:
      bad = middle
  return good


def survivor_copy_interval(target_pls: float, mtbf_steps: float, num_parts: int, total_steps: int) -> int | None:
  """The longest interval (in steps) between copies of a survivor's state whose expected PLS stays at or under
  `target_pls` (None: one part, no survivors).

  In a job of processes a survivor whose collectives wait for a dead peer keeps only its newest copy of its state
  (a checkpoint, or a live copy: `live_state`) and loses the steps since it, skipped when the job goes on: the
  same loss as a failed part's, struck whenever any of the other N - 1 parts fails, at (N - 1) / (N mtbf) per
  step, so `expected_pls` with that rate. Held to the same target as the checkpoint interval (the failed part's),
  the survivors' own loss is at most `target_pls` more.
  """
  if num_parts < 2:
    return None
  try:
    return partial_recovery_interval(target_pls, mtbf_steps / (num_parts - 1), num_parts, total_steps)
  except ValueError:  # Unreachable even copying every step: as often as the copies' budget allows.
    return 1


def budget_interval_steps(cost_s: float, step_s: float, max_overhead: float, least_steps: int) -> int:
  """Steps between saves that cost `cost_s` each (in threads beside training) so that they take at most
  `max_overhead` of the time at `step_s` a step, and never fewer than `least_steps` (CPR-MFU/SSU's priority saves:
  `recovery.real`)."""
  if not (cost_s >= 0 and step_s > 0 and max_overhead > 0):
    raise ValueError(f'need cost_s >= 0, step_s > 0, max_overhead > 0; got {cost_s}, {step_s}, {max_overhead}.')
  return max(least_steps, math.ceil(cost_s / (max_overhead * step_s)))


def lost_steps(failures: Sequence[Failure], checkpoint_steps: Sequence[int]) -> list[int]:
  """Steps of its part's updates each failure newly loses under partial recovery, in the order of `failures`.

  `failures` in step order; `checkpoint_steps`: the steps of the checkpoints the failed part could reload (the
  initial state counts as one at step 0). A failure at step s reloads the newest checkpoint c < s (one saved at s
  comes after it) and loses steps max(c, the part's previous failure) + 1 .. s.
  """
  checkpoints = sorted(set(checkpoint_steps) | {0})
  last_failure: dict[tuple[str, int], int] = {}
  lost = []
  for failure in failures:
    checkpoint = checkpoints[bisect.bisect_left(checkpoints, failure.step) - 1]
    start = max(checkpoint, last_failure.get((failure.kind, failure.index), 0))
    if failure.step < start:
      raise ValueError(f'failures must come in step order; {failure} comes after one at step {start}.')
    lost.append(failure.step - start)
    last_failure[(failure.kind, failure.index)] = failure.step
  return lost


def measured_pls(lost_steps_per_failure: Sequence[int], num_parts: int, total_steps: int) -> float:
  """The PLS of a run: lost part-steps over all samples, each lost step of one part being 1/N of its samples."""
  if num_parts < 1 or total_steps < 1:
    raise ValueError(f'need num_parts >= 1 and total_steps >= 1; got {num_parts}, {total_steps}.')
  return float(sum(lost_steps_per_failure)) / (num_parts * total_steps)


def expected_full_recovery_overhead(
  interval_steps: int, save_cost_steps: float, restore_cost_steps: float, mtbf_steps: float, total_steps: int
) -> float:
  """Expected cost of full recovery as a fraction of the failure-free run's T steps.

  Every failure rewinds to the last checkpoint, so an interval of L steps is retried until L steps in a row see
  no failure (probability q = e^-(1/mtbf) each): expected steps executed (1 - q^L) / ((1 - q) q^L), failed tries
  q^-L - 1, each costing a restore. Add one save per checkpoint strictly inside the run (the final save is common
  to every run). To first order: save_cost / k + ((k + 1) / 2 + restore_cost) / mtbf, minimized near Young's k.
  """
  if interval_steps < 1 or total_steps < 1 or not mtbf_steps > 0:
    raise ValueError(
      f'need interval_steps, total_steps >= 1 and mtbf_steps > 0; got {interval_steps}, {total_steps}, {mtbf_steps}.'
    )
  log_q = -1.0 / mtbf_steps

  def extra_cost(length: int) -> float:  # re-trained steps + restores of one interval
    if length <= 0:
      return 0.0
    retries = math.expm1(-log_q * length)  # q^-L - 1
    executed = retries / -math.expm1(log_q)  # (q^-L - 1) / (1 - q) = (1 - q^L) / ((1 - q) q^L)
    return executed - length + retries * restore_cost_steps

  whole, rest = divmod(total_steps, interval_steps)
  saves = (total_steps - 1) // interval_steps
  return (whole * extra_cost(interval_steps) + extra_cost(rest) + saves * save_cost_steps) / total_steps
