"""Metrics against independent references: pairwise AUC, hand-computed cross-entropy, scipy's Mann-Whitney U."""

import math
import time

import numpy as np
import pytest

from shadowsync_jax.metrics import ctr as metrics


def _pairwise_auc(labels, probabilities):
  """O(N^2) reference: the fraction of (positive, negative) pairs ranked correctly, ties counting half."""
  positives = [p for p, y in zip(probabilities, labels) if y == 1]
  negatives = [p for p, y in zip(probabilities, labels) if y == 0]
  wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in positives for n in negatives)
  return wins / (len(positives) * len(negatives))


def _random_case_with_ties(seed, size):
  rng = np.random.default_rng(seed)
  labels = (rng.random(size) < 0.3).astype(np.float32)
  labels[:2] = [0.0, 1.0]  # Both classes present.
  probabilities = rng.integers(0, 8, size) / 8.0  # Eight distinct values: many ties, including 0 and 1.
  return labels, probabilities


@pytest.mark.parametrize('seed', [0, 1, 2, 3])
def test_auc_matches_pairwise_count_with_ties(seed):
  labels, probabilities = _random_case_with_ties(seed, size=300)
  assert metrics.auc(labels, probabilities) == pytest.approx(_pairwise_auc(labels, probabilities), abs=1e-12)


def test_auc_matches_pairwise_count_without_ties():
  rng = np.random.default_rng(7)
  labels = (rng.random(200) < 0.5).astype(np.int32)
  probabilities = rng.random(200)
  assert metrics.auc(labels, probabilities) == pytest.approx(_pairwise_auc(labels, probabilities), abs=1e-12)


def test_auc_matches_scipy_mann_whitney():
  stats = pytest.importorskip('scipy.stats')
  labels, probabilities = _random_case_with_ties(seed=11, size=5000)
  positives, negatives = probabilities[labels == 1], probabilities[labels == 0]
  u_statistic = stats.mannwhitneyu(positives, negatives, alternative='two-sided').statistic
  expected = u_statistic / (positives.size * negatives.size)
  assert metrics.auc(labels, probabilities) == pytest.approx(expected, abs=1e-12)


def test_auc_hand_cases():
  assert metrics.auc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0
  assert metrics.auc([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9]) == 0.0
  assert metrics.auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
  # Pairs (pos 0.4 vs neg 0.1, 0.4, 0.7): 1 + 0.5 + 0 = 1.5 of 3.
  assert metrics.auc([0, 1, 0, 0], [0.1, 0.4, 0.4, 0.7]) == pytest.approx(0.5)


def test_auc_does_not_depend_on_example_order():
  labels, probabilities = _random_case_with_ties(seed=5, size=1000)
  permutation = np.random.default_rng(0).permutation(1000)
  assert metrics.auc(labels, probabilities) == metrics.auc(labels[permutation], probabilities[permutation])


def test_auc_is_fast_on_a_million_examples():
  rng = np.random.default_rng(0)
  probabilities = rng.random(1_000_000).astype(np.float32)
  labels = (rng.random(1_000_000) < probabilities).astype(np.float32)  # Calibrated scores: AUC = 0.8333...
  start = time.perf_counter()
  value = metrics.auc(labels, probabilities)
  assert time.perf_counter() - start < 2.0
  assert value == pytest.approx(5.0 / 6.0, abs=2e-3)


@pytest.mark.parametrize('labels', [[0, 0, 0], [1, 1]])
def test_auc_rejects_a_single_class(labels):
  with pytest.raises(ValueError, match='both classes'):
    metrics.auc(labels, np.full(len(labels), 0.5))


def test_log_loss_hand_computed():
  # -(log 0.8 + log(1 - 0.4) + log 0.5) / 3
  expected = -(math.log(0.8) + math.log(0.6) + math.log(0.5)) / 3
  assert metrics.log_loss([1, 0, 1], [0.8, 0.4, 0.5]) == pytest.approx(expected, rel=1e-12)


def test_log_loss_clips_certain_wrong_predictions_at_eps():
  # 1 - 1e-12 rounds in float64, so the wrong-side term is log(1.00009e-12): hence rel=1e-5.
  assert metrics.log_loss([1, 0], [0.0, 1.0]) == pytest.approx(-math.log(1e-12), rel=1e-5)
  assert metrics.log_loss([1, 0], [1.0, 0.0]) == pytest.approx(1e-12, abs=1e-15)


def test_ne_of_constant_base_rate_predictor_is_one():
  labels = np.array([1, 0, 0, 0, 1, 0, 0, 0], dtype=np.float32)  # Base rate 0.25.
  assert metrics.normalized_entropy(labels, np.full(8, 0.25)) == pytest.approx(1.0, rel=1e-12)


def test_ne_hand_computed():
  labels, probabilities = [1, 0, 1, 1], [0.9, 0.2, 0.6, 0.7]
  cross_entropy = -(math.log(0.9) + math.log(0.8) + math.log(0.6) + math.log(0.7)) / 4
  base_entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
  assert metrics.normalized_entropy(labels, probabilities) == pytest.approx(cross_entropy / base_entropy, rel=1e-12)


def test_ne_of_perfect_predictor_is_near_zero():
  labels = np.array([0, 1, 1, 0, 0], dtype=np.float32)
  assert metrics.normalized_entropy(labels, labels.astype(np.float64)) < 1e-10


def test_ne_of_worse_than_base_rate_predictor_exceeds_one():
  labels = np.array([1, 0, 0, 0])
  assert metrics.normalized_entropy(labels, np.full(4, 0.6)) > 1.0


def test_ne_single_class_clamps_mean_label_like_torchrec():
  # Mean label 0 is clamped to 1e-12: base entropy ~ 1e-12 * (1 - log 1e-12), finite, so NE is huge but finite.
  value = metrics.normalized_entropy([0, 0], [0.5, 0.5])
  eps = 1e-12
  expected = math.log(2) / -(eps * math.log(eps) + (1 - eps) * math.log1p(-eps))
  assert value == pytest.approx(expected, rel=1e-6)


def test_calibration():
  assert metrics.calibration([1, 0, 0, 0], [0.5, 0.25, 0.25, 0.0]) == pytest.approx(1.0)
  assert metrics.calibration([1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5]) == pytest.approx(1.0)
  assert metrics.calibration([1, 0, 1, 0], [1.0, 1.0, 1.0, 1.0]) == pytest.approx(2.0)
  assert math.isnan(metrics.calibration([0, 0], [0.1, 0.2]))


def test_evaluate_gathers_every_metric():
  labels, probabilities = _random_case_with_ties(seed=3, size=400)
  results = metrics.evaluate(labels.reshape(20, 20), probabilities.reshape(20, 20))
  assert set(results) == {'ne', 'auc', 'logloss', 'calibration', 'num_examples'}
  assert results['num_examples'] == 400
  assert results['auc'] == pytest.approx(_pairwise_auc(labels, probabilities), abs=1e-12)
  assert results['logloss'] == metrics.log_loss(labels, probabilities)
  assert results['ne'] == metrics.normalized_entropy(labels, probabilities)
  assert results['calibration'] == pytest.approx(np.mean(probabilities) / np.mean(labels))
  assert all(isinstance(value, (float, int)) for value in results.values())


@pytest.mark.parametrize(
  'labels, probabilities, message',
  [
    ([0, 1], [0.5], 'differ in size'),
    ([], [], 'at least one'),
    ([0, 2], [0.5, 0.5], '0 or 1'),
    ([0, 1], [-3.0, 2.5], r'\[0, 1\]'),
    ([0, 1], [0.5, np.nan], r'\[0, 1\]'),
  ],
)
def test_bad_inputs_raise(labels, probabilities, message):
  with pytest.raises(ValueError, match=message):
    metrics.evaluate(labels, probabilities)
