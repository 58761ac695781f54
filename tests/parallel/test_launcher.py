"""The launcher's generation: which process it blames when the job ends."""

import pathlib

from shadowsync_jax.parallel import launcher

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_processes_that_all_fail_before_the_first_look_are_still_blamed(tmp_path, monkeypatch):
  """Processes gone between two polls (here: a module that does not exist) are a failure named by one of them (a
  slower one may still be starting, and is stopped)."""
  monkeypatch.chdir(REPO)
  generation = launcher.Generation(
    [f'--workdir={tmp_path}'],
    num_processes=2,
    cpu_devices=1,
    peer_timeout_s=10,
    pin_cpus=False,
    coordinator_port=launcher.free_port(),
    module='tests.parallel.no_such_module',
  )
  outcome = generation.run(grace_s=5)
  assert not outcome.succeeded and outcome.failure is not None, outcome
  assert outcome.codes[outcome.failure.process] == 1 and 'code 1' in outcome.failure.how, outcome
