"""Rerunning the studies: which commands wrote the result files, which of them are stale, and how long each took.

  for study in reproduce.studies('benchmarks/results'):
    print(study.command, study.stale, study.elapsed_s)
  reproduce.run(reproduce.selected(studies, only=('sync_study',)))   # each command, one after the other
  reproduce.refresh_readme()   # the README's line on how long all of them take, from the result files

A study is one command and the result files it wrote (a command may write several: a page's table and its CSV).
It is stale when any of its files is (`staleness`); its time is what the command took when it wrote them
(`provenance`'s `elapsed_s`, recorded since 2026-12-06: a file written before says nothing, and counts as not
timed). Commands run in the repository's root with this Python, one at a time, since a study's speed figures are
worth what the machine was quiet.
"""

from collections.abc import Callable, Iterable, Sequence
import dataclasses
import pathlib
import re
import shlex
import subprocess
import sys

from shadowsync_jax.studies import provenance
from shadowsync_jax.studies import staleness

RESULTS_DIR = 'benchmarks/results'
README = 'README.md'
_README_BLOCK = re.compile(r'(<!-- reproduce: time -->)(?P<body>.*?)(<!-- /reproduce -->)', re.S)


@dataclasses.dataclass(frozen=True)
class Study:
  command: str  # As the result files record it: 'python -m benchmarks.sync_study --seeds=0,1'.
  paths: tuple[str, ...]  # The result files it wrote, relative to the repository.
  stale: bool  # Any of them is.
  elapsed_s: float | None  # What the command took when it wrote them (None: not recorded).

  @property
  def name(self) -> str:
    """Its first result file's name without the suffix: what `--only` selects."""
    return pathlib.PurePath(self.paths[0]).stem


def studies(
  results_dir: str | pathlib.Path = RESULTS_DIR, repo: pathlib.Path = provenance.REPO_ROOT, stale: bool = True
) -> list[Study]:
  """Every command that wrote a result file under `results_dir`, in the order of its first file's path. A file
  with no provenance record cannot be rerun from itself, and is left out. `stale=False`: without asking git which
  are stale (seconds for every file; `Study.stale` is then False)."""
  by_command: dict[str, list[tuple[str, float | None]]] = {}
  for path in staleness.result_paths(results_dir, repo):
    record = provenance.read(path.read_text())
    if record is not None:
      relative = path.resolve().relative_to(repo.resolve()).as_posix()
      by_command.setdefault(record['command'], []).append((relative, record.get('elapsed_s')))
  found = []
  for command, files in by_command.items():
    times = [elapsed for _, elapsed in files if elapsed is not None]
    paths = tuple(path for path, _ in files)
    is_stale = stale and any(staleness.entry(repo / path, repo).stale for path in paths)
    found.append(Study(command, paths, is_stale, max(times) if times else None))
  return sorted(found, key=lambda study: study.paths[0])


def selected(found: Sequence[Study], only: Iterable[str] = (), every: bool = False) -> list[Study]:
  """The studies to rerun: those named in `only` (by `Study.name`), else every one if `every`, else the stale ones.
  A name that is no study's raises ValueError with the names there are."""
  only = list(only)
  names = {study.name: study for study in found}
  unknown = [name for name in only if name not in names]
  if unknown:
    raise ValueError(f'no study named {", ".join(unknown)}; there are: {", ".join(sorted(names))}')
  if only:
    return [names[name] for name in only]
  return [study for study in found if every or study.stale]


def argv(command: str, python: str = sys.executable) -> list[str]:
  """The command as a process's argv, run by `python` (the recorded command starts with 'python')."""
  parts = shlex.split(command)
  if not parts or parts[0] != 'python':
    raise ValueError(f'not a python command: {command!r}')
  return [python, *parts[1:]]


def run(
  chosen: Sequence[Study],
  repo: pathlib.Path = provenance.REPO_ROOT,
  runner: Callable[[list[str], pathlib.Path], int] | None = None,
  say: Callable[[str], None] = print,
) -> list[Study]:
  """Runs each study's command in `repo`, one after the other, their output to this process's; returns those that
  failed (every one is tried)."""
  runner = runner or (lambda args, cwd: subprocess.run(args, cwd=cwd, check=False).returncode)
  failed = []
  for number, study in enumerate(chosen, 1):
    say(f'[{number}/{len(chosen)}] {study.command}  (last time: {describe_time(study.elapsed_s)})')
    code = runner(argv(study.command), repo)
    if code != 0:
      say(f'[{number}/{len(chosen)}] failed with exit status {code}: {study.command}')
      failed.append(study)
  return failed


def describe_time(elapsed_s: float | None) -> str:
  if elapsed_s is None:
    return 'not recorded'
  minutes = elapsed_s / 60
  return f'{minutes:.0f} min' if minutes >= 1 else f'{elapsed_s:.0f} s'


def listing(found: Sequence[Study]) -> str:
  """A line a study: its name, whether stale, its last time, its command; then the totals."""
  lines = [
    f'{study.name:32} {"STALE  " if study.stale else "current"} {describe_time(study.elapsed_s):>13}  {study.command}'
    for study in found
  ]
  stale = [study for study in found if study.stale]
  stale_s = sum(study.elapsed_s or 0.0 for study in stale)
  return '\n'.join([*lines, total_line(found), f'{len(stale)} stale: {stale_s / 3600:.1f} h of what was timed.'])


def total_line(found: Sequence[Study]) -> str:
  """How long all the studies take, from the times their result files recorded (module docstring): what the
  README says (whatever is stale, so that a change to the code does not change it)."""
  timed = [study.elapsed_s for study in found if study.elapsed_s is not None]
  line = f'{len(found)} studies; {len(timed)} timed when they last ran, {sum(timed) / 3600:.1f} h together'
  untimed = len(found) - len(timed)
  return line + (f', {untimed} not timed yet (written before times were recorded)' if untimed else '')


def refresh_readme(repo: pathlib.Path = provenance.REPO_ROOT, results_dir: str = RESULTS_DIR) -> bool:
  """Rewrites the README's `<!-- reproduce: time -->...<!-- /reproduce -->` from the result files; whether it
  changed."""
  readme = repo / README
  text = readme.read_text()
  line = total_line(studies(results_dir, repo, stale=False))
  new = _README_BLOCK.sub(lambda m: m.group(1) + line + m.group(3), text)
  if new != text:
    readme.write_text(new)
  return new != text


def readme_block(repo: pathlib.Path = provenance.REPO_ROOT) -> str | None:
  """What the README's block says now (None: it has none)."""
  match = _README_BLOCK.search((repo / README).read_text())
  return None if match is None else match.group('body')
