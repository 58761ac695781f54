"""The Criteo binaries as a user runs them: generate day files, prepare them (again: nothing to do), and the one
line a malformed file or a bad flag prints."""

import os
import pathlib
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = '--config=experiments/configs/criteo_kaggle.py:tiny'


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, '-m', module, *args],
    cwd=REPO_ROOT,
    env={**os.environ, 'PYTHONPATH': str(REPO_ROOT)},
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )


def test_generate_then_prepare_then_prepare_again(tmp_path):
  days = tmp_path / 'days'
  generated = _run('experiments.generate_criteo', TINY, '--rows=7000', '--days=7', f'--output_dir={days}')
  assert generated.returncode == 0, generated.stderr
  assert sorted(p.name for p in days.iterdir())[:3] == ['day_0.gz', 'day_0.p_true.npy', 'day_1.gz']
  dataset = tmp_path / 'tfds' / 'criteo_click_blocks' / 'kaggle_tiny'
  args = (TINY, f'--config.data.prepared_dir={dataset}', f'--inputs={days}/day_*.gz', '--workers=2')
  prepared = _run('experiments.prepare_criteo', *args)
  assert prepared.returncode == 0, prepared.stderr
  assert '  train: 6,000 rows' in prepared.stdout and '  heldout: 1,000 rows' in prepared.stdout, prepared.stdout
  assert 'rows per CPU-second' in prepared.stdout and (dataset / '1.0.0' / 'criteo_manifest.json').exists()
  again = _run('experiments.prepare_criteo', *args)
  assert again.returncode == 0 and 'nothing to do' in again.stdout, again.stderr


def test_a_malformed_line_ends_the_preparation_with_its_file_and_line(tmp_path):
  day = tmp_path / 'day_0'
  good = '\t'.join(['1'] + ['5'] * 13 + ['0000000a'] * 26)
  day.write_text('\n'.join([good] * 40 + ['1\t2'] + [good] * 5) + '\n')
  dataset = tmp_path / 'tfds' / 'criteo_click_blocks' / 'bad'
  result = _run(
    'experiments.prepare_criteo', TINY, f'--config.data.prepared_dir={dataset}', f'--inputs={day}', '--heldout_days=0'
  )
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f'error: {day}:41: expected 40 tab-separated columns, found 2.') and '--skip_malformed' in last


def test_inputs_that_match_nothing_are_a_usage_error(tmp_path):
  result = _run('experiments.prepare_criteo', TINY, f'--inputs={tmp_path}/day_*.gz')
  assert result.returncode == 2
  flags = '(--inputs, --days, --heldout_days, --config.data.prepared_dir)'
  assert result.stderr.strip().splitlines() == [f"error: '{tmp_path}/day_*.gz' matches no file. {flags}"]


def test_an_unquoted_glob_is_a_usage_error(tmp_path):
  result = _run('experiments.prepare_criteo', TINY, f'--inputs={tmp_path}/day_0.gz', f'{tmp_path}/day_1.gz')
  assert result.returncode == 2 and 'quote a glob in --inputs' in result.stderr
