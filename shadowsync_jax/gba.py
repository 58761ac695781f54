"""GBA's math: staleness decay, global-batch aggregation, and the emulated worker step times (DESIGN §8).

  weight_K = gba.staleness_weights(staleness_K, threshold=2, decay=0.5)   # 1 up to the threshold, then decays
  mlp_grads, row_ids_N, row_grads_NxD = gba.aggregate(mlp_grads_K, row_ids_K, row_grads_K, weight_K, num_gradients=R)
  times = gba.WorkerStepTimes.sample(config.gba, num_workers=R, num_steps=K, seed=config.seed)
  times.seconds_RxK[r, k]; times.fails_RxK[r, k]; times.sync_time_s(0, K)   # what sync SGD would wait, step by step

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
Everything here is pure (numpy or jnp); the event loop that drives it is `gba_training`.
"""

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

PyTree = Any


def staleness_weights(staleness_K: np.ndarray, threshold: int, decay: float) -> np.ndarray:
  """float32 [K]: 1 for staleness <= `threshold`, `decay ** (staleness - threshold)` beyond it."""
  staleness_K = np.asarray(staleness_K)
  if np.any(staleness_K < 0):
    raise ValueError(f'staleness must be >= 0, got {staleness_K.tolist()}.')
  beyond_K = np.maximum(staleness_K - threshold, 0).astype(np.float64)
  return np.where(staleness_K <= threshold, 1.0, np.power(float(decay), beyond_K)).astype(np.float32)


def aggregate(mlp_grads_K: Sequence[PyTree], row_ids_K: Sequence[jax.Array], row_grads_K: Sequence[jax.Array],
              weights_K: jax.Array, num_gradients: int) -> tuple[PyTree, jax.Array, jax.Array]:
  """One update from K gradients: (sum_k w_k mlp_grads_k / num_gradients, the K batches' row ids concatenated,
  their row gradients times w_k / num_gradients).

  `num_gradients` is R for GBA (a global batch) and 1 for async SGD (each gradient applied alone). Pure jnp: call
  it inside jit. Rows repeat across batches; the sparse optimizers sum repeated rows' gradients.
  """
  weights_K = jnp.asarray(weights_K, jnp.float32)
  mlp_grads = jax.tree.map(lambda *grads: sum(weights_K[k] * g for k, g in enumerate(grads)) / num_gradients,
                           *mlp_grads_K)
  row_ids_N = jnp.concatenate(list(row_ids_K))
  # (g * w) / R, not g * (w / R): with w = 1 it is bit for bit sync SGD's g / R.
  row_grads_NxD = jnp.concatenate([g * weights_K[k] / num_gradients for k, g in enumerate(row_grads_K)])
  return mlp_grads, row_ids_N, row_grads_NxD


class WorkerStepTimes(NamedTuple):
  """Emulated seconds of every worker's every local step, and which steps fail (the worker dies mid-step: its
  token is lost, its gradient never arrives). Deterministic in the seed: sync SGD's emulated time is read from the
  same draws as GBA's, so the two face the same stragglers."""
  seconds_RxK: np.ndarray  # float64 [R, K]
  fails_RxK: np.ndarray  # bool [R, K]

  @classmethod
  def sample(cls, gba_config: ml_collections.ConfigDict, num_workers: int, num_steps: int,
             seed: int) -> 'WorkerStepTimes':
    """Lognormal jitter of mean `step_time_s` (sigma `step_time_jitter`); with probability `straggler_prob` a step
    is `straggler_slowdown` times slower (a transient straggler: a worker on a busy machine); with probability
    `failure_prob` it fails."""
    rng = np.random.default_rng([seed, 0x6BA])
    sigma = gba_config.step_time_jitter
    jitter_RxK = np.exp(sigma * rng.standard_normal((num_workers, num_steps)) - sigma**2 / 2)
    slow_RxK = rng.random((num_workers, num_steps)) < gba_config.straggler_prob
    seconds_RxK = gba_config.step_time_s * jitter_RxK * np.where(slow_RxK, gba_config.straggler_slowdown, 1.0)
    fails_RxK = rng.random((num_workers, num_steps)) < gba_config.failure_prob
    return cls(seconds_RxK, fails_RxK)

  def sync_time_s(self, first_step: int, last_step: int) -> float:
    """Emulated seconds of sync SGD over local steps [first_step, last_step): every global step waits for its
    slowest worker (failures not counted: sync SGD has no answer to them but a restart)."""
    return float(self.seconds_RxK[:, first_step:last_step].max(axis=0, initial=0.0).sum())
