"""The optimizers a config names: optax for the MLP weights, a sparse one for the embedding tables (docs/design.md §4).

  mlp_optimizer, embedding_optimizer = optimizers.make_optimizers(config.optimizer)

One function, so that every training path (replicas, the GBA server) trains with the very same optimizers: GBA's
tuning-free switch between sync and async training depends on it.
"""

import ml_collections
import optax

from shadowsync_jax.model import embedding


def make_optimizers(opt: ml_collections.ConfigDict):
  """(optax optimizer of the MLP weights, sparse optimizer of the embedding tables) from a run's `optimizer`
  section (`mlp`, `mlp_learning_rate`, `embedding`, `embedding_learning_rate`)."""
  mlp = {'sgd': optax.sgd, 'adagrad': optax.adagrad, 'adam': optax.adam}[opt.mlp](opt.mlp_learning_rate)
  tables = {'sgd': embedding.sparse_sgd, 'rowwise_adagrad': embedding.rowwise_adagrad}[opt.embedding](
    opt.embedding_learning_rate
  )
  return mlp, tables
