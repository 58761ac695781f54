"""The paired-window measurement of the shadow thread's cost, on the tiny config."""

import pytest

from experiments.configs import default
from shadowsync_jax import shadow_overhead


def _config(algorithm='shadow_ma', window_steps=6, pairs=2):
  config = default.get_config('tiny')
  config.num_replicas = 4
  config.sync.algorithm = algorithm
  config.data.num_train_examples = (shadow_overhead.steps_needed(window_steps, pairs) * config.num_replicas *
                                    config.batch_size)
  return config


def test_measure_pairs_windows_with_and_without_the_thread():
  result = shadow_overhead.measure(_config(), window_steps=6, pairs=2)
  assert result['pairs'] == 2 and result['window_steps'] == 6
  assert result['examples_per_sec_without'] > 0 and result['examples_per_sec_with'] > 0
  assert 0 < result['ratio_q25'] <= result['ratio_median'] <= result['ratio_q75']
  # Each window with the thread ends by merging its round in flight, so every such window merged one at least.
  assert result['sync_rounds'] >= 2


def test_measure_rejects_what_it_cannot_measure():
  with pytest.raises(ValueError, match='background thread'):
    shadow_overhead.measure(_config(algorithm='fr_ma'), window_steps=6, pairs=2)
  with pytest.raises(ValueError, match='data.num_train_examples'):
    shadow_overhead.measure(_config(), window_steps=6, pairs=3)  # The stream holds 2 pairs only.
  with pytest.raises(ValueError, match='window_steps'):
    shadow_overhead.measure(_config(), window_steps=0, pairs=2)
