"""A study's result file: its title, the command that produced it, the table, and the raw summaries as JSON.

  study_report.write('benchmarks/results/gba_study.md', 'GBA study', command, table, rows, root=workdir)

Every study binary (`experiments.gba_study`, `experiments.recovery`, `benchmarks.sync_study`,
`benchmarks.stragglers`) writes one, so that a table in the README can be traced to the run and its raw figures.
The configs are left out of the raw summaries (every run of a study shares one, given by the command).
"""

import json
import pathlib
import sys
from typing import Any, Mapping, Sequence


def command_line() -> str:
  """The command this process was started with, as `python -m module flags...`."""
  module = pathlib.Path(sys.argv[0]).with_suffix('')
  parts = module.parts[-2:] if module.parts[-2:-1] in (('experiments',), ('benchmarks',)) else module.parts[-1:]
  return ' '.join(['python -m', '.'.join(parts), *sys.argv[1:]])


def write(out: str | pathlib.Path, title: str, command: str, table: str,
          rows: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]], note: str = '',
          root: str | pathlib.Path | None = None) -> pathlib.Path:
  """Writes the markdown file `out` and returns its path; `rows` are summaries (a list, or a dict by label)."""
  strip = lambda summary: {k: v for k, v in summary.items() if k != 'config'}
  raw = {k: strip(v) for k, v in rows.items()} if isinstance(rows, Mapping) else [strip(r) for r in rows]
  parts = [f'# {title}', f'`{command}`', *([note] if note else []), table,
           *([f'Runs in {root}.'] if root is not None else []),
           f'<details><summary>raw summaries</summary>\n\n```json\n{json.dumps(raw, indent=1, default=str)}\n```\n'
           '</details>']
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text('\n\n'.join(parts) + '\n')
  return out
