"""Tests of the reference baselines on problems whose answer is known."""

import numpy as np
import pytest

from shadowsync_jax.data import synthetic
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.metrics import ctr
from shadowsync_jax.studies import baselines


def _logistic_problem(num_examples: int, seed: int) -> tuple[Batch, np.ndarray, np.ndarray, float]:
  """Dense features with labels drawn from a known logistic model of them; returns (batch, probs, w, b)."""
  rng = np.random.default_rng(seed)
  dense = np.log1p(np.floor(np.exp(rng.normal(2.0, 1.0, (num_examples, 13))))).astype(np.float32)
  weights, intercept = np.linspace(-0.8, 0.8, 13), -1.2
  probability = 1 / (1 + np.exp(-((dense - 2.0) @ weights + intercept)))
  label = (rng.random(num_examples) < probability).astype(np.float32)
  batch = Batch(dense=dense, sparse=np.zeros((num_examples, 26), np.int32), label=label)
  return batch, probability, weights, intercept


def test_fit_recovers_a_known_logistic_model():
  batch, _, weights, _ = _logistic_problem(100_000, seed=0)
  fitted, _ = baselines.fit_logistic_regression(batch.dense - 2.0, batch.label)
  np.testing.assert_allclose(fitted, weights, atol=0.05)


def test_dense_logistic_regression_reaches_the_bayes_ne_of_a_logistic_teacher():
  train, _, _, _ = _logistic_problem(50_000, seed=1)
  eval_batch, eval_probability, _, _ = _logistic_problem(50_000, seed=2)
  fitted_ne = baselines.dense_logistic_regression_ne(train, eval_batch)
  bayes = ctr.normalized_entropy(eval_batch.label, eval_probability)
  assert bayes < 0.9  # the teacher is informative, so reaching its floor means something
  assert fitted_ne == pytest.approx(bayes, rel=0.005)


def test_constant_predictor_ne():
  eval_batch, _, _, _ = _logistic_problem(10_000, seed=3)
  assert baselines.constant_predictor_ne(eval_batch, eval_batch) == pytest.approx(1.0, abs=1e-12)
  half = eval_batch._replace(label=np.tile([0.0, 1.0], 5000).astype(np.float32))
  m = float(np.mean(eval_batch.label, dtype=np.float64))
  expected = -(m * np.log(0.5) + (1 - m) * np.log(0.5)) / -(m * np.log(m) + (1 - m) * np.log(1 - m))
  assert baselines.constant_predictor_ne(half, eval_batch) == pytest.approx(expected, rel=1e-9)


def test_default_synthetic_signal_is_mostly_categorical():
  """Dense features alone stay well above the Bayes floor: a model must use the categorical ids."""
  source = synthetic.SyntheticSource()
  train = source.read(0, 60_000)
  eval_batch, probability = source.read_with_probability(60_000, 30_000)
  bayes = ctr.normalized_entropy(eval_batch.label, probability)
  dense_only = baselines.dense_logistic_regression_ne(train, eval_batch)
  assert dense_only > 1.1 * bayes
  assert dense_only < 0.995  # but the dense features do carry some signal
