"""The paired-window measurement of what the shadow rounds cost against `none`, on the tiny config."""

import numpy as np
import pytest
from scipy import stats

from experiments.configs import default
from shadowsync_jax.studies import shadow_overhead


def _config(algorithm='shadow_ma', window_steps=6, pairs=2):
  config = default.get_config('tiny')
  config.num_replicas = 4
  config.sync.algorithm = algorithm
  config.data.num_train_examples = (
    shadow_overhead.steps_needed(window_steps, pairs) * config.num_replicas * config.batch_size
  )
  return config


def test_measure_pairs_windows_with_and_without_the_thread():
  result = shadow_overhead.measure(_config(), window_steps=6, pairs=2)
  assert result['pairs'] == 2 and result['window_steps'] == 6
  assert result['examples_per_sec_without'] > 0 and result['examples_per_sec_with'] > 0
  assert 0 < result['ratio_q25'] <= result['ratio_median'] <= result['ratio_q75']
  assert result['ratio_median_low'] <= result['ratio_median'] <= result['ratio_median_high']
  # A window whose first round is due inside it ends by merging its round in flight: it merged one at least. (The
  # first round's phase is drawn over the gap, which a busy host's timing can make longer than the window.)
  assert result['sync_rounds'] >= result['windows_with_a_round']


def test_measure_rejects_what_it_cannot_measure():
  with pytest.raises(ValueError, match='shadow rounds'):
    shadow_overhead.measure(_config(algorithm='fr_ma'), window_steps=6, pairs=2)
  with pytest.raises(ValueError, match='data.num_train_examples'):
    shadow_overhead.measure(_config(), window_steps=6, pairs=3)  # The stream holds 2 pairs only.
  with pytest.raises(ValueError, match='window_steps'):
    shadow_overhead.measure(_config(), window_steps=0, pairs=2)


def test_median_interval_is_the_sign_test_interval():
  low, high, coverage = shadow_overhead.median_interval(np.arange(40.0)[::-1])  # Order does not matter.
  # The largest k with 1 - 2 P(Binomial(40, 1/2) <= k - 1) >= 0.95 is 14: the 14th and 27th smallest values.
  assert (low, high) == (13.0, 26.0)
  assert coverage == pytest.approx(1 - 2 * stats.binom.cdf(13, 40, 0.5))
  assert coverage >= 0.95 > 1 - 2 * stats.binom.cdf(14, 40, 0.5)
  assert shadow_overhead.median_interval([3.0, 1.0]) == (1.0, 3.0, 0.5)  # Too few for 95%: the range.


def test_median_interval_holds_the_median_as_often_as_it_says():
  rng = np.random.default_rng(0)
  samples = rng.exponential(size=(4000, 40))  # Median log(2).
  intervals = [shadow_overhead.median_interval(s) for s in samples]
  held = np.mean([low <= np.log(2) <= high for low, high, _ in intervals])
  assert held == pytest.approx(intervals[0][2], abs=0.01)
