"""The data tools' worker processes: every result once, a task's error raised in the caller with its type, a
crashed worker named, and no process left running."""

import multiprocessing
import os

import pytest

from shadowsync_jax.data import workers


def _square(task, state, report):
  report(done=1)
  return task * task + state


def _fail_on_three(task, state, report):
  del state, report
  if task == 3:
    raise KeyError(f'task {task} failed')
  return task


def _crash(task, state, report):
  del state, report
  os._exit(3)


def _ten() -> int:
  return 10


@pytest.mark.parametrize('num_workers', [0, 2])
def test_every_task_once_with_its_index_and_the_workers_state(num_workers):
  reports = []
  results = dict(workers.run(_square, range(7), num_workers, setup=_ten, on_report=lambda **r: reports.append(r)))
  assert results == {i: i * i + 10 for i in range(7)}
  assert len(reports) == 7 and not multiprocessing.active_children()


def test_a_task_error_is_raised_in_the_caller_and_the_workers_stop():
  with pytest.raises(KeyError, match='task 3 failed'):
    list(workers.run(_fail_on_three, range(8), num_workers=2))
  assert not multiprocessing.active_children()


def test_a_worker_that_dies_without_a_word_is_named():
  with pytest.raises(workers.WorkerError, match='died with exit code 3'):
    list(workers.run(_crash, range(2), num_workers=1))
  assert not multiprocessing.active_children()
