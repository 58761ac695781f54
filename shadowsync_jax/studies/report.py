"""A study's result file: its title, the command that produced it, where and when it ran (the commit, whether the
tree was clean, the date, the machine's cores and load: `provenance`), the table, and the raw summaries as JSON.

  report.write('benchmarks/results/gba_study.md', 'GBA study', command, table, rows, root=workdir)

Every study binary (`benchmarks.*`) writes one, so that a table
in the docs can be traced to the run and its raw figures. The configs are left out of the raw summaries (every run
of a study shares one, given by the command).

A docs page shows a result file's command, note and table between two markers, and `write` refreshes every such
block under `docs/` when it writes the file, so the figures in the docs are the ones the study wrote:

  <!-- results: benchmarks/results/gba_study.md -->
  ...                               (written by `write`; `tests/test_docs.py` checks that it matches the file)
  <!-- /results -->

and the README's and the pages' headlines of the file (`headlines`), and the README's time for all the studies
(`reproduce`).
"""

from collections.abc import Mapping, Sequence
import json
import pathlib
import re
import shlex
import sys
from typing import Any

from shadowsync_jax.studies import provenance

DOCS_DIR = pathlib.Path('docs')  # Relative to the repository root, where the study binaries run.
_BLOCK = re.compile(r'(<!-- results: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /results -->)', re.S)


def command_line() -> str:
  """The command this process was started with, as `python -m module flags...`."""
  module = pathlib.Path(sys.argv[0]).with_suffix('')
  parts = module.parts[-2:] if module.parts[-2:-1] in (('experiments',), ('benchmarks',)) else module.parts[-1:]
  return ' '.join(['python -m', '.'.join(parts), *map(shlex.quote, sys.argv[1:])])


def write(
  out: str | pathlib.Path,
  title: str,
  command: str,
  table: str,
  rows: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
  note: str = '',
  root: str | pathlib.Path | None = None,
  docs_dir: str | pathlib.Path = DOCS_DIR,
) -> pathlib.Path:
  """Writes the markdown file `out` and returns its path; `rows` are summaries (a list, or a dict by label). The
  docs pages under `docs_dir` that embed `out` are refreshed."""
  strip = lambda summary: {k: v for k, v in summary.items() if k != 'config'}
  raw = {k: strip(v) for k, v in rows.items()} if isinstance(rows, Mapping) else [strip(r) for r in rows]
  record = provenance.collect(command)
  parts = [
    f'# {title}',
    f'`{command}`',
    provenance.line(record),
    *([note] if note else []),
    table,
    *([f'Runs in {root}.'] if root is not None else []),
    f'<details><summary>raw summaries</summary>\n\n```json\n{json.dumps(raw, indent=1, default=str)}\n```\n</details>',
    provenance.comment(record),
  ]
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text('\n\n'.join(parts) + '\n')
  refresh_docs(docs_dir, only=out)
  if pathlib.Path(docs_dir).resolve() == (provenance.REPO_ROOT / DOCS_DIR).resolve():  # Not a scratch page.
    from shadowsync_jax.studies import headlines  # pylint: disable=g-import-not-at-top  (it reads result files)
    from shadowsync_jax.studies import reproduce  # pylint: disable=g-import-not-at-top  (it reads result files)

    headlines.refresh(only=out)
    if out.resolve().is_relative_to((provenance.REPO_ROOT / reproduce.RESULTS_DIR).resolve()):
      reproduce.refresh_readme()  # A study's time, where a study's result was written.
  return out


LEFT_IN_THE_FILE = '*Each run, and the raw figures: in the result file.*'


def shown_in_docs(result_text: str) -> str:
  """What a docs page shows of a result file: what lies between its title and the raw summaries (the command, the
  note, the tables), but where its runs were, and the detail a page has no room for: a table right after a table
  (each run of the one before), and code blocks (figures for programs) with the line that introduces them; a line
  says they are in the file (`LEFT_IN_THE_FILE`)."""
  body = result_text.split('\n\n', 1)[1].split('<details>', 1)[0]
  parts, fence = [], None  # Blank-line separated parts, a code block (which may hold blank lines) kept whole.
  for part in body.split('\n\n'):
    if fence is not None:
      parts[-1] += '\n\n' + part
      fence = None if part.count('```') % 2 else fence
    else:
      parts.append(part)
      fence = part if part.startswith('```') and part.count('```') % 2 else None
  kept, left_out = [], False
  for part in parts:
    if not part.strip() or part.startswith('Runs in '):
      continue
    if part.startswith('```') or (part.startswith('|') and kept and kept[-1].startswith('|')):
      left_out = True
      if part.startswith('```') and kept and kept[-1].rstrip().endswith(':'):
        kept.pop()  # The line that introduces the code block.
      continue
    kept.append(part)
  if left_out:
    kept.append(LEFT_IN_THE_FILE)
  return '\n\n'.join(kept).strip() + '\n'


def embedded_blocks(page: str) -> list[tuple[str, str]]:
  """(result file path, the block's text) for every results block of a docs page."""
  return [(match.group('path'), match.group('body')) for match in _BLOCK.finditer(page)]


def refresh_docs(docs_dir: str | pathlib.Path = DOCS_DIR, only: str | pathlib.Path | None = None) -> list[pathlib.Path]:
  """Rewrites the results blocks of the docs pages under `docs_dir` (those of `only`, if given) from their result
  files, paths relative to the directory that holds `docs_dir`; returns the pages changed."""
  docs_dir = pathlib.Path(docs_dir)
  root, changed = docs_dir.parent, []
  for page in sorted(docs_dir.rglob('*.md')) if docs_dir.is_dir() else []:
    text = page.read_text()

    def block(match: re.Match) -> str:
      path = root / match.group('path')
      if (only is not None and path.resolve() != pathlib.Path(only).resolve()) or not path.exists():
        return match.group(0)
      return match.group(1) + shown_in_docs(path.read_text()) + match.group(4)

    new = _BLOCK.sub(block, text)
    if new != text:
      page.write_text(new)
      changed.append(page)
  return changed
