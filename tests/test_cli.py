"""Errors a person can read: a refused config prints one line naming the key or file, exits 2, no traceback."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from shadowsync_jax import cli
from shadowsync_jax import config as config_lib

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = '--config=experiments/configs/default.py:tiny'


def _python(*args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, 'PYTHONPATH': str(REPO_ROOT)}
  return subprocess.run(
    [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
  )


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
  return _python('-m', module, *args)


def _train_tiny_briefly(workdir: pathlib.Path) -> subprocess.CompletedProcess:
  return _run(
    'experiments.train',
    f'--workdir={workdir}',
    TINY,
    '--config.data.num_train_examples=2048',
    '--config.data.num_eval_examples=512',
  )


def test_a_typo_in_a_key_suggests_the_nearest_key():
  assert cli.unknown_config_keys(['--config.sync.algoritm=fr_ma', '--config.seed=1']) == [
    "unknown config key 'sync.algoritm' (in --config.sync.algoritm); did you mean --config.sync.algorithm?"
  ]
  assert cli.unknown_config_keys(['--', '--config.nope=1']) == []  # After `--`: another program's flags.
  [group] = cli.unknown_config_keys(['--config.sync=3'])
  assert 'is a group of keys' in group and '--config.sync.' in group


def test_a_typo_in_a_config_file_suggests_the_nearest_key():
  config = config_lib.base_config()
  config.train.checkpoint_evry_steps = 5  # A config file can add a key; validation names it.
  with pytest.raises(
    config_lib.ConfigError, match="'train.checkpoint_evry_steps'; did you mean 'train.checkpoint_every_steps'"
  ):
    config_lib.validate(config, num_devices=8)


def test_num_replicas_zero_means_one_replica_per_process():
  config = config_lib.base_config()
  assert config.num_replicas == 0
  assert config_lib.resolve(config, num_processes=4).num_replicas == 4
  assert config.num_replicas == 0  # resolve returns a copy.
  config.num_replicas = 6
  with pytest.raises(config_lib.ConfigError, match='num_replicas=6 must be a multiple of the process count'):
    config_lib.validate(config, num_devices=None, num_processes=4)


@pytest.mark.parametrize(
  'args, names',
  [
    (['--config.sync.algoritm=fr_ma'], '--config.sync.algorithm'),
    (['--config.num_replicas=abc'], '--config.num_replicas=abc'),
    (['--config.sync.algorithm=fr_mx'], "sync.algorithm='fr_mx'"),
    (['--config.sync.min_interval_s=soon'], "sync.min_interval_s='soon' must be 'auto'"),
    (['--config.num_replicas=9'], 'num_replicas=9'),
    (['--config.data.source=criteo', '--config.data.train_path=/no/such.tsv'], "data.train_path='/no/such.tsv'"),
    (['--config=experiments/configs/no_such.py'], "'experiments/configs/no_such.py' does not exist"),
  ],
  ids=[
    'key typo',
    'value type',
    'bad value',
    'bad interval',
    'too many replicas',
    'missing data file',
    'missing config file',
  ],
)
def test_train_refuses_a_bad_config_in_one_line_with_exit_status_2(tmp_path, args, names):
  result = _run('experiments.train', f'--workdir={tmp_path}', TINY, *args)
  assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr
  lines = (result.stdout + result.stderr).strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ') and names in lines[0], lines
  assert not list(tmp_path.iterdir()), 'nothing may be written for a refused config'


def test_a_refused_replica_count_is_one_line_under_other_jax_versions(tmp_path):
  """The device count is checked before anything that uses a private API (whose version warning would print
  first under a jax other than the pinned one)."""
  argv = ['experiments.train', f'--workdir={tmp_path}', TINY, '--config.num_replicas=9']
  result = _python(
    '-c',
    'import runpy, sys; from shadowsync_jax.parallel import private_apis; '
    "private_apis.WRITTEN_FOR['jax'] = '0.0.1'; "
    f'sys.argv = {argv!r}; runpy.run_module("experiments.train", run_name="__main__")',
  )
  assert result.returncode == cli.USAGE_EXIT_CODE, result.stderr
  lines = (result.stdout + result.stderr).strip().splitlines()
  assert len(lines) == 1 and 'num_replicas=9' in lines[0], lines


@pytest.mark.parametrize('interval, expected', [('0.2', 0.2), ('auto', None)])
def test_the_shadow_interval_is_seconds_or_auto_on_the_command_line(tmp_path, interval, expected):
  """`sync.min_interval_s` defaults to the string 'auto'; a number still parses as seconds. The summary says which
  pace the rounds kept (the paced one is measured, so only its presence is checked)."""
  result = _run(
    'experiments.train',
    f'--workdir={tmp_path}',
    TINY,
    '--cpu_devices=2',
    '--config.num_replicas=2',
    '--config.sync.algorithm=shadow_ma',
    f'--config.sync.min_interval_s={interval}',
    '--config.train.steps_per_dispatch=1',  # 64 steps: under 'auto''s blocks too few may fall between rounds.
    '--config.data.num_train_examples=16384',
    '--config.data.num_eval_examples=512',
  )
  assert result.returncode == 0, result.stderr
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['config']['sync']['min_interval_s'] == (expected or 'auto')
  assert summary['sync_rounds'] >= 1
  if expected is not None:
    assert summary['sync_interval_s'] == expected
  else:
    assert summary['sync_interval_s'] > 0 and summary['step_time_s'] > 0, summary


def test_launch_prints_a_refused_config_once_and_exits_2(tmp_path):
  result = _run(
    'experiments.launch',
    '--num_processes=2',
    '--cpu_devices=1',
    '--',
    f'--workdir={tmp_path}',
    TINY,
    '--config.sync.algoritm=fr_ma',
  )
  assert result.returncode == cli.USAGE_EXIT_CODE, result.stdout + result.stderr
  errors = [line for line in result.stdout.splitlines() if 'error: ' in line]
  assert len(errors) == 1 and 'did you mean --config.sync.algorithm?' in errors[0], result.stdout
  assert 'Traceback' not in result.stdout + result.stderr


def test_an_unexpected_error_keeps_its_traceback(tmp_path):
  (tmp_path / 'summary.json').mkdir()  # The summary cannot be written: not a config problem.
  result = _train_tiny_briefly(tmp_path)
  assert result.returncode == 1 and 'Traceback' in result.stderr and 'IsADirectoryError' in result.stderr


def test_a_workdir_of_another_run_is_one_line_with_exit_status_3(tmp_path):
  """Its checkpoint holds another state (here: another top MLP): the run says so and what to do, once,
  never "damaged", never a traceback."""
  first = _run('experiments.train', f'--workdir={tmp_path}', TINY, '--config.train.stop_at_step=4')
  assert first.returncode == 0, first.stderr[-2000:]
  result = _run('experiments.train', f'--workdir={tmp_path}', TINY, '--config.model.top_mlp=[32,1]')
  assert result.returncode == 3, result.stderr[-2000:]
  assert 'Traceback' not in result.stderr and 'damaged' not in result.stderr, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and 'does not match this run' in errors[0] and 'Use a new workdir' in errors[0]


_TINY_CARDINALITIES = (50,) * 26


_REFUSED_CHANGES = [  # A change to the run, and what the refusal names.
  ('--config.seed=1', "initial state of another run (['train'].params['embedding'] differs"),
  (f'--config.data.cardinalities={(*_TINY_CARDINALITIES[:-1], 40)}', 'data.cardinalities[25] 50 there, 40 here'),
  ('--config.model.top_mlp=[32,1]', "['train'].params['mlp']['top']['Dense_0']['bias'] is [[1, 16], 'float32']"),
]


def test_an_incremental_checkpoint_is_refused_by_a_run_it_cannot_be_restored_into_exactly(tmp_path):
  """A differential lays the rows it saved over the initial state this run rebuilds: over another one (another
  seed: every row the first run never touched would hold the new seed's values) or into other shapes, the run says
  what differs in one line (exit status 3) before it trains or says it resumed; and leaves the workdir as it was
  (each change below meets the same checkpoint)."""
  # A differential at step 4 (the tiny tables' rows nearly all change in 4 steps: kept from becoming a baseline).
  incremental = ('--config.recovery.incremental=true', '--config.recovery.rebaseline_fraction=1000')
  first = _run('experiments.train', f'--workdir={tmp_path}', TINY, *incremental, '--config.train.stop_at_step=4')
  assert first.returncode == 0, first.stderr[-2000:]
  for changed, differs in _REFUSED_CHANGES:
    result = _run('experiments.train', f'--workdir={tmp_path}', TINY, *incremental, changed)
    assert result.returncode == 3, (changed, result.stderr[-2000:])
    assert 'Traceback' not in result.stderr and 'Resumed' not in result.stdout + result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
    assert len(errors) == 1 and '(a differential over the initial state) does not match this run' in errors[0]
    assert differs in errors[0] and errors[0].endswith(
      'Use a new workdir, or delete that checkpoint directory to start over.'
    )


@pytest.mark.parametrize('module', ['experiments.coordinator', 'experiments.launch'])
def test_the_coordinator_and_the_launcher_start_without_the_training_stack(module):
  """Each generation of a job waits for its coordinator to serve before its processes start: the config schema, and
  JAX and flax with it, would cost it a second and more per start (and the launcher once a job)."""
  loaded = 'import sys; print(sorted(m for m in ("jax", "flax", "shadowsync_jax.config") if m in sys.modules))'
  result = _python('-c', f'import {module}; {loaded}')
  assert result.returncode == 0 and result.stdout.strip() == '[]', result.stdout + result.stderr


def test_train_keeps_its_programs_where_jax_compilation_cache_dir_says(tmp_path):
  """JAX's own setting wins over the workdir's cache (the tests share one cache this way: conftest.py)."""
  result = _train_tiny_briefly(tmp_path)
  assert result.returncode == 0, result.stderr
  assert not (tmp_path / 'compilation_cache').exists()
  assert any((pathlib.Path(os.environ['JAX_COMPILATION_CACHE_DIR']) / 'process_0').iterdir())
