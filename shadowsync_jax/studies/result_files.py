"""Reading a result file that `report.write` wrote: the raw summaries it holds and the command that wrote it; and
what a study's headline (its `headline(path)`, quoted by `headlines`) is built of: the file's rows, read by its path
in the repository, and the verdicts against the study's targets.

rows = result_files.read_rows('benchmarks/results/stragglers.md')
result_files.command_of('benchmarks/results/stragglers.md')   # 'python -m benchmarks.stragglers'
result_files.verdict(0.93, 0.97, 0.95)                         # 'within noise'
"""

import json
import pathlib
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def read_rows(out: str | pathlib.Path) -> Any:
  """The raw summaries a result file holds (what `write` was given as `rows`, configs left out)."""
  text = pathlib.Path(out).read_text()
  raw = text.split('<summary>raw summaries</summary>', 1)[-1]  # A file may hold other JSON blocks before it.
  return json.loads(raw.split('```json\n', 1)[1].split('\n```', 1)[0])


def command_of(out: str | pathlib.Path) -> str:
  """The command a result file says wrote it (the first line in backticks after its title)."""
  text = pathlib.Path(out).read_text()
  return text.split('\n\n', 1)[1].split('\n\n', 1)[0].strip().strip('`')


def rows(path: str) -> Any:
  """`read_rows` of the result file at `path`, relative to the repository (as the headlines name them)."""
  return read_rows(REPO_ROOT / path)


def pct(value: float) -> str:
  return f'{value:+.2f}%'


def verdict(low: float, high: float, target: float, higher_is_better: bool = True) -> str:
  """'met' where the interval clears the target, 'within noise' where it holds it, else 'not met'."""
  if not higher_is_better:
    low, high, target = -high, -low, -target
  return 'met' if low >= target else 'within noise' if high >= target else 'not met'


def runs_verdict(values: list[float], bound: float) -> str:
  """A bound every run must keep (each run's NE, each restart): 'met' where all do, else how many do not."""
  over = sum(v > bound for v in values)
  return 'met by every run' if not over else f'not met by {over} of {len(values)} runs'
