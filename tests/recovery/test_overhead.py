"""CPR's overhead split of real failures, from a job's history records."""

import pytest

from shadowsync_jax.recovery import overhead


def _save(process, seconds, generation=0):
  return {'event': 'save', 'process': process, 'generation': generation, 'blocking_s': seconds, 'time': 0.0}


def test_saves_restores_rewinds_and_restarts_each_counted_once():
  records = [
    _save(0, 1.0),
    _save(1, 1.5),
    _save(0, 1.0),  # Process 0 blocked 2.0 s, process 1 1.5 s: the job waits for the slower, 2.0 s.
    {'event': 'peer_lost', 'generation': 0, 'process': 0, 'time': 100.4},  # After the launcher saw the death.
    {'event': 'failure', 'generation': 0, 'failed_at': 100.0, 'time': 100.5},
    {'event': 'start', 'generation': 1, 'process': 0, 'restore_s': 0.5, 'retrained_steps': 30, 'time': 102.0},
    {'event': 'start', 'generation': 1, 'process': 1, 'restore_s': 0.8, 'retrained_steps': 30, 'time': 102.1},
    {'event': 'ready', 'generation': 1, 'process': 0, 'time': 103.0},
    {'event': 'ready', 'generation': 1, 'process': 1, 'time': 103.8},  # Back at 103.8: 3.8 s, 0.8 of it restoring.
    _save(1, 1.0, generation=1),
    # A second death the launcher never wrote down (a cluster's restart loop): the survivor's word dates it; the
    # next start failed before it trained, so its restart lasts until that failure.
    {'event': 'peer_lost', 'generation': 1, 'process': 1, 'time': 200.0},
    {'event': 'start', 'generation': 2, 'process': 0, 'restore_s': 0.2, 'retrained_steps': 0, 'time': 203.0},
    {'event': 'failure', 'generation': 2, 'failed_at': 205.0, 'time': 205.1},
  ]
  split = overhead.split(records, step_s=0.01)
  assert split['save_s'] == pytest.approx(2.5)  # Process 1: 1.5 + 1.0.
  assert split['restore_s'] == pytest.approx(0.8 + 0.2)
  assert split['retrained_s'] == pytest.approx(0.3)
  assert split['restart_s'] == pytest.approx((103.8 - 100.0 - 0.8) + (205.0 - 200.0 - 0.2))
  assert split['checkpoint_s'] == pytest.approx(2.5 + 1.0 + 0.3)


def test_a_job_without_failures_pays_its_saves_alone():
  split = overhead.split([_save(0, 0.25), _save(0, 0.25)], step_s=0.01)
  assert split == {'save_s': 0.5, 'restore_s': 0.0, 'retrained_s': 0.0, 'restart_s': 0.0, 'checkpoint_s': 0.5}
