"""Reading a result file that `report.write` wrote: the raw summaries it holds and the command that wrote it.

rows = result_files.read_rows('benchmarks/results/stragglers.md')
result_files.command_of('benchmarks/results/stragglers.md')   # 'python -m benchmarks.stragglers'
"""

import json
import pathlib
from typing import Any


def read_rows(out: str | pathlib.Path) -> Any:
  """The raw summaries a result file holds (what `write` was given as `rows`, configs left out)."""
  text = pathlib.Path(out).read_text()
  raw = text.split('<summary>raw summaries</summary>', 1)[-1]  # A file may hold other JSON blocks before it.
  return json.loads(raw.split('```json\n', 1)[1].split('\n```', 1)[0])


def command_of(out: str | pathlib.Path) -> str:
  """The command a result file says wrote it (the first line in backticks after its title)."""
  text = pathlib.Path(out).read_text()
  return text.split('\n\n', 1)[1].split('\n\n', 1)[0].strip().strip('`')
