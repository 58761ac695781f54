"""GBA's math: staleness decay and global-batch aggregation (docs/design.md §8).

  weight_K = aggregation.staleness_weights(staleness_K, threshold=2, decay=0.5)   # 1 up to the threshold, then decays
  mlp_grads, row_ids_N, row_grads_NxD = aggregation.aggregate(mlp_grads_K, row_ids_K, row_grads_K, weight_K,
                                                              num_gradients=R)

Global Batch gradient Aggregation (Su et al., "GBA: A Tuning-free Approach to Switch between Synchronous and
Asynchronous Training for Recommendation Model", NeurIPS 2022): a parameter server sums the gradients workers push
until they cover the global batch of the equivalent synchronous run (R local batches), each weighted by a decay of
its staleness, and applies the sum with the synchronous run's optimizer. The rule here:

  staleness s = g - token (server updates made since the worker pulled the params its gradient was computed on)
  weight(s) = 1 if s <= threshold, else decay ** (s - threshold)      (decay = 0: stale gradients are dropped)
  update = sum_k weight_k * grad_k / R                                   (over the R gradients of a global batch)

With every weight 1 that is sync SGD's update exactly: the mean of R local-batch gradients (the embedding rows of
all R batches, each row gradient divided by R). A decayed or dropped gradient still fills its slot of the global
batch, so the update is smaller rather than re-normalized: a stale gradient's examples count, its direction less.
Everything here is pure (numpy or jnp); the server that applies it is `server.Server`.
"""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


def staleness_weights(staleness_K: np.ndarray, threshold: int, decay: float) -> np.ndarray:
  """float32 [K]: 1 for staleness <= `threshold`, `decay ** (staleness - threshold)` beyond it."""
  staleness_K = np.asarray(staleness_K)
  if np.any(staleness_K < 0):
    raise ValueError(f'staleness must be >= 0, got {staleness_K.tolist()}.')
  beyond_K = np.maximum(staleness_K - threshold, 0).astype(np.float64)
  return np.where(staleness_K <= threshold, 1.0, np.power(float(decay), beyond_K)).astype(np.float32)


def aggregate(
  mlp_grads_K: Sequence[PyTree],
  row_ids_K: Sequence[jax.Array],
  row_grads_K: Sequence[jax.Array],
  weights_K: jax.Array,
  num_gradients: int,
) -> tuple[PyTree, jax.Array, jax.Array]:
  """One update from K gradients: (sum_k w_k mlp_grads_k / num_gradients, the K batches' row ids concatenated,
  their row gradients times w_k / num_gradients).

  `num_gradients` is R for GBA (a global batch) and 1 for async SGD (each gradient applied alone). Pure jnp: call
  it inside jit. Rows repeat across batches; the sparse optimizers sum repeated rows' gradients.
  """
  weights_K = jnp.asarray(weights_K, jnp.float32)
  mlp_grads = jax.tree.map(
    lambda *grads: sum(weights_K[k] * g for k, g in enumerate(grads)) / num_gradients, *mlp_grads_K
  )
  row_ids_N = jnp.concatenate(list(row_ids_K))
  # (g * w) / R, not g * (w / R): with w = 1 it is bit for bit sync SGD's g / R.
  row_grads_NxD = jnp.concatenate([g * weights_K[k] / num_gradients for k, g in enumerate(row_grads_K)])
  return mlp_grads, row_ids_N, row_grads_NxD
