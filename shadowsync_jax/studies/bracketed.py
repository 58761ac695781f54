"""Runs bracketed by a reference: each run's throughput read against the reference runs just before and after it.

  order = bracketed.run_order('none', ['sync_sgd', 'fr_ma', 'fr_ma'])   # none, sync_sgd, none, fr_ma, none, fr_ma, none
  speeds = [run(algorithm) for algorithm in order]                       # examples/sec of each run, in that order
  bracketed.ratios(order, speeds, 'none')                                # [1.0, s1 / mean(s0, s2), 1.0, ...]

On a shared machine the examples/sec of the same job drift by 10-30% over minutes, more than the few percent a
background thread costs; runs minutes apart cannot be compared. A run compared with the mean of its two
neighbours, both of the reference, meets the same load, and a steady drift cancels to first order.
"""

from collections.abc import Sequence


def run_order(reference: str, others: Sequence[str]) -> list[str]:
  """`others` in their order, each between two runs of `reference`; [reference] alone if there are no others."""
  order = [reference]
  for other in others:
    order += [other, reference]
  return order


def ratios(order: Sequence[str], speeds: Sequence[float], reference: str) -> list[float | None]:
  """Per run: its speed over the mean of the reference runs just before and after it; 1.0 for a reference run;
  None for a run without a reference on both sides."""
  if len(order) != len(speeds):
    raise ValueError(f'{len(order)} runs in the order, {len(speeds)} speeds.')
  result = []
  for i, name in enumerate(order):
    if name == reference:
      result.append(1.0)
    elif 0 < i < len(order) - 1 and order[i - 1] == order[i + 1] == reference:
      result.append(speeds[i] / ((speeds[i - 1] + speeds[i + 1]) / 2))
    else:
      result.append(None)
  return result
