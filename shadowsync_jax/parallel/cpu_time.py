"""Where a process's CPU time goes, read from outside it: seconds by thread, grouped by the thread's OS name.

  cpu_time.name_os_threads()             # in the process: each thread's OS name is its Python name
  cpu_time.of_threads(pid)               # {'main': 51.2, 'tf_XLAEigen': 66.1, 'block-reader': 12.0, ...}
  sampler = cpu_time.Sampler(); sampler.sample(pids); sampler.totals(pid)   # threads that ended still count
  mark = sampler.mark(pid); ...; sampler.totals(pid, since=mark)              # from a moment on

On a host whose cores training fills (each process of a job pinned to its own core, as the studies run it), a
second of CPU that any other thread of the process takes (a checkpoint's background write, a live copy, the
data reader) or another process on that core (the warm standby of the next start) is a second the steps wait.
CPR-style accounts (`recovery.overhead`) name those seconds by the thread that took them. Python names its
threads for itself only: `name_os_threads` hands each name to the OS (`/proc/self/task/<tid>/comm`, 15 bytes),
so a reader from outside the process (the launcher) tells them apart; threads Python does not know (XLA's) have
their own names. A name's number at the end is dropped (`block-reader_0` and `block-reader_1` are one group,
`Thread-12 (run)` is `Thread`); the process's first thread is 'main'. Linux only: elsewhere nothing is named and
nothing read ({}).
"""

import os
import pathlib
import re
import threading

MAIN = 'main'
_TICKS = os.sysconf('SC_CLK_TCK') if hasattr(os, 'sysconf') else 100
_TARGET = re.compile(r' \(.*\)$')  # 'Thread-12 (run)': Python's name for an unnamed thread of `run`.
_NUMBER = re.compile(r'([_-]?\d+)+$')  # 'block-reader_0', 'Thread-12', 'llvm-worker-3'.


def name_os_threads() -> None:
  """Gives every running thread of this process but the first its Python name as its OS name (15 bytes), so a
  reader from outside tells them apart; threads started later are named by the next call. A no-op where the OS has
  no `/proc/self/task/<tid>/comm`."""
  for thread in threading.enumerate():
    if thread.native_id is None or thread is threading.main_thread():
      continue
    try:
      pathlib.Path(f'/proc/self/task/{thread.native_id}/comm').write_text(os_name(thread.name))
    except OSError:  # Ended meanwhile, or no /proc.
      continue


def os_name(name: str) -> str:
  """The group a thread named `name` in Python counts in, as the OS holds it (`name_os_threads`: 15 bytes)."""
  return group(name)[:15]


def group(name: str) -> str:
  """The group a thread's OS name counts in: the name without its trailing number."""
  return _NUMBER.sub('', _TARGET.sub('', name)) or name


def _threads(pid: int) -> dict[int, tuple[str, float]]:
  """{tid: (group, CPU seconds: user + system)} of every thread of `pid` now ({} if it is gone)."""
  threads = {}
  try:
    tasks = list(pathlib.Path(f'/proc/{pid}/task').iterdir())
  except OSError:
    return {}
  for task in tasks:
    try:
      comm = (task / 'comm').read_text().strip()
      fields = (task / 'stat').read_text().rsplit(')', 1)[1].split()
    except OSError:  # It ended between the listing and the read.
      continue
    tid = int(task.name)
    threads[tid] = (MAIN if tid == pid else group(comm), (int(fields[11]) + int(fields[12])) / _TICKS)
  return threads


def of_threads(pid: int) -> dict[str, float]:
  """CPU seconds of `pid`'s threads that run now, by group (module docstring)."""
  totals: dict[str, float] = {}
  for name, seconds in _threads(pid).values():
    totals[name] = totals.get(name, 0.0) + seconds
  return totals


def of_process(pid: int) -> float:
  """CPU seconds `pid` took so far, every thread's, ended ones too (0.0 if it is gone)."""
  try:
    fields = pathlib.Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
  except OSError:
    return 0.0
  return (int(fields[11]) + int(fields[12])) / _TICKS


class Sampler:
  """Readings of processes' threads, the last of each thread kept: a thread that ended, or a process killed, counts
  with its CPU at the last `sample` before."""

  def __init__(self):
    self._last: dict[int, dict[int, tuple[str, float]]] = {}
    self._lock = threading.Lock()

  def sample(self, pids: list[int]) -> None:
    for pid in pids:
      threads = _threads(pid)
      with self._lock:
        self._last.setdefault(pid, {}).update(threads)

  def mark(self, pid: int) -> dict[int, float]:
    """`pid`'s threads' CPU seconds at their last reading, by thread: a point to count from (`totals`)."""
    with self._lock:
      return {tid: seconds for tid, (_, seconds) in self._last.get(pid, {}).items()}

  def totals(self, pid: int, since: dict[int, float] | None = None) -> dict[str, float]:
    """CPU seconds of `pid`'s threads at their last reading (after `since`, a `mark`), by group (by the name each
    thread had last: one named later counts under its name)."""
    since = since or {}
    with self._lock:
      threads = list(self._last.get(pid, {}).items())
    totals: dict[str, float] = {}
    for tid, (name, seconds) in threads:
      totals[name] = totals.get(name, 0.0) + seconds - since.get(tid, 0.0)
    return {name: round(seconds, 2) for name, seconds in totals.items() if round(seconds, 2) > 0}
