"""CPR's overhead split of real failures, from a job's history records."""

import time

import pytest

from shadowsync_jax.recovery import accounts
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
  assert split['save_s'] == split['checkpoint_s'] == 0.5
  assert all(split[part] == 0.0 for part in overhead.PARTS if part != 'save_s')
  assert split['restart_s'] == split['restarts_only_s'] == 0.0


def _generation(number, cpu, standby_cpu_s=(0.0, 0.0), time=0.0):
  return {
    'event': 'generation',
    'writer': 'launcher',
    'generation': number,
    'cpu_while_training': cpu,
    'standby_beside_cpu_s': list(standby_cpu_s),
    'time': time,
  }


def test_what_runs_beside_the_steps_is_charged_the_steps_slowdown_by_thread_start_by_start():
  """Start 0 (it failed at 10.0): process 0 paced at step 10 (time 1.0), reached step 708 by the failure, and blocked
  0.2 s on saves: 8.8 s of training for 698 steps of 0.01 s, 1.82 s slow. Its background work took 5.75 s of CPU and
  its boundary work 0.25 s (slowest process, each group): each group charged its share of the 1.82 s. Start 1 (it
  ended): 0.5 s of live copies beside steps 2.0 s slow: the live copies' 0.5 s, and 1.5 s of slower steps with
  nothing of recovery's to blame."""
  writer, counter, live = overhead.WRITE_THREADS[0], overhead.PRIORITY_THREADS[0], overhead.LIVE_THREADS[0]
  records = [
    {'event': 'paced', 'generation': 0, 'process': 0, 'step': 10, 'trained': 10, 'time': 1.0},
    {'event': 'paced', 'generation': 0, 'process': 1, 'step': 10, 'trained': 10, 'time': 1.0},
    {**_save(0, 0.1), 'live_s': 0.5, 'time': 2.0},
    {**_save(0, 0.1), 'live_s': 1.5, 'boundary_s': 0.25, 'time': 3.0},  # Cumulative in a start: its last word.
    {**_save(1, 0.1), 'live_s': 1.0, 'time': 3.0},
    _generation(
      0,
      [
        {writer: 2.0, 'ts_pool_worker': 1.0, counter: 0.5, live: 0.25, 'tf_XLAEigen': 50.0, 'main': 3.0},
        {writer: 2.5, counter: 1.0, live: 0.25},
      ],
      standby_cpu_s=(1.7, 1.9),  # Start 1's standbys, beside start 0.
    ),
    {'event': 'positions', 'generation': 0, 'steps': [708, 800], 'time': 10.0},
    {'event': 'failure', 'generation': 0, 'failed_at': 10.0, 'time': 10.0},
    {'event': 'ready', 'generation': 1, 'writer': 'process_0', 'step': 501, 'time': 12.0},
    # A block of 20 steps was in flight at the paced boundary: half of it counts as trained after.
    paced_1 := {'event': 'paced', 'generation': 1, 'process': 0, 'step': 520, 'trained': 500, 'time': 13.0},
    {**paced_1, 'writer': 'process_0'},
    {**_save(0, 0.0, generation=1), 'live_s': 0.5, 'time': 14.0},
    {'event': 'ended', 'generation': 1, 'process': 0, 'step': 810, 'trained_at': 18.0, 'time': 19.0},
    _generation(1, [{}, {}]),
  ]
  slowdown = 10.0 - 1.0 - 0.2 - 698 * 0.01
  # Process 0's writers and tensorstore's; its live takes (1.5 written down) and its live thread's CPU.
  beside = {'boundary_s': 0.25, 'write_s': 3.0, 'priority_s': 1.0, 'live_s': 1.5 + 0.25}
  share = slowdown / sum(beside.values())
  split = overhead.split(records, step_s=0.01)
  assert overhead.slowed_steps(records, step_s=0.01) == pytest.approx({0: slowdown, 1: 2.0})
  assert split['boundary_s'] == pytest.approx(0.25 * share)
  assert split['write_s'] == pytest.approx(3.0 * share)
  assert split['priority_s'] == pytest.approx(1.0 * share)
  assert split['live_s'] == pytest.approx(1.75 * share + 0.5)
  assert split['slower_s'] == pytest.approx(1.5)
  assert split['standby_s'] == pytest.approx(1.9)
  assert split['restarts_only_s'] == pytest.approx(2.0)
  assert split['restart_s'] == pytest.approx(2.0 + 1.9 + (1.0 - 19 * 0.01))  # Start 1's warm-up: ready to paced.
  assert split['checkpoint_s'] == pytest.approx(0.2 + slowdown + 0.5)


def test_a_slowdown_is_charged_to_what_ran_beside_the_steps_at_most_its_cpu():
  assert overhead.charge(1.0, {'write_s': 3.0, 'live_s': 1.0}) == {'write_s': 0.75, 'live_s': 0.25, 'slower_s': 0.0}
  assert overhead.charge(5.0, {'write_s': 3.0, 'live_s': 1.0}) == {'write_s': 3.0, 'live_s': 1.0, 'slower_s': 1.0}
  # Steps faster than the reference's: nothing charged, the difference stands as it is.
  assert overhead.charge(-0.5, {'write_s': 3.0}) == {'write_s': 0.0, 'slower_s': -0.5}
  assert overhead.charge(0.5, {}) == {'slower_s': 0.5}


def test_a_restart_lasts_until_its_start_is_back_at_pace():
  records = [
    {'event': 'failure', 'generation': 0, 'failed_at': 10.0, 'time': 10.0},
    {'event': 'ready', 'generation': 1, 'writer': 'process_0', 'step': 101, 'time': 12.0},
    {'event': 'ready', 'generation': 1, 'writer': 'process_1', 'step': 101, 'time': 12.0},
    # 27 probe steps of 0.01 s took 1.27 s on process 0 and 0.77 s on process 1: the job waited 1.0 s more.
    # Process 0 also saved for 0.25 s meanwhile: the save's part, not the warm-up's.
    {
      'event': 'paced',
      'generation': 1,
      'writer': 'process_0',
      'process': 0,
      'step': 128,
      'time': 13.52,
      'hooks_s': 0.25,
    },
    {'event': 'paced', 'generation': 1, 'writer': 'process_1', 'process': 1, 'step': 128, 'time': 12.77},
    # The first start's probe is the reference's too: not counted.
    {'event': 'ready', 'generation': 0, 'writer': 'process_0', 'step': 1, 'time': 1.0},
    {'event': 'paced', 'generation': 0, 'writer': 'process_0', 'process': 0, 'step': 28, 'time': 5.0},
    _generation(0, [{}, {}], time=10.5),
    # Start 2's standbys took 0.3 s of their cores as start 1 warmed up: that much of its warm-up is theirs.
    _generation(1, [{}, {}], standby_cpu_s=(0.3, 0.2), time=20.0),
  ]
  split = overhead.split(sorted(records, key=lambda r: r['time']), step_s=0.01)
  assert split['warmup_s'] == pytest.approx(1.0 - 0.3)
  assert split['standby_s'] == pytest.approx(0.3)
  assert split['restart_s'] == pytest.approx(2.0 + 0.7 + 0.3)


def test_a_standby_that_waited_at_the_lowest_priority_took_idle_time_only():
  idle = {**_generation(0, [{}, {}], standby_cpu_s=(1.5, 1.6), time=1.0), 'standby_waited_idle': True}
  assert overhead.split([idle], step_s=0.01)['standby_s'] == 0.0
  busy = {**idle, 'standby_waited_idle': False}
  assert overhead.split([busy], step_s=0.01)['standby_s'] == pytest.approx(1.6)


def test_a_starts_boundary_work_is_its_cpu_less_what_other_parts_count():
  account = accounts.StartAccount()

  def spin(seconds):
    started = time.thread_time()
    while time.thread_time() - started < seconds:
      pass

  with account.boundary():
    spin(0.02)
    with account.elsewhere():  # A save's blocking: counted as the save's.
      spin(0.05)
  time.sleep(0.05)  # Waiting is no work.
  assert 0.02 <= account.boundary_s < 0.05
  assert account.records() == {'boundary_s': account.boundary_s}


def test_a_jobs_edges_are_its_first_starts_way_to_its_pace_and_its_last_starts_end():
  records = [
    _generation(0, [{}, {}], time=30.0) | {'started': 100.0, 'ended': 130.0},
    {**_save(0, 0.5, generation=0), 'time': 104.0},  # The calibration's save, before the pace: its own part.
    {'event': 'paced', 'generation': 0, 'process': 0, 'step': 28, 'time': 106.0},
    {'event': 'paced', 'generation': 0, 'process': 1, 'step': 28, 'time': 106.5},  # The last at pace.
    {**_save(1, 0.2, generation=0), 'time': 110.0},  # After the pace: not the start-up's.
    {'event': 'failure', 'generation': 0, 'failed_at': 129.0, 'time': 130.0},
    _generation(1, [{}, {}], time=60.0) | {'started': 132.0, 'ended': 160.0},
    {'event': 'ended', 'generation': 1, 'process': 0, 'step': 900, 'trained_at': 155.0, 'time': 158.0},
    {'event': 'ended', 'generation': 1, 'process': 1, 'step': 900, 'trained_at': 156.0, 'time': 158.5},
  ]
  assert overhead.edges(records) == pytest.approx({'startup_s': 6.5 - 0.5, 'end_s': 160.0 - 156.0})
  assert overhead.edges(records[:-2]) is None  # The last start never ended.


def test_a_start_that_failed_trained_half_the_block_in_flight_beyond_the_step_it_reported():
  records = [
    {'event': 'steps_per_dispatch', 'generation': 0, 'steps_per_dispatch': 16, 'time': 0.5},
    {'event': 'paced', 'generation': 0, 'process': 0, 'step': 28, 'trained': 28, 'time': 1.0},
    {'event': 'positions', 'generation': 0, 'steps': [500], 'time': 10.0},
    {'event': 'failure', 'generation': 0, 'failed_at': 10.0, 'time': 10.0},
  ]
  # 9.0 s from the pace to the death for the 472 steps reported and 8 of the 16 then in flight, at 0.01 s each.
  assert overhead.slowed_steps(records, step_s=0.01) == pytest.approx({0: 9.0 - (500 + 8 - 28) * 0.01})
