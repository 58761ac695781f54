"""Does partial recovery pay? CPR's first mechanism: the expected overhead of full and of partial recovery, and the
choice between them (`recovery.mode='cpr'`).

  choice = cost_model.choose(save_cost_steps=3.3, full_restore_steps=7.0, partial_restore_steps=5.0,
                             mtbf_steps=1200, num_parts=8, target_pls=0.02, total_steps=7812,
                             priority_cost_steps=0.4, priority_every_steps=97)
  choice.mode, choice.why          # 'partial', 'partial recovery is expected to cost 1.2% against 8.3% for full ...'

Maeng et al., "CPR: Understanding and Improving Failure Tolerant Training for Deep Learning Recommendation with
Partial Recovery" (MLSys 2021, arXiv:2011.02999) recover partially only where it pays: partial recovery saves as
rarely as its PLS target allows and trains nothing twice, but a strict target or frequent failures make it save
more often than full recovery would. In training steps, for a run of T steps, MTBF M, a save blocking S, a restore
L and a restart R (the cost of bringing a failed process back; 0 for an emulated failure):

  full:     every Young's interval k_f = sqrt(2 S M); each failure restores (L_full + R) and re-trains the steps
            since the checkpoint: `intervals.expected_full_recovery_overhead`, exact for the failure schedule
  partial:  every k_p, the longest interval whose expected PLS stays under the target; each failure restores the
            failed part (L_partial + R); nothing is re-trained; priority saves (CPR-MFU/SSU) add their own cost
            = ((T - 1) // k_p * S + priority saves * S_priority + T / M * (L_partial + R)) / T

Partial recovery is chosen when its expected overhead is the smaller (and the PLS target is reachable at all).
"""

import math
from typing import NamedTuple

from shadowsync_jax.recovery import intervals


class Choice(NamedTuple):
  """CPR's decision and what it rests on (overheads as fractions of the failure-free time)."""

  mode: str  # 'full' or 'partial'
  full_interval_steps: int
  full_overhead: float
  partial_interval_steps: int | None  # None: the PLS target is unreachable.
  partial_overhead: float | None
  why: str

  def to_dict(self) -> dict:
    return {
      'chosen': self.mode,
      'full_interval_steps': self.full_interval_steps,
      'expected_full_overhead_pct': 100 * self.full_overhead,
      'partial_interval_steps': self.partial_interval_steps,
      'expected_partial_overhead_pct': None if self.partial_overhead is None else 100 * self.partial_overhead,
      'why': self.why,
    }


def expected_partial_recovery_overhead(
  interval_steps: int,
  save_cost_steps: float,
  restore_cost_steps: float,
  mtbf_steps: float,
  total_steps: int,
  priority_cost_steps: float = 0.0,
  priority_every_steps: int | None = None,
) -> float:
  """Expected cost of partial recovery as a fraction of the failure-free run's T steps (module docstring).

  `restore_cost_steps` is everything one failure costs the run besides lost samples (a partial restore, and a
  restart where a process has to come back). Priority saves fall every `priority_every_steps` steps but where a
  full save falls.
  """
  if interval_steps < 1 or total_steps < 1 or not mtbf_steps > 0:
    raise ValueError(
      f'need interval_steps, total_steps >= 1 and mtbf_steps > 0; got {interval_steps}, {total_steps}, {mtbf_steps}.'
    )
  saves = (total_steps - 1) // interval_steps
  priority_saves = 0
  if priority_every_steps:
    priority_saves = (total_steps - 1) // priority_every_steps - (total_steps - 1) // math.lcm(
      priority_every_steps, interval_steps
    )
  failures = total_steps / mtbf_steps
  cost = saves * save_cost_steps + priority_saves * priority_cost_steps + failures * restore_cost_steps
  return cost / total_steps


def choose(
  save_cost_steps: float,
  full_restore_steps: float,
  partial_restore_steps: float,
  mtbf_steps: float,
  num_parts: int,
  target_pls: float,
  total_steps: int,
  restart_steps: float = 0.0,
  min_full_interval_steps: int = 1,
  priority_cost_steps: float = 0.0,
  priority_fraction_of_interval: float | None = None,
) -> Choice:
  """Full or partial recovery, whichever is expected to cost less (module docstring); costs in training steps.

  `min_full_interval_steps`: no shorter than a save takes to be written. `priority_fraction_of_interval`: priority
  saves every that fraction of the partial interval (CPR-MFU/SSU's quarter), costing `priority_cost_steps` each.
  """
  full_interval = max(min_full_interval_steps, intervals.young_interval_steps(save_cost_steps, mtbf_steps, total_steps))
  full = intervals.expected_full_recovery_overhead(
    full_interval, save_cost_steps, full_restore_steps + restart_steps, mtbf_steps, total_steps
  )
  try:
    partial_interval = intervals.partial_recovery_interval(target_pls, mtbf_steps, num_parts, total_steps)
  except ValueError:
    why = (
      f'partial recovery cannot hold the PLS target {target_pls:g} at an MTBF of {mtbf_steps:g} steps over '
      f'{num_parts} parts; full recovery is expected to cost {100 * full:.1f}% (a checkpoint every {full_interval} '
      'steps).'
    )
    return Choice('full', full_interval, full, None, None, why)
  priority_every = None
  if priority_fraction_of_interval:
    priority_every = max(1, int(partial_interval * priority_fraction_of_interval))
  partial = expected_partial_recovery_overhead(
    partial_interval,
    save_cost_steps,
    partial_restore_steps + restart_steps,
    mtbf_steps,
    total_steps,
    priority_cost_steps,
    priority_every,
  )
  mode = 'partial' if partial < full else 'full'
  why = (
    f'{mode} recovery is expected to cost less: partial {100 * partial:.1f}% (a checkpoint every '
    f'{partial_interval} steps to hold PLS under {target_pls:g}) against full {100 * full:.1f}% (every '
    f"{full_interval} steps, Young's interval), at an MTBF of {mtbf_steps:g} steps and a save blocking "
    f'{save_cost_steps:.2f} steps.'
  )
  return Choice(mode, full_interval, full, partial_interval, partial, why)
