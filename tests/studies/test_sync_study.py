"""The sync study's configs: what its settings change, and what its note says they changed."""

from experiments.configs import default
from shadowsync_jax.studies import sync_study


def test_steps_per_dispatch_reaches_every_run_the_shadow_ones_included():
  base = default.get_config('tiny')
  settings = sync_study.Settings(num_replicas=2, steps_per_dispatch=4, seeds=(0,))
  for algorithm in sync_study.ALGORITHMS:
    config = sync_study.config_for(base, settings, algorithm, every_k_steps=10)
    assert config.train.steps_per_dispatch == 4, algorithm
  assert 'train.steps_per_dispatch=4' in sync_study.changed_settings(base, settings)


def test_unset_steps_per_dispatch_leaves_every_run_at_the_default():
  base = default.get_config('tiny')
  base.train.steps_per_dispatch = 'auto'  # The default's (the tiny config sets a K).
  settings = sync_study.Settings(num_replicas=2, seeds=(0,))
  for algorithm in sync_study.ALGORITHMS:
    config = sync_study.config_for(base, settings, algorithm, every_k_steps=10)
    assert config.train.steps_per_dispatch == 'auto', algorithm
  assert 'steps_per_dispatch' not in sync_study.changed_settings(base, settings)


def test_the_table_gives_shadow_rows_their_merge_lag_and_foreground_rows_none():
  def row(label, seed, ne, **stats):
    summary = {'label': label, 'seed': seed, 'eval_ne': ne, 'eval_auc': 0.75, 'examples_per_sec': 1000.0}
    return {**summary, 'bayes_ne': 0.8, 'sync_rounds': 10, 'mean_sync_gap': 12.0, **stats}

  rows = [
    row(label, seed, 0.85, **stats)
    for seed in (0, 1)
    for label, stats in (
      ('none', {'mean_sync_gap': None}),
      ('sync_sgd', {}),
      ('fr_bmuf', {}),
      ('shadow_bmuf', {'mean_merge_lag_steps': 10.0 + seed, 'sync_interval_s': 0.1}),
    )
  ]
  cells = [[cell.strip() for cell in line.strip('|').split('|')] for line in sync_study.table(rows).splitlines()[:6]]
  assert cells[0][8:11] == ['mean sync gap', 'merge lag', 'pace (s)']
  by_label = {line[0]: line for line in cells[2:]}
  assert by_label['shadow_bmuf'][8:11] == ['12.0', '10.5', '0.10']
  assert by_label['fr_bmuf'][8:11] == ['12.0', '', '']
