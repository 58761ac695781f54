"""Failures on purpose: the kill schedule, the control pipe, and the job history that records them."""

import os

import pytest

from shadowsync_jax.parallel import control
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import history


def test_kills_at_steps_fire_once_each_in_the_order_the_processes_reach_them():
  schedule = fault_injection.KillSchedule.parse('1@40,0@90,1@120', mtbf_s=0.0, seed=0, num_processes=2)
  assert schedule.environment(1) == {control.KILL_AT_STEP_ENV: '40'}
  assert schedule.environment(0) == {control.KILL_AT_STEP_ENV: '90'}
  schedule.fired(1, 40)
  assert schedule.environment(1) == {control.KILL_AT_STEP_ENV: '120'}  # The next start kills it later.
  schedule.fired(0, 90)
  assert schedule.environment(0) == {}
  for bad in ('1', '2@10', '0@0', 'a@b'):
    with pytest.raises(ValueError, match='--kill_at'):
      fault_injection.KillSchedule.parse(bad, 0.0, 0, num_processes=2)


def test_random_kills_are_exponential_seeded_and_uniform_over_processes():
  draws = fault_injection.KillSchedule.parse('', mtbf_s=30.0, seed=7, num_processes=4).random_kills()
  gaps, processes = zip(*[next(draws) for _ in range(4000)])
  again = fault_injection.KillSchedule.parse('', mtbf_s=30.0, seed=7, num_processes=4).random_kills()
  assert [next(again) for _ in range(5)] == list(zip(gaps[:5], processes[:5]))
  assert sum(gaps) / len(gaps) == pytest.approx(30.0, rel=0.06)
  assert set(processes) == {0, 1, 2, 3} and min(processes.count(p) for p in range(4)) > 850
  assert list(fault_injection.KillSchedule.parse('', 0.0, 0, 2).random_kills()) == []


def test_the_control_pipe_carries_ready_steps_and_a_kill_request(monkeypatch):
  read_end, write_end = os.pipe()
  monkeypatch.setenv(control.CONTROL_FD_ENV, str(write_end))
  monkeypatch.setenv(control.KILL_AT_STEP_ENV, '7')
  pipe = control.ControlPipe.from_environment()
  pipe.ready()
  pipe.step(6)
  pipe.reached(6)  # Not its step: returns at once.
  os.close(write_end)
  with os.fdopen(read_end) as lines:
    assert lines.read().split('\n') == ['ready', 'step 6', '']
  silent = control.ControlPipe(None, None)
  silent.ready(), silent.step(1), silent.reached(1)  # No launcher: nothing happens.


def test_the_history_adds_up_failures_restores_and_lost_steps(tmp_path):
  history.append(tmp_path, 'launcher', {'event': 'positions', 'generation': 0, 'steps': [50, 40]})
  history.append(tmp_path, 'launcher', {'event': 'failure', 'generation': 0, 'process': 1, 'how': 'killed'})
  history.append(
    tmp_path, 'process_0', {'event': 'peer_lost', 'generation': 0, 'process': 0, 'step': 51, 'peer_steps': {'1': 38}}
  )
  for process, restored, position in ((0, 51, 51), (1, 32, 40)):
    history.append(
      tmp_path,
      f'process_{process}',
      {
        'event': 'start',
        'generation': 1,
        'process': process,
        'restored_step': restored,
        'position': position,
        'skipped_steps': position - restored,
      },
    )
  with open(tmp_path / history.DIRECTORY / 'process_1.jsonl', 'a') as file:
    file.write('{"time": 1, "event": "sta')  # A writer killed mid-line.
  assert history.positions_reached(tmp_path, 0) == {0: 51, 1: 40}
  summary = history.summarize(tmp_path, total_steps=100, num_processes=2)
  assert summary['num_failures'] == 1 and summary['num_restarts'] == 1
  assert summary['skipped_steps'] == 8 and summary['actual_pls'] == pytest.approx(8 / 200)
  assert history.latest(tmp_path, 'failure')['process'] == 1 and history.latest(tmp_path, 'nothing') is None
