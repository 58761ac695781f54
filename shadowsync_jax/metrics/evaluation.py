"""Evaluation of the consensus model on the held-out set, beside the Bayes NE floor of synthetic data.

  results = evaluation.evaluate(config, consensus_params, params_R, eval_source)  # host arrays; params_R may be None
  results['ne'], results['auc'], results['logloss'], results['calibration'], results['bayes_ne']

The consensus model comes from the sync driver: the replica mean, the EA center, or the single model of sync
SGD (DESIGN §3). `bayes_ne` is the NE of the teacher's true click probabilities on the same examples (synthetic
data, and Criteo files generated from it), None for real data.
"""

from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from shadowsync_jax.data import input_pipeline
from shadowsync_jax.metrics import ctr as metrics
from shadowsync_jax.model import dlrm as model_lib
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.parallel import replicas

_READ_CHUNK = 1 << 20


def make_predict(config: ml_collections.ConfigDict) -> Callable[[Any, np.ndarray, np.ndarray], np.ndarray]:
  """predict(params, dense_NxF, sparse_NxT) -> click probabilities of one model for N examples, computed in
  chunks of `config.train.eval_batch_size` by one jitted function (compiled once per chunk shape)."""
  predict_fn = jax.jit(step_lib.make_predict_fn(model_lib.from_config(config.model), list(config.data.cardinalities)))
  chunk = config.train.eval_batch_size

  def predict(params: Any, dense_NxF: np.ndarray, sparse_NxT: np.ndarray) -> np.ndarray:
    return np.concatenate(
      [
        np.asarray(predict_fn(params, dense_NxF[i : i + chunk], sparse_NxT[i : i + chunk]))
        for i in range(0, len(dense_NxF), chunk)
      ]
    )

  return predict


def evaluate(config: ml_collections.ConfigDict, params: Any, params_R: Any, eval_source: Any) -> dict[str, Any]:
  """NE, AUC, log loss and calibration of the consensus model `params`, and the Bayes floor where it is known.

  With `config.train.eval_per_replica`, also `ne_per_replica`: the NE of every replica's own model in `params_R`.
  The held-out set is read in chunks of `_READ_CHUNK` rows (a Criteo day does not fit in memory as one batch); only
  labels and predictions are kept whole.
  """
  num_eval = len(eval_source)  # The held-out set's length, as make_sources resolved it (0 in the config = all).
  predict = make_predict(config)
  models = [params, *(replicas.unstack(params_R) if config.train.eval_per_replica else [])]
  labels, probabilities = [], [[] for _ in models]
  for start in range(0, num_eval, _READ_CHUNK):
    chunk = eval_source.read(start, min(_READ_CHUNK, num_eval - start))
    labels.append(chunk.label)
    for model_params, out in zip(models, probabilities):
      out.append(predict(model_params, chunk.dense, chunk.sparse))
  label_M = np.concatenate(labels)
  results = metrics.evaluate(label_M, np.concatenate(probabilities[0]))
  true_probabilities = input_pipeline.eval_true_probability(eval_source, num_eval)
  results['bayes_ne'] = None if true_probabilities is None else metrics.normalized_entropy(label_M, true_probabilities)
  if config.train.eval_per_replica:
    results['ne_per_replica'] = [metrics.normalized_entropy(label_M, np.concatenate(p)) for p in probabilities[1:]]
  return results
