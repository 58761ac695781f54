"""Evaluation of the consensus model on the held-out set, beside the Bayes NE floor of synthetic data.

  results = evaluation.evaluate(config, consensus_params, params_R, eval_source)  # host arrays; params_R may be None
  results['ne'], results['auc'], results['logloss'], results['calibration'], results['bayes_ne']

The consensus model comes from the sync driver: the replica mean, the EA center, or the single model of sync
SGD (DESIGN §3). `bayes_ne` is the NE of the teacher's true click probabilities on the same examples (synthetic
data), None for real data.
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
  """
  eval_batch = input_pipeline.eval_batch(eval_source, config.data.num_eval_examples)
  predict = make_predict(config)
  probabilities = predict(params, eval_batch.dense, eval_batch.sparse)
  results = metrics.evaluate(eval_batch.label, probabilities)
  true_probabilities = input_pipeline.eval_true_probability(eval_source, config.data.num_eval_examples)
  results['bayes_ne'] = (
    None if true_probabilities is None else metrics.normalized_entropy(eval_batch.label, true_probabilities)
  )
  if config.train.eval_per_replica:
    results['ne_per_replica'] = [
      metrics.normalized_entropy(eval_batch.label, predict(replica_params, eval_batch.dense, eval_batch.sparse))
      for replica_params in replicas.unstack(params_R)
    ]
  return results
