"""Evaluation of the consensus model on the held-out set, beside the Bayes NE floor of synthetic data.

  results = evaluation.evaluate(predict, eval_source, batch_size)   # predict(dense_ExF, sparse_ExT) -> [M, E]
  results['ne'], results['auc'], results['logloss'], results['calibration'], results['bayes_ne']
  predict = evaluation.one_model(config.model, config.data.cardinalities, params)   # host params

`predict` gives the click probabilities of the consensus model (row 0: the replica mean, the EA center, or the
single model of sync SGD, docs/design.md §3; `sync.consensus.make_predict` computes them where the model lives)
and, with `per_replica` (`train.eval_per_replica`), of every replica (rows 1..R). `bayes_ne` is the NE of the
teacher's true click probabilities on the same examples (synthetic data, and Criteo files generated from it), None
for real data.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from shadowsync_jax.data import input_pipeline
from shadowsync_jax.metrics import ctr as metrics
from shadowsync_jax.model import dlrm as model_lib
from shadowsync_jax.model import step as step_lib

_READ_CHUNK = 1 << 20


def one_model(
  model_config: ml_collections.ConfigDict, cardinalities: Sequence[int], params: Any
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
  """predict(dense_NxF, sparse_NxT) -> click probabilities [1, N] of one model whose params this process holds whole
  (a parameter server's; a run's `model` section and table sizes), by one jitted function."""
  predict_fn = jax.jit(step_lib.make_predict_fn(model_lib.from_config(model_config), list(cardinalities)))
  params = jax.device_put(params)  # Once, not at every call.
  return lambda dense_NxF, sparse_NxT: np.asarray(predict_fn(params, dense_NxF, sparse_NxT))[None]


def evaluate(
  predict: Callable[[np.ndarray, np.ndarray], np.ndarray], eval_source: Any, batch_size: int, per_replica: bool = False
) -> dict[str, Any]:
  """NE, AUC, log loss and calibration of the consensus model, and the Bayes floor where it is known.

  `predict(dense_ExF, sparse_ExT) -> [M, E]`: row 0 the consensus model's probabilities, rows 1.. every replica's
  (with `per_replica`, giving `ne_per_replica`). The held-out set is read in chunks of `_READ_CHUNK` rows (a Criteo
  day does not fit in memory as one batch) and predicted in chunks of `batch_size` (`train.eval_batch_size`); only
  labels and predictions are kept whole.
  """
  num_eval = len(eval_source)  # The held-out set's length, as make_sources resolved it (0 in the config = all).
  chunk = batch_size
  labels, probabilities = [], []
  for start in range(0, num_eval, _READ_CHUNK):
    examples = eval_source.read(start, min(_READ_CHUNK, num_eval - start))
    labels.append(examples.label)
    for i in range(0, len(examples.label), chunk):
      probabilities.append(predict(examples.dense[i : i + chunk], examples.sparse[i : i + chunk]))
  label_M = np.concatenate(labels)
  probability_KxM = np.concatenate(probabilities, axis=1)
  results = metrics.evaluate(label_M, probability_KxM[0])
  true_probabilities = input_pipeline.eval_true_probability(eval_source, num_eval)
  results['bayes_ne'] = None if true_probabilities is None else metrics.normalized_entropy(label_M, true_probabilities)
  if per_replica:
    results['ne_per_replica'] = [metrics.normalized_entropy(label_M, p) for p in probability_KxM[1:]]
  return results
