"""Training from the prepared data is training from the TSV files: the same batches, so the same model and NE."""

import generated_criteo
import pytest

from experiments.configs import criteo_kaggle
from shadowsync_jax import train


def _config(**data):
  config = criteo_kaggle.get_config('tiny')
  config.num_replicas, config.batch_size = 2, 64
  config.data.cardinalities = generated_criteo.CARDINALITIES
  config.train.checkpoint_every_steps = 0
  for key, value in data.items():
    config.data[key] = value
  return config


def test_training_from_prepared_data_equals_training_from_the_tsv(criteo_days, prepared_criteo, tmp_path):
  plain = [generated_criteo.plain(path) for path in criteo_days]
  from_tsv = train.train_and_evaluate(
    _config(source='criteo', train_path=','.join(plain[:2]), eval_path=plain[2]), tmp_path / 'tsv'
  )
  from_prepared = train.train_and_evaluate(_config(prepared_dir=prepared_criteo[0]), tmp_path / 'prepared')
  assert from_prepared['train_examples'] == from_tsv['train_examples'] == 8000 // 128 * 128  # Days 0-1, whole.
  assert from_prepared['config']['data']['num_eval_examples'] == 4000  # Day 2, whole.
  for key in ('eval_ne', 'eval_auc', 'bayes_ne'):
    assert from_prepared[key] == pytest.approx(from_tsv[key], rel=1e-6), key
  assert from_prepared['consensus_fingerprint_per_process'] == from_tsv['consensus_fingerprint_per_process']
  assert from_prepared['bayes_ne'] < from_prepared['eval_ne'] < 1.0  # It learned, and the floor holds.
