"""The launcher's generations: a warm standby started ahead waits, imported, until it runs (or is abandoned); a
generation whose processes all fail names one of them."""

import json
import os
import pathlib
import time

from shadowsync_jax.parallel import children
from shadowsync_jax.parallel import control
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import launcher

REPO = pathlib.Path(__file__).resolve().parents[2]


def _generation(
  workdir: pathlib.Path, number: int, schedule=None, module: str = 'tests.parallel.standby_probe'
) -> launcher.Generation:
  return launcher.Generation(
    [f'--workdir={workdir}'],
    num_processes=2,
    cpu_devices=1,
    peer_timeout_s=10,
    pin_cpus=False,
    coordinator_port=launcher.free_port(),
    number=number,
    kill_schedule=schedule,
    module=module,
  )


def _autogroup_nice() -> int:
  try:
    return int(pathlib.Path('/proc/self/autogroup').read_text().split()[-1])
  except (OSError, ValueError, IndexError):
    return 0


def _wait_for(paths: list[pathlib.Path], timeout_s: float = 120) -> None:
  deadline = time.monotonic() + timeout_s
  while not all(path.exists() for path in paths):
    assert time.monotonic() < deadline, f'never written: {[p for p in paths if not p.exists()]}'
    time.sleep(0.05)


def test_a_prepared_generation_waits_until_it_runs_then_joins_with_the_environment_of_that_moment(
  tmp_path, monkeypatch
):
  monkeypatch.chdir(REPO)
  schedule = fault_injection.KillSchedule.parse('1@40,1@90', mtbf_s=0.0, seed=0, num_processes=2)
  generation = _generation(tmp_path, number=3, schedule=schedule)
  generation.prepare()
  _wait_for([tmp_path / 'waiting_0', tmp_path / 'waiting_1'])
  time.sleep(0.5)
  assert not list(tmp_path.glob('joined_*'))  # Ready, and waiting for the word.
  schedule.fired(1, 40)  # What the generation before learned after the standby was started.
  outcome = generation.run(grace_s=10)
  assert outcome.succeeded, outcome
  joined = [json.loads((tmp_path / f'joined_{p}').read_text()) for p in range(2)]
  assert joined[1]['environment'][control.KILL_AT_STEP_ENV] == '90'  # As of the run, not of the prepare.
  assert control.KILL_AT_STEP_ENV not in joined[0]['environment']
  assert all(j['environment'][control.GENERATION_ENV] == '3' for j in joined)
  address = joined[0]['coordinator_address']
  assert address == joined[1]['coordinator_address'] and address.startswith('127.0.0.1:')
  # It waited at the lowest priority where the launcher may raise it again, and joined at the launcher's.
  # (Its thread's nice value, and its session's where the kernel weighs sessions against each other.)
  own = [os.nice(0), _autogroup_nice()]
  waiting = [[int(x) for x in (tmp_path / f'nice_waiting_{p}').read_text().split()] for p in range(2)]
  lowest = [19, 19 if pathlib.Path('/proc/self/autogroup').exists() else 0]
  assert waiting == [lowest if children.standby_waits_idle() else own] * 2
  assert [j['nice'] for j in joined] == [own] * 2


def test_an_abandoned_standby_never_joins_and_leaves_nothing_running(tmp_path, monkeypatch):
  monkeypatch.chdir(REPO)
  generation = _generation(tmp_path, number=1)
  generation.prepare()
  _wait_for([tmp_path / 'waiting_0', tmp_path / 'waiting_1'])
  generation.abandon()
  assert all(process.poll() is not None for process in generation._processes)  # pylint: disable=protected-access
  assert not list(tmp_path.glob('joined_*'))
  generation.prepare()  # Abandoned for good: nothing starts again.
  assert not generation._processes[2:]  # pylint: disable=protected-access


def test_processes_that_all_fail_before_the_first_look_are_still_blamed(tmp_path, monkeypatch):
  """Processes gone between two polls (here: a module that does not exist) are a failure named by one of them (a
  slower one may still be starting, and is stopped)."""
  monkeypatch.chdir(REPO)
  outcome = _generation(tmp_path, number=0, module='tests.parallel.no_such_module').run(grace_s=5)
  assert not outcome.succeeded and outcome.failure is not None, outcome
  assert outcome.codes[outcome.failure.process] == 1 and 'code 1' in outcome.failure.how, outcome
