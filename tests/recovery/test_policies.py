"""Which K a start of a job dispatches: a restart reuses the K its first start's probe chose."""

from shadowsync_jax import config as config_lib
from shadowsync_jax.parallel import control
from shadowsync_jax.parallel import history
from shadowsync_jax.recovery import policies


def _config(steps_per_dispatch):
  config = config_lib.base_config()
  config.train.steps_per_dispatch = steps_per_dispatch
  return config


def test_a_restart_dispatches_the_k_an_earlier_start_chose(tmp_path, monkeypatch):
  policies.note_steps_per_dispatch(tmp_path, 32)  # Generation 0's probe chose 32 (this process is process 0).
  monkeypatch.setenv(control.GENERATION_ENV, '2')
  assert policies.steps_per_dispatch(_config('auto'), tmp_path) == 32
  assert policies.steps_per_dispatch(_config(8), tmp_path) == 8  # A K given in the config is the config's.
  policies.note_steps_per_dispatch(tmp_path, 64)  # Generation 2's own (it probed): not an earlier start's.
  assert [r['generation'] for r in history.read(tmp_path)] == [0, 2]
  assert policies.steps_per_dispatch(_config('auto'), tmp_path) == 32


def test_a_first_start_or_a_restart_without_a_choice_probes(tmp_path, monkeypatch):
  monkeypatch.setenv(control.GENERATION_ENV, '1')
  assert policies.steps_per_dispatch(_config('auto'), tmp_path) == 'auto'  # Killed before its probe ended.
  monkeypatch.setenv(control.GENERATION_ENV, '0')
  policies.note_steps_per_dispatch(tmp_path, 16)
  # A run resumed by hand (no launcher: generation 0), perhaps on another machine, probes again.
  assert policies.steps_per_dispatch(_config('auto'), tmp_path) == 'auto'
