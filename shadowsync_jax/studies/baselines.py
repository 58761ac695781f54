"""Reference points that need no DLRM: the base-rate predictor and logistic regression on the dense features.

  train, eval = source.read(0, 200_000), source.read(200_000, 50_000)
  baselines.constant_predictor_ne(train, eval)         # ~1.0: predicts the training click rate everywhere
  baselines.dense_logistic_regression_ne(train, eval)  # what the 13 dense features alone are worth

On synthetic data these bracket a result from above, as the Bayes NE (`synthetic.bayes_ne`) brackets it from below:
a DLRM that does not beat dense-only logistic regression has learned nothing from the categorical features.
"""

import numpy as np
import scipy.optimize

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.metrics import ctr as metrics


def constant_predictor_ne(train: Batch, eval: Batch) -> float:  # pylint: disable=redefined-builtin
  """NE on `eval` of predicting the mean training label for every example (1.0 up to base-rate mismatch)."""
  base_rate = float(np.mean(train.label, dtype=np.float64))
  return metrics.normalized_entropy(eval.label, np.full(eval.label.shape, base_rate))


def fit_logistic_regression(
  features_NxF: np.ndarray, labels_N: np.ndarray, l2: float = 1e-6
) -> tuple[np.ndarray, float]:
  """Weights and intercept minimizing the mean log loss (+ a tiny L2 for uniqueness), by full-batch L-BFGS.

  Float64 throughout, exact gradient, run to a gradient tolerance of 1e-10: the optimum, not an early stop.
  """
  x_NxF = np.asarray(features_NxF, np.float64)
  y_N = np.asarray(labels_N, np.float64)
  num_features = x_NxF.shape[1]

  def loss_and_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
    weights, intercept = theta[:num_features], theta[num_features]
    logit_N = x_NxF @ weights + intercept
    loss = np.mean(np.logaddexp(0.0, logit_N) - y_N * logit_N) + 0.5 * l2 * weights @ weights
    residual_N = (0.5 * (1.0 + np.tanh(0.5 * logit_N)) - y_N) / y_N.size  # sigmoid(logit) - y, overflow-free.
    grad = np.concatenate([x_NxF.T @ residual_N + l2 * weights, [residual_N.sum()]])
    return float(loss), grad

  result = scipy.optimize.minimize(
    loss_and_grad,
    np.zeros(num_features + 1),
    jac=True,
    method='L-BFGS-B',
    options={'maxiter': 10_000, 'gtol': 1e-10, 'ftol': 1e-15},
  )
  return result.x[:num_features], float(result.x[num_features])


def dense_logistic_regression_ne(train: Batch, eval: Batch) -> float:  # pylint: disable=redefined-builtin
  """NE on `eval` of logistic regression fitted on `train`'s 13 dense features (standardized) plus an intercept."""
  mean_F = np.mean(train.dense, axis=0, dtype=np.float64)
  std_F = np.maximum(np.std(train.dense, axis=0, dtype=np.float64), 1e-8)
  weights_F, intercept = fit_logistic_regression((train.dense - mean_F) / std_F, train.label)
  logit_N = ((eval.dense - mean_F) / std_F) @ weights_F + intercept
  return metrics.normalized_entropy(eval.label, 0.5 * (1.0 + np.tanh(0.5 * logit_N)))
