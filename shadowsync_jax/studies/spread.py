"""A figure over repeated runs (seeds, repeats): its mean and range, and how a table writes them.

figures = spread.mean_and_range({'overhead_pct': [12.1, 15.0, None, 13.2]})   # None: a run without the figure
figures['overhead_pct'], figures['overhead_pct_range']                        # 13.43..., [12.1, 15.0]
spread.span(figures, 'overhead_pct', '{:.2f}%')                               # '13.43% (12.10% to 15.00%)'
modes = spread.by_group(rows, lambda r: r['mode'], lambda runs: {'ne': [r['ne'] for r in runs]})   # per mode
"""

from collections.abc import Callable, Mapping, Sequence
import statistics
from typing import Any


def mean_and_range(figures: Mapping[str, Sequence[float | None]]) -> dict[str, Any]:
  """Per key: `key` the mean of its values and `key_range` [lowest, highest], None values left out (both None when
  none is left)."""
  result: dict[str, Any] = {}
  for key, values in figures.items():
    known = [v for v in values if v is not None]
    result[key] = statistics.fmean(known) if known else None
    result[f'{key}_range'] = [min(known), max(known)] if known else None
  return result


def by_group(
  rows: Sequence[Mapping[str, Any]],
  group: Callable[[Mapping[str, Any]], Any],
  figures: Callable[[list[Mapping[str, Any]]], Mapping[str, Sequence[float | None]]],
) -> dict[Any, dict[str, Any]]:
  """Per group of rows (`group(row)`, in order of first appearance): `mean_and_range` of `figures(its rows)`."""
  groups: dict[Any, dict[str, Any]] = {}
  for name in dict.fromkeys(group(row) for row in rows):
    groups[name] = mean_and_range(figures([row for row in rows if group(row) == name]))
  return groups


def span(figures: Mapping[str, Any], key: str, fmt: str) -> str:
  """'mean (lowest to highest)' of a `mean_and_range` figure, each in `fmt`; '' when it has none."""
  if figures[key] is None:
    return ''
  low, high = figures[f'{key}_range']
  return f'{fmt.format(figures[key])} ({fmt.format(low)} to {fmt.format(high)})'
