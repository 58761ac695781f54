"""Spawned worker processes for the data tools (preparing, generating): results as they finish, a worker's error
raised in the caller, progress reports, and nothing left running however the caller ends.

  def task(unit, state, report):        # top-level (picklable); state = setup() once per worker process
    report(rows=8192)                   # optional: reaches on_report in the caller
    return result
  for index, result in workers.run(task, units, num_workers=2, setup=make_state, on_report=print):
    ...                                 # index: the task's position in `units`

Workers are spawned, never forked: a forked copy of a process that has started JAX or grain threads can hang. A
worker that sees its parent gone (killed with SIGKILL, say) exits within a second, so an interrupted run leaves no
orphans. `num_workers=0` runs every task in the caller, in order (tests, debugging).
"""

from collections.abc import Callable, Iterable, Iterator
import multiprocessing
import os
import pickle
import queue as queue_lib
import traceback
from typing import Any

_POLL_S = 0.5
_CONTEXT = 'spawn'


class WorkerError(RuntimeError):
  """A worker failed with an error that could not be sent as it is; the message holds its traceback."""


def run(
  task_fn: Callable[[Any, Any, Callable[..., None]], Any],
  tasks: Iterable[Any],
  num_workers: int,
  setup: Callable[[], Any] | None = None,
  on_report: Callable[..., None] | None = None,
  max_in_flight: int = 0,
) -> Iterator[tuple[int, Any]]:
  """(task index, task_fn(task, state, report)) for every task, in the order they finish. At most `max_in_flight`
  tasks (default 2 per worker) are handed out ahead of the results taken, which bounds the memory of results."""
  tasks = list(tasks)
  report = on_report or (lambda **_: None)
  if num_workers <= 0:
    state = setup() if setup else None
    for index, task in enumerate(tasks):
      yield index, task_fn(task, state, report)
    return
  context = multiprocessing.get_context(_CONTEXT)
  todo, events = context.Queue(), context.Queue()
  processes = [
    context.Process(target=_worker, args=(task_fn, setup, todo, events, os.getpid()), daemon=True)
    for _ in range(min(num_workers, max(len(tasks), 1)))
  ]
  for process in processes:
    process.start()
  try:
    yield from _results(tasks, todo, events, processes, report, max_in_flight or 2 * len(processes))
  finally:
    for process in processes:
      if process.is_alive():
        process.terminate()
    for process in processes:
      process.join()
    todo.close()
    events.close()
    todo.cancel_join_thread()
    events.cancel_join_thread()


def _results(tasks, todo, events, processes, report, max_in_flight) -> Iterator[tuple[int, Any]]:
  handed_out, finished, dead = 0, 0, []
  while finished < len(tasks):
    while handed_out < len(tasks) and handed_out - finished < max_in_flight:
      todo.put((handed_out, tasks[handed_out]))
      handed_out += 1
    try:
      kind, index, payload = events.get(timeout=_POLL_S)
    except queue_lib.Empty:
      if dead:  # Dead a poll ago, and nothing it sent is left to read: it crashed without a word.
        raise WorkerError(f'a worker process (pid {dead[0].pid}) died with exit code {dead[0].exitcode}.') from None
      dead = [p for p in processes if not p.is_alive()]
      continue
    if kind == 'report':
      report(**payload)
    elif kind == 'error':
      error, text = payload
      if error is None:
        raise WorkerError(f'task {index} failed in a worker:\n{text}')
      error.add_note(f'(in a worker process, on task {index})')
      raise error
    else:
      finished += 1
      yield index, payload
  for _ in processes:
    todo.put(None)


def _worker(task_fn, setup, todo, events, parent_pid: int) -> None:
  """A worker's loop: take tasks until told to stop or the parent is gone."""

  def report(**fields) -> None:
    if os.getppid() != parent_pid:  # The parent died: stop working for nobody.
      os._exit(1)
    events.put(('report', -1, fields))

  state = setup() if setup else None
  while True:
    try:
      item = todo.get(timeout=_POLL_S)
    except queue_lib.Empty:
      if os.getppid() != parent_pid:
        return
      continue
    if item is None:
      return
    index, task = item
    try:
      events.put(('done', index, task_fn(task, state, report)))
    except BaseException as error:  # Sent to the caller, which raises it; this worker stops.
      text = traceback.format_exc()
      events.put(('error', index, (error if _picklable(error) else None, text)))
      return


def _picklable(error: BaseException) -> bool:
  try:
    pickle.loads(pickle.dumps(error))
    return True
  except Exception:  # pylint: disable=broad-except
    return False
