"""Which results are stale: for each result file, the code it measures that changed since it was written, and the
commits that changed it.

  for entry in staleness.check('benchmarks/results'):
    print(staleness.describe(entry))

A result file written with a provenance record (`provenance`) names the files it measures and their content then:
it is stale where one of them differs now in its code (a change to comments or docstrings only measures nothing
new), and the commits since its commit that touched those files say why. A
file written before records were kept is dated by its last commit and read against the whole library and its
binaries (`LEGACY_CODE`): every commit since that touched them is listed, a coarser reading that it says it is.
"""

import ast
from collections.abc import Iterator
import pathlib
import subprocess
from typing import NamedTuple

from shadowsync_jax.studies import provenance

LEGACY_CODE = ('shadowsync_jax', 'experiments', 'benchmarks')
RESULT_SUFFIXES = ('.md', '.csv')


class Entry(NamedTuple):
  path: str  # Relative to the repository.
  commit: str | None  # Where it was written (a legacy file: its last commit); None: never committed.
  recorded: bool  # Whether it holds a provenance record.
  changed_files: tuple[str, ...]  # Measured files that differ now from what it measured.
  commits: tuple[str, ...]  # '<hash> <date> <subject>' of the commits since `commit` that touched them.

  @property
  def stale(self) -> bool:
    return bool(self.changed_files)


def _commits_since(commit: str, paths: list[str], repo: pathlib.Path) -> tuple[str, ...]:
  if not paths:
    return ()
  out = provenance.git('log', '--format=%h %ad %s', '--date=short', f'{commit}..HEAD', '--', *paths, repo=repo)
  return tuple(line for line in out.splitlines() if line)


def entry(path: pathlib.Path, repo: pathlib.Path = provenance.REPO_ROOT) -> Entry:
  """What is known of one result file's freshness."""
  relative = path.resolve().relative_to(repo).as_posix()
  record = provenance.read(path.read_text())  # A CSV holds it in a comment line above its header.
  if record is not None:
    now = provenance.blob_hashes(sorted(record['measures']), repo)
    changed = [p for p, digest in record['measures'].items() if now[p] != digest and not _same_code(repo, p, digest)]
    return Entry(
      relative, record['commit'], True, tuple(sorted(changed)), _commits_since(record['commit'], changed, repo)
    )
  commit = provenance.git('log', '-1', '--format=%H', '--', relative, repo=repo).strip() or None
  if commit is None:
    return Entry(relative, None, False, (), ())
  commits = _commits_since(commit, list(LEGACY_CODE), repo)
  changed = provenance.git('diff', '--name-only', commit, 'HEAD', '--', *LEGACY_CODE, repo=repo).split()
  return Entry(relative, commit, False, tuple(p for p in changed if p.endswith('.py')), commits)


def _code(text: str) -> str:
  """A Python file's code without its comments and docstrings."""
  tree = ast.parse(text)
  for node in ast.walk(tree):
    body = getattr(node, 'body', None)
    if (
      isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
      and body
      and isinstance(body[0], ast.Expr)
      and isinstance(body[0].value, ast.Constant)
      and isinstance(body[0].value.value, str)
    ):
      node.body = body[1:] or [ast.Pass()]
  return ast.dump(tree)


def _same_code(repo: pathlib.Path, path: str, old_blob: str) -> bool:
  """Whether a measured Python file differs from its recorded content in comments and docstrings only."""
  if not path.endswith('.py') or not old_blob or not (repo / path).exists():
    return False
  try:
    old = provenance.git('cat-file', '-p', old_blob, repo=repo)
    return _code(old) == _code((repo / path).read_text())
  except (OSError, SyntaxError, subprocess.CalledProcessError):  # An uncommitted blob git never stored.
    return False


def result_paths(results_dir: str | pathlib.Path, repo: pathlib.Path = provenance.REPO_ROOT) -> list[pathlib.Path]:
  """Every result file under `results_dir` (relative to `repo` unless absolute), in path order."""
  root = pathlib.Path(results_dir)
  root = root if root.is_absolute() else repo / root
  return [path for path in sorted(root.rglob('*')) if path.suffix in RESULT_SUFFIXES and path.is_file()]


def check(results_dir: str | pathlib.Path, repo: pathlib.Path = provenance.REPO_ROOT) -> Iterator[Entry]:
  """An `Entry` for every result file under `results_dir`, in path order."""
  for path in result_paths(results_dir, repo):
    yield entry(path, repo)


def describe(e: Entry, max_commits: int = 8) -> str:
  """A few lines for the reader."""
  if e.commit is None:
    return f'{e.path}: not committed yet, no record: cannot tell'
  how = 'recorded' if e.recorded else 'no provenance record: dated by its last commit, read against the whole library'
  if not e.stale:
    return f'{e.path}: current ({how}; written at {e.commit[:10]})'
  lines = [
    f'{e.path}: STALE ({how}; written at {e.commit[:10]}): {len(e.changed_files)} measured file(s) changed since, '
    f'by {len(e.commits)} commit(s)' + ('' if e.commits else ' (uncommitted edits)')
  ]
  lines += [f'    {c[:110]}' + ('...' if len(c) > 110 else '') for c in e.commits[:max_commits]]
  if len(e.commits) > max_commits:
    lines.append(f'    ... and {len(e.commits) - max_commits} more')
  return '\n'.join(lines)
