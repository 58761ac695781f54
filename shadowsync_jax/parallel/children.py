"""How the launcher starts its children, each a process of its own: from one thread that outlives them (`spawner`),
each dying with the launcher, pinned to its share of the machine's cores if asked (`cpu_share`), and a warm standby
waiting at the lowest priority, raised to the launcher's own when it joins the job (`standby_waits_idle`,
`raise_priority`).

  setup = functools.partial(children.child_setup, children.cpu_share(p, n), children.standby_waits_idle())
  process = children.spawner().submit(subprocess.Popen, command, preexec_fn=setup).result()
  children.raise_priority(process.pid)   # a standby that joins: every thread of it at the launcher's priority
"""

from concurrent import futures
import ctypes
import functools
import os
import resource
import signal

_PR_SET_PDEATHSIG = 1  # prctl option: the signal a child gets when its parent dies.
_LOWEST_PRIORITY = 19


def cpu_share(process_id: int, num_processes: int) -> set[int]:
  """The cores of process `process_id` when the machine's cores are dealt out evenly (round robin if fewer)."""
  cores = sorted(os.sched_getaffinity(0))
  if num_processes >= len(cores):
    return {cores[process_id % len(cores)]}
  return set(cores[process_id::num_processes])


@functools.cache
def spawner() -> futures.ThreadPoolExecutor:
  """The one thread every child is started from (it never ends before the launcher does)."""
  return futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix='spawner')


def child_setup(affinity: set[int] | None, idle: bool = False) -> None:
  """In each child before it runs: die with the launcher (Linux), take its share of the cores if pinned, and wait
  at the lowest priority if `idle` (a warm standby: `standby_waits_idle`)."""
  try:
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:  # Not Linux: children outlive a killed launcher there.
    pass
  if affinity:
    os.sched_setaffinity(0, affinity)
  if idle:
    os.setpriority(os.PRIO_PROCESS, 0, _LOWEST_PRIORITY)
    _set_autogroup_priority('self', _LOWEST_PRIORITY)


def _set_autogroup_priority(pid: int | str, priority: int) -> None:
  """The priority of `pid`'s session against the others' (Linux's autogroups: with them, where each child starts a
  session of its own, a thread's nice value weighs only against its own session's threads)."""
  try:
    with open(f'/proc/{pid}/autogroup', 'w') as autogroup:
      autogroup.write(str(priority))
  except OSError:  # No autogroups (or no such process).
    pass


def _own_autogroup_priority() -> int:
  """The launcher's session's priority (0 where there are no autogroups)."""
  try:
    with open('/proc/self/autogroup') as autogroup:
      return int(autogroup.read().split()[-1])  # '/autogroup-123 nice 0'
  except (OSError, ValueError, IndexError):
    return 0


def standby_waits_idle() -> bool:
  """Whether a warm standby starts at the lowest priority (nice 19) and joins at the launcher's own: only where
  the launcher may raise a priority again (root, or an RLIMIT_NICE that allows it). Its imports, 1.5 s of a core
  at Criteo Kaggle's size, then take the cores' idle time instead of the training's beside it (on this project's
  emulated hosts the standby shares the core its predecessor trains on; a cluster's spare host shares nothing);
  a restart that comes before they end finishes them at full priority."""
  if not hasattr(os, 'setpriority'):
    return False
  ceiling = 20 - resource.getrlimit(resource.RLIMIT_NICE)[0]  # The lowest nice value this user may set.
  return os.geteuid() == 0 or ceiling <= os.getpriority(os.PRIO_PROCESS, 0)


def raise_priority(pid: int) -> None:
  """Every thread of `pid` at the launcher's own priority (Linux's nice is a thread's, and a new thread takes its
  creator's: read again until no thread is new, for a process still importing)."""
  priority, raised = os.getpriority(os.PRIO_PROCESS, 0), set()
  for _ in range(10):
    try:
      tids = {int(task) for task in os.listdir(f'/proc/{pid}/task')} - raised
    except OSError:  # Not Linux, or it ended.
      tids = {pid} - raised
    if not tids:
      return
    for tid in tids:
      try:
        os.setpriority(os.PRIO_PROCESS, tid, priority)
      except OSError:  # It ended meanwhile.
        pass
    raised |= tids
    _set_autogroup_priority(pid, _own_autogroup_priority())
