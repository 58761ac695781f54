"""The CPR study over seeds: each mode is read against the runs of its own seed, then summed up over the seeds."""

import pytest

from shadowsync_jax.studies import cpr
from shadowsync_jax.studies import result_files


def _run(seed, mode, eval_ne, overhead_pct, failures=3, recovered_as=None):
  details = None
  if mode != 'none':
    details = {
      'blocked_on_saves_s': 1.0,
      'blocked_on_priority_saves_s': 0.0,
      'failure_free_s': 100.0,
      'retrained_s': 0.5,
      'restore_s': 0.1,
      'row_counting_s': 0.0,
      'lost_lookup_fraction': 0.001,
      'priority_interval_steps': None,
    }
  return {
    'seed': seed,
    'recovery_mode': mode,
    'label': {'none': 'no failures', 'cpr': f'cpr (as {recovered_as})'}.get(mode, mode),
    'recovered_as': recovered_as or mode,
    'eval_ne': eval_ne,
    'recovery_overhead_pct': None if mode == 'none' else overhead_pct,
    'num_failures': 0 if mode == 'none' else failures,
    'checkpoint_interval_steps': None if mode == 'none' else 50,
    'estimated_pls': None,
    'actual_pls': 0.0 if mode in ('none', 'full') else 0.01,
    'recovery': details,
    'wall_time_s': 10.0,
    'train_steps': 100,
    'config': {
      'data': {'num_train_examples': 1000},
      'num_replicas': 1,
      'sync': {'algorithm': 'none'},
      'recovery': {
        'failure_target': 'embedding_shard',
        'mtbf_steps': 50,
        'num_embedding_shards': 4,
        'target_pls': 0.01,
        'priority_fraction': 0.1,
        'ssu_sample_rate': 0.05,
      },
    },
  }


ROWS = [
  _run(0, 'none', 0.80, None),
  _run(0, 'full', 0.80, 10.0),
  _run(0, 'partial', 0.804, 5.0),
  _run(0, 'cpr', 0.80, 10.0, recovered_as='full'),
  _run(1, 'none', 0.90, None),  # Another seed: another data stream and model, another NE.
  _run(1, 'full', 0.90, 20.0),
  _run(1, 'partial', 0.8991, 2.0),
  _run(1, 'cpr', 0.8991, 2.2, recovered_as='cpr_mfu'),
]


def test_each_mode_is_read_against_its_own_seed_then_summed_up():
  modes = cpr.by_mode(ROWS)
  assert list(modes) == ['full', 'partial', 'cpr']
  partial = modes['partial']
  assert partial['overhead_vs_full'] == pytest.approx((0.5 + 0.1) / 2)
  assert partial['overhead_vs_full_range'] == pytest.approx([0.1, 0.5])
  assert partial['ne_vs_reference_pct_range'] == pytest.approx([-0.1, 0.5])
  assert modes['full']['overhead_pct'] == 15.0 and modes['full']['overhead_pct_range'] == [10.0, 20.0]
  assert modes['cpr']['recovered_as'] == ['full', 'cpr_mfu']


def test_the_table_shows_the_modes_over_the_seeds_then_every_run():
  text = cpr.table(ROWS)
  assert (
    '| partial | 2 | 3.0 | **3.50% (2.00% to 5.00%)** | 0.30 (0.10 to 0.50) | +0.200% (-0.100% to +0.500%) |' in text
  )
  assert '| cpr (as full, cpr_mfu) | 2 |' in text
  assert '| partial, seed 1 | 0.89910 | -0.100% |' in text
  assert 'seeds 0, 1;' in text


def test_one_seed_keeps_the_one_table():
  text = cpr.table(ROWS[:4])
  assert '| partial | 0.80400 | +0.500% |' in text and 'seed' not in text.split('\n\n')[0]


def test_the_headline_gives_means_and_ranges_over_the_seeds(monkeypatch):
  monkeypatch.setattr(result_files, 'rows', lambda path: [{k: v for k, v in r.items() if k != 'config'} for r in ROWS])
  assert cpr.headline('any.md') == (
    "emulated failures, 2 seeds: full recovery's overhead 15.00% (10.00% to 20.00%); `partial` 0.30 (0.10 to 0.50), "
    "`cpr` 0.56 (0.11 to 1.00) of it on the same seed; NE within 0.500% of the failure-free run's"
  )


def test_a_bound_every_run_must_keep_is_met_only_when_every_run_keeps_it():
  """Each run's NE and restart are bounds a run keeps or not: the headline counts the runs over, never 'within
  noise' for a spread that holds both."""
  assert result_files.runs_verdict([0.0, 0.05, 0.1], 0.1) == 'met by every run'
  assert result_files.runs_verdict([0.0, 2.7, 0.05], 0.1) == 'not met by 1 of 3 runs'


def test_a_study_run_again_in_the_same_root_trains_every_run_again(tmp_path):
  """Its recorded command is what `benchmarks.reproduce` reruns, `--workdir` included: in a used root each run
  resumed its finished checkpoint, trained nothing, and the table divided by a failure-free time of zero."""
  from experiments.configs import default  # pylint: disable=import-outside-toplevel

  base = default.get_config('tiny')
  base.data.num_train_examples, base.data.num_eval_examples = 4096, 1024
  base.train.progress_every_s = 1e6
  base.recovery.mtbf_steps = 16.0
  first = cpr.run(base, tmp_path, modes=('none', 'full'))
  again = cpr.run(base, tmp_path, modes=('none', 'full'))
  assert [r['train_steps'] for r in again] == [r['train_steps'] for r in first] == [32, 32]
  assert [r['resumed_from_step'] for r in again] == [0, 0]
  assert again[1]['recovery']['failure_free_s'] > 0
  assert again[1]['eval_ne'] == first[1]['eval_ne']  # The same run, from the start.
  assert 'no failures' in cpr.table(again)
