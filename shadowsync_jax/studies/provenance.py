"""Where a result came from: the command, the commit and whether the tree was clean, the date, the machine, and the
code it measures, as a study's result file records them (`report.write`).

  record = provenance.collect('python -m benchmarks.throughput')
  provenance.line(record)      # 'Written 2026-11-26 09:30 UTC at commit 1a2b3c4 (measured code as committed), ...'
  provenance.comment(record)   # '<!-- provenance: {...} -->': the same, for `staleness`
  provenance.read(text)        # the record a result file holds, or None (written before records were kept)

The code a result measures is every file of the repository whose module the study's process loaded, with its git
blob hash as it was when the result was written (uncommitted edits included), and, when the study ran jobs of their
own processes (`studies.jobs`, `parallel.supervisor`), every file of the library but `studies` (no job imports it)
and of `experiments`, and the files a loaded module names in its `RUNS_ELSEWHERE` (run by another Python: TorchRec's
worker): what a change must touch to change the result. Left out: the modules that write, date and read
result files (`WRITERS`: this one, `report`, `result_files`, `staleness`, `headlines`, `reproduce`), which
measure nothing. The machine's load is read when this module is imported (a study binary imports it at its start)
and again when the record is made, and other work beside the study (every process but its own and its children) is
measured in between, every 10 s (`_Beside`): the record says whether the machine was quiet. `elapsed_s`: how long
the study's process had run when it made the record (`reproduce` sums them)."""

import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
LOAD_AT_START = os.getloadavg()
BESIDE_WINDOW_S = 10.0  # The window over which other work beside the study is measured.


class _Beside:
  """What the machine's cores did for work other than this process and its descendants, every `BESIDE_WINDOW_S`
  seconds from import to the record: a study's speed figure is worth what its machine was quiet (a load average
  counts the study's own threads, and at its ends only).

  Other work is read process by process: the CPU seconds each process outside this one's tree used since it was
  last seen (all of them for one born since). Read as the machine's busy time less this tree's, a descendant that
  lived and ended between two readings (a study's short probes, a job's helpers) counted as other work; read this
  way, other work that lives less than a window is missed instead, and what matters, another study or a test suite
  beside this one, lives longer."""

  def __init__(self):
    self.shares: list[float] = []  # Per window: other work's CPU seconds over the window's core-seconds.
    self._seen: dict[tuple[int, float], float] = {}  # (pid, start time) of each process outside the tree: CPU s.
    thread = threading.Thread(target=self._run, name='provenance-beside', daemon=True)
    thread.start()

  def _other_cpu_since(self, last_s: float | None) -> float:
    """CPU seconds of the processes outside this one's tree since they were last seen (those born after `last_s`
    whole; None: the first reading, which only records them)."""
    processes = {}
    for process in psutil.process_iter(['ppid', 'create_time', 'cpu_times']):
      info = process.info
      if info['cpu_times'] is not None and info['create_time'] is not None:
        processes[process.pid] = info
    me, in_tree = os.getpid(), {}

    def of_tree(pid: int) -> bool:
      chain = []
      while pid not in in_tree and pid in processes and pid != me and pid > 1:
        chain.append(pid)
        pid = processes[pid]['ppid']
      answer = in_tree.get(pid, pid == me)
      in_tree.update(dict.fromkeys(chain, answer))
      return answer

    seen, other = {}, 0.0
    for pid, info in processes.items():
      if of_tree(pid):
        continue
      key, cpu_s = (pid, info['create_time']), sum(info['cpu_times'][:2])
      seen[key] = cpu_s
      if key in self._seen:
        other += cpu_s - self._seen[key]
      elif last_s is not None and info['create_time'] >= last_s:
        other += cpu_s
    self._seen = seen
    return other

  def _run(self) -> None:
    cores = os.cpu_count() or 1
    last_s = time.time()
    self._other_cpu_since(None)
    while True:
      time.sleep(BESIDE_WINDOW_S)
      other_s, now_s = self._other_cpu_since(last_s), time.time()
      self.shares.append(max(0.0, other_s) / ((now_s - last_s) * cores))
      last_s = now_s


_BESIDE = _Beside()
# Modules whose studies run jobs in processes of their own: those import the whole library and its binaries.
_JOB_RUNNERS = ('shadowsync_jax.studies.jobs', 'shadowsync_jax.parallel.supervisor')
_JOB_CODE = ('shadowsync_jax', 'experiments')
_NOT_JOB_CODE = 'shadowsync_jax/studies/'  # The library never imports studies: no job runs them.
WRITERS = tuple(
  f'shadowsync_jax/studies/{name}.py'
  for name in ('provenance', 'report', 'result_files', 'staleness', 'headlines', 'reproduce')
)
QUIET_SHARE = 0.10  # Other work under this share of the cores in every window: the study ran on a quiet machine.
_COMMENT = re.compile(r'<!-- provenance: (?P<json>\{.*?\}) -->', re.S)


def git(*args: str, repo: pathlib.Path = REPO_ROOT) -> str:
  """The output of a git command in `repo` (raises CalledProcessError, or OSError without git)."""
  return subprocess.run(['git', *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def measured_files(repo: pathlib.Path = REPO_ROOT, modules: dict[str, Any] | None = None) -> list[str]:
  """Repository-relative paths of the Python files the study's result depends on (module docstring)."""
  modules = sys.modules if modules is None else modules
  files = set()
  for module in list(modules.values()):
    path = getattr(module, '__file__', None)
    # A file of the repository. (torch's `torch._classes` names a relative '__file__' that is no file, and answers
    # any attribute with an object: the GPU machine's image imported it.)
    if path and pathlib.Path(path).is_absolute() and pathlib.Path(path).resolve().is_relative_to(repo):
      files.add(pathlib.Path(path).resolve().relative_to(repo).as_posix())
      files.update(getattr(module, 'RUNS_ELSEWHERE', ()))  # Files a study runs in another Python (its peers').
  if any(name in modules for name in _JOB_RUNNERS):
    for top in _JOB_CODE:
      files.update(
        path
        for path in (p.relative_to(repo).as_posix() for p in (repo / top).rglob('*.py'))
        if not path.startswith(_NOT_JOB_CODE)
      )
  files.difference_update(WRITERS)
  tracked = set(git('ls-files', '--', *sorted(files), repo=repo).split()) if files else set()
  return sorted(files & tracked)


def blob_hashes(paths: list[str], repo: pathlib.Path = REPO_ROOT) -> dict[str, str]:
  """Each path's git blob hash as the file is now (what `git hash-object` gives; a missing file: '')."""
  present = [p for p in paths if (repo / p).exists()]
  hashes = dict(zip(present, git('hash-object', '--', *present, repo=repo).split())) if present else {}
  return {p: hashes.get(p, '') for p in paths}


def collect(command: str, repo: pathlib.Path = REPO_ROOT, modules: dict[str, Any] | None = None) -> dict[str, Any]:
  """The record of a result written now by `command` (module docstring). Outside a git checkout the commit and
  the measured files are None and empty, and the line says so."""
  try:
    commit = git('rev-parse', 'HEAD', repo=repo).strip()
    changed = [line[3:] for line in git('status', '--porcelain', '--untracked-files=no', repo=repo).splitlines()]
    measured = blob_hashes(measured_files(repo, modules), repo)
  except (OSError, subprocess.CalledProcessError):
    commit, changed, measured = None, [], {}
  return {
    'command': command,
    'commit': commit,
    # Clean: the code it measures is the commit's (other studies' result files, docs may be changing beside it).
    'tree_clean': not set(changed) & set(measured),
    'uncommitted_files': changed,
    'date_utc': datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M'),
    'host': platform.node(),
    'cores': os.cpu_count(),
    'load_at_start': [round(x, 2) for x in LOAD_AT_START],
    'load_at_end': [round(x, 2) for x in os.getloadavg()],
    # Other work's share of the cores beside the study, over 10-s windows: the mean and the largest.
    'beside_share_mean': round(sum(_BESIDE.shares) / len(_BESIDE.shares), 3) if _BESIDE.shares else None,
    'beside_share_max': round(max(_BESIDE.shares), 3) if _BESIDE.shares else None,
    'elapsed_s': round(time.time() - psutil.Process().create_time(), 1),  # The study's whole run, to this record.
    'python': platform.python_version(),
    'jax': _version('jax'),
    'measures': measured,
  }


def _version(package: str) -> str | None:
  try:
    from importlib import metadata  # pylint: disable=g-import-not-at-top

    return metadata.version(package)
  except Exception:  # pylint: disable=broad-except  (a study without that package installed)
    return None


def line(record: dict[str, Any]) -> str:
  """One sentence for the reader: when, at which commit, on what machine."""
  dirty = [f for f in record['uncommitted_files'] if f in record['measures']]
  tree = 'measured code as committed' if record['tree_clean'] else f'{len(dirty)} measured file(s) not committed'
  where = 'outside a git checkout' if record['commit'] is None else f'at commit {record["commit"][:10]} ({tree})'
  beside = ''
  if record.get('beside_share_max') is not None:
    quiet = 'quiet' if record['beside_share_max'] < QUIET_SHARE else 'not quiet'
    beside = (
      f'; other work beside it: {100 * record["beside_share_mean"]:.0f}% of the cores on average, '
      f'{100 * record["beside_share_max"]:.0f}% at most over {BESIDE_WINDOW_S:.0f} s ({quiet})'
    )
  return (
    f'Written {record["date_utc"]} UTC {where}, on {record["cores"]} cores '
    f'(load average {record["load_at_start"][0]:.1f} at the start, {record["load_at_end"][0]:.1f} at the end{beside}); '
    f'Python {record["python"]}, jax {record["jax"]}.'
  )


def comment(record: dict[str, Any]) -> str:
  return f'<!-- provenance: {json.dumps(record, sort_keys=True)} -->'


def read(text: str) -> dict[str, Any] | None:
  """The record a result file's text holds, or None."""
  match = _COMMENT.search(text)
  return None if match is None else json.loads(match.group('json'))
