"""Failures on purpose: the kill schedule, the control pipe, and the job history that records them."""

import os
import signal

import pytest

from shadowsync_jax.parallel import control
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import history
from shadowsync_jax.parallel import launcher


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


def test_a_victim_waiting_for_its_kill_goes_on_when_its_job_goes_down_and_is_killed_at_its_next_start(monkeypatch):
  read_end, write_end = os.pipe()
  monkeypatch.setenv(control.CONTROL_FD_ENV, str(write_end))
  monkeypatch.setenv(control.KILL_AT_STEP_ENV, '7')
  pipe = control.ControlPipe.from_environment()
  asked = []
  pipe.reached(7, stop_waiting=lambda: asked.append(1) or len(asked) > 3)  # A peer lost while it waits: it returns.
  assert len(asked) == 4
  assert pipe.due_at_start(7) and not pipe.due_at_start(6) and not control.ControlPipe(None, 7).due_at_start(7)
  os.close(write_end)
  with os.fdopen(read_end) as lines:
    assert lines.read() == 'kill 7\n'


class _Process:
  """What the launcher's kill needs of a running process."""

  def __init__(self):
    self.signals = []
    self.pid = -1  # No such process: nothing to read of its threads.

  def poll(self):
    return None

  def send_signal(self, number):
    self.signals.append(number)


def _control_lines(generation: launcher.Generation, process_id: int, *lines: str) -> None:
  read_end, write_end = os.pipe()
  os.write(write_end, ''.join(f'{line}\n' for line in lines).encode())
  os.close(write_end)
  generation._control(read_end, process_id)  # pylint: disable=protected-access  (its control pipe's reader)


def test_the_launcher_kills_a_waiting_victim_once_every_process_trains_and_never_once_the_job_goes_down():
  generation = launcher.Generation(
    ['--unused'], num_processes=2, cpu_devices=1, peer_timeout_s=1, pin_cpus=False, coordinator_port=0
  )
  generation._processes = [_Process(), _Process()]  # pylint: disable=protected-access
  _control_lines(generation, 1, 'ready', 'step 40', 'kill 40')
  assert generation._processes[1].signals == []  # pylint: disable=protected-access  (process 0 not training yet)
  _control_lines(generation, 0, 'ready', 'step 90')
  assert generation._processes[1].signals == [signal.SIGKILL]  # pylint: disable=protected-access
  _control_lines(generation, 0, 'kill 90')  # Its peer died first: it stops as a survivor, its kill kept.
  assert generation._processes[0].signals == []  # pylint: disable=protected-access
  assert generation._failure.process == 1 and generation._failure.step == 40  # pylint: disable=protected-access


def test_the_launcher_fires_the_kills_in_the_order_listed_whichever_process_is_ahead():
  schedule = fault_injection.KillSchedule.parse('0@20,1@40,0@90', mtbf_s=0.0, seed=0, num_processes=2)
  schedule.fired(0, 20)  # In the start before.
  generation = launcher.Generation(
    ['--unused'],
    num_processes=2,
    cpu_devices=1,
    peer_timeout_s=1,
    pin_cpus=False,
    coordinator_port=0,
    kill_schedule=schedule,
  )
  generation._processes = [_Process(), _Process()]  # pylint: disable=protected-access
  _control_lines(generation, 0, 'ready', 'step 90', 'kill 90')  # Ahead: at its step before process 1 at its own.
  _control_lines(generation, 1, 'ready', 'step 30')
  assert generation._processes[0].signals == [] and generation._processes[1].signals == []  # pylint: disable=protected-access
  _control_lines(generation, 1, 'step 40', 'kill 40')
  assert generation._processes[1].signals == [signal.SIGKILL] and generation._processes[0].signals == []  # pylint: disable=protected-access
  assert generation._failure.process == 1 and generation._failure.step == 40  # pylint: disable=protected-access


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
