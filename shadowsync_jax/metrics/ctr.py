"""Evaluation metrics for click-through-rate models, on host numpy arrays.

  probabilities_N = np.asarray(jax.nn.sigmoid(logits_N))
  results = metrics.evaluate(labels_N, probabilities_N)
  # {'ne': 0.79, 'auc': 0.80, 'logloss': 0.45, 'calibration': 1.01, 'num_examples': 1000000}

All functions take 0/1 labels and predicted click probabilities of the same shape (any shape; they are
flattened), compute in float64 and return Python floats. NE and calibration follow torchrec's definitions
(torchrec/metrics/ne.py, torchrec/metrics/calibration.py) so numbers compare with the DLRM literature.
"""

from typing import Any

import numpy as np

EPS = 1e-12  # torchrec's `eta`: probabilities and the mean label are clamped to [EPS, 1 - EPS].


def _as_checked_arrays(labels: Any, probabilities: Any) -> tuple[np.ndarray, np.ndarray]:
  """Flattens to float64 and rejects inputs that would give a silently wrong number."""
  labels_N = np.asarray(labels, dtype=np.float64).ravel()
  probabilities_N = np.asarray(probabilities, dtype=np.float64).ravel()
  if labels_N.shape != probabilities_N.shape:
    raise ValueError(f'labels and probabilities differ in size: {labels_N.size} vs {probabilities_N.size}.')
  if labels_N.size == 0:
    raise ValueError('Metrics need at least one example; got none.')
  if not np.all((labels_N == 0.0) | (labels_N == 1.0)):
    raise ValueError('labels must be 0 or 1.')
  if not np.all((probabilities_N >= 0.0) & (probabilities_N <= 1.0)):
    raise ValueError(
      'probabilities must lie in [0, 1] (pass sigmoid(logits), not logits); found '
      f'min {np.min(probabilities_N)}, max {np.max(probabilities_N)}.'
    )
  return labels_N, probabilities_N


def _cross_entropy_sum(labels_N: np.ndarray, probabilities_N: np.ndarray) -> float:
  clipped_N = np.clip(probabilities_N, EPS, 1.0 - EPS)
  return float(-np.sum(labels_N * np.log(clipped_N) + (1.0 - labels_N) * np.log1p(-clipped_N)))


def _binary_entropy(p: float) -> float:
  """Entropy in nats of a coin that lands 1 with probability `p` (clamped like torchrec)."""
  p = min(max(p, EPS), 1.0 - EPS)
  return float(-(p * np.log(p) + (1.0 - p) * np.log1p(-p)))


def log_loss(labels: Any, probabilities: Any) -> float:
  """Mean binary cross-entropy in nats, with probabilities clipped to [EPS, 1 - EPS] as torchrec does."""
  labels_N, probabilities_N = _as_checked_arrays(labels, probabilities)
  return _cross_entropy_sum(labels_N, probabilities_N) / labels_N.size


def normalized_entropy(labels: Any, probabilities: Any) -> float:
  """Normalized entropy (He et al. 2014, "Practical Lessons from Predicting Clicks on Ads at Facebook").

  Mean cross-entropy divided by the entropy of the mean label m, `-(m log m + (1 - m) log(1 - m))`: the log loss
  of the best constant predictor. 1.0 means no better than predicting the base rate; lower is better.
  Computed as torchrec/metrics/ne.py does: predictions clamped to [EPS, 1 - EPS] before the log, and the mean
  label clamped to [EPS, 1 - EPS] too, so a single-class set gives a huge but finite NE rather than a division
  by zero. (torchrec uses log2 for both terms; the ratio does not depend on the base.)
  """
  labels_N, probabilities_N = _as_checked_arrays(labels, probabilities)
  mean_cross_entropy = _cross_entropy_sum(labels_N, probabilities_N) / labels_N.size
  return mean_cross_entropy / _binary_entropy(float(np.mean(labels_N)))


def auc(labels: Any, probabilities: Any) -> float:
  """Area under the ROC curve: P(a random positive scores above a random negative), ties counting half.

  Mann-Whitney U from average ranks, O(N log N): 1M examples take a fraction of a second.
  Raises ValueError when only one class is present, where AUC is undefined.
  """
  labels_N, probabilities_N = _as_checked_arrays(labels, probabilities)
  num_positives = int(np.sum(labels_N))
  num_negatives = labels_N.size - num_positives
  if num_positives == 0 or num_negatives == 0:
    raise ValueError(f'AUC needs both classes; got {num_positives} positives and {num_negatives} negatives.')
  _, value_index_N, counts_U = np.unique(probabilities_N, return_inverse=True, return_counts=True)
  last_rank_U = np.cumsum(counts_U).astype(np.float64)  # 1-based rank of each distinct value's last copy.
  average_rank_U = last_rank_U - (counts_U - 1) / 2.0
  positive_rank_sum = float(np.sum(average_rank_U[value_index_N.ravel()] * labels_N))
  u_statistic = positive_rank_sum - num_positives * (num_positives + 1) / 2.0
  return u_statistic / (float(num_positives) * float(num_negatives))


def calibration(labels: Any, probabilities: Any) -> float:
  """Mean prediction / mean label: 1.0 when the model predicts as many clicks as happened.

  NaN when there are no positives (torchrec reports 0.0 there, which reads like a real value).
  """
  labels_N, probabilities_N = _as_checked_arrays(labels, probabilities)
  positives = float(np.sum(labels_N))
  if positives == 0.0:
    return float('nan')
  return float(np.sum(probabilities_N)) / positives


def evaluate(labels: Any, probabilities: Any) -> dict[str, float | int]:
  """All metrics at once: keys `ne`, `auc`, `logloss`, `calibration`, `num_examples`.

  Raises ValueError (from `auc`) when the labels hold a single class.
  """
  labels_N, probabilities_N = _as_checked_arrays(labels, probabilities)
  return {
    'ne': normalized_entropy(labels_N, probabilities_N),
    'auc': auc(labels_N, probabilities_N),
    'logloss': log_loss(labels_N, probabilities_N),
    'calibration': calibration(labels_N, probabilities_N),
    'num_examples': int(labels_N.size),
  }
