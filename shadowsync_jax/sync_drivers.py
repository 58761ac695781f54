"""When sync rounds run: never, every k steps in the foreground, or continuously in a background thread.

  driver = sync_drivers.make_driver(config, mesh)
  sync_state_R = driver.initial_sync_state(state_R)  # EA center, BMUF global model and momentum; None if no rounds
  driver.start(state_R, sync_state_R)          # or a sync state restored from a checkpoint
  for step in ...:
    state_R, _ = train_step(state_R, batch_R)
    state_R = driver.after_step(step, state_R)  # foreground: a blocking round every k steps; shadow: merge a result
  state_R = driver.finish(state_R)             # stops and joins the background thread
  params = driver.consensus(state_R.params)    # the model to evaluate (DESIGN §3)
  driver.stats()                               # sync_rounds, mean/max sync gap, mean round latency

The math of a round lives in `sync_algorithms` (pure, testable on numbers); this module owns timing, threads and
the bookkeeping of sync gaps. The background driver itself is `shadow_sync.ShadowSync`.
"""

import time
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections

from shadowsync_jax import replicas
from shadowsync_jax import sync_algorithms

PyTree = Any

# Which parameter groups a round synchronizes (`sync.what`).
SYNCED_GROUPS = {'dense': ('mlp',), 'all': ('mlp', 'embedding')}


class SyncDriver(Protocol):

  def initial_sync_state(self, state_R: Any) -> PyTree | None:
    ...

  def start(self, state_R: Any, sync_state_R: PyTree | None) -> None:
    ...

  def sync_state(self) -> PyTree | None:
    """The current sync state, to checkpoint with the train state (None for algorithms without rounds)."""

  def after_step(self, step: int, state_R: Any) -> Any:
    ...

  def finish(self, state_R: Any) -> Any:
    ...

  def consensus(self, params_R: PyTree) -> PyTree:
    ...

  def stats(self) -> dict[str, Any]:
    ...


class GapTracker:
  """Counts rounds and the sync gap: training steps made between two consecutive merges (DESIGN §2)."""

  def __init__(self):
    self.rounds, self.gaps, self.latencies_s = 0, [], []
    self._last_merge_step = 0

  def reset(self, step: int) -> None:
    self._last_merge_step = step

  def merged(self, step: int, latency_s: float) -> None:
    self.rounds += 1
    self.gaps.append(step - self._last_merge_step)
    self.latencies_s.append(latency_s)
    self._last_merge_step = step

  def stats(self) -> dict[str, Any]:
    return {
        'sync_rounds': self.rounds,
        'mean_sync_gap': sum(self.gaps) / len(self.gaps) if self.gaps else None,
        'max_sync_gap': max(self.gaps) if self.gaps else None,
        'mean_round_latency_s': sum(self.latencies_s) / len(self.latencies_s) if self.latencies_s else None,
    }


def select(params: PyTree, groups: tuple[str, ...]) -> PyTree:
  """The synced part of the params: {group: params[group]} for the configured groups."""
  return {group: params[group] for group in groups}


def with_synced(params: PyTree, synced: PyTree) -> PyTree:
  """`params` with its synced groups replaced."""
  return {**params, **synced}


@jax.jit
def replica_divergence(params_R: PyTree) -> jax.Array:
  """Mean over replicas of the L2 distance of each replica's params to the replica mean (DESIGN §6)."""
  squared_R = sum(jnp.sum(jnp.square(x - jnp.mean(x, axis=0, keepdims=True)).reshape(x.shape[0], -1), axis=1)
                  for x in jax.tree.leaves(params_R))
  return jnp.mean(jnp.sqrt(squared_R))


class NoSync:
  """`none` (R independent models) and `sync_sgd` (synchronized inside the train step, no rounds)."""

  def __init__(self, algorithm: str):
    self._algorithm = algorithm
    self._steps = 0

  def initial_sync_state(self, state_R: Any) -> None:
    return None

  def start(self, state_R: Any, sync_state_R: None) -> None:
    pass

  def sync_state(self) -> None:
    return None

  def after_step(self, step: int, state_R: Any) -> Any:
    self._steps += 1
    return state_R

  def finish(self, state_R: Any) -> Any:
    return state_R

  def consensus(self, params_R: PyTree) -> PyTree:
    if self._algorithm == 'sync_sgd':  # All replicas are the same model.
      return jax.tree.map(lambda x: x[0], params_R)
    return replicas.replica_mean(params_R)

  def stats(self) -> dict[str, Any]:
    if self._algorithm == 'sync_sgd':  # One gradient all-reduce per step: always in sync.
      return {'sync_rounds': self._steps, 'mean_sync_gap': 1.0 if self._steps else None,
              'max_sync_gap': 1 if self._steps else None, 'mean_round_latency_s': None}
    return {'sync_rounds': 0, 'mean_sync_gap': None, 'max_sync_gap': None, 'mean_round_latency_s': None}


class ForegroundSync:
  """`fr_*`: a blocking round on the live params every `every_k_steps` steps (the classic way)."""

  def __init__(self, algorithm: sync_algorithms.SyncAlgorithm, name: str, mesh, groups: tuple[str, ...],
               every_k_steps: int):
    self._name, self._groups, self._every = name, groups, every_k_steps
    self._init_R, self._sync_R = sync_algorithms.stacked(algorithm, mesh, donate=True)
    self._consensus_R = sync_algorithms.stacked_consensus(name, mesh)
    self._sync_state_R = None
    self._gaps = GapTracker()

  def initial_sync_state(self, state_R: Any) -> PyTree:
    return self._init_R(select(state_R.params, self._groups))

  def start(self, state_R: Any, sync_state_R: PyTree) -> None:
    self._sync_state_R = sync_state_R
    self._gaps.reset(int(state_R.step[0]))

  def sync_state(self) -> PyTree:
    return self._sync_state_R

  def after_step(self, step: int, state_R: Any) -> Any:
    if step % self._every:
      return state_R
    started = time.perf_counter()
    synced_R, self._sync_state_R = self._sync_R(select(state_R.params, self._groups), self._sync_state_R)
    jax.block_until_ready(synced_R)
    self._gaps.merged(step, time.perf_counter() - started)
    return state_R._replace(params=with_synced(state_R.params, synced_R))

  def finish(self, state_R: Any) -> Any:
    return state_R

  def consensus(self, params_R: PyTree) -> PyTree:
    synced = self._consensus_R(select(params_R, self._groups), self._sync_state_R)
    return with_synced(replicas.replica_mean(params_R), synced)

  def stats(self) -> dict[str, Any]:
    return self._gaps.stats()


def make_driver(config: ml_collections.ConfigDict, mesh) -> SyncDriver:
  """The driver for `config.sync.algorithm`: NoSync, ForegroundSync (`fr_*`) or ShadowSync (`shadow_*`)."""
  from shadowsync_jax import shadow_sync  # pylint: disable=g-import-not-at-top  (shadow_sync imports this module)
  sync = config.sync
  if sync.algorithm in ('none', 'sync_sgd'):
    return NoSync(sync.algorithm)
  mode, name = sync.algorithm.split('_', 1)
  algorithm = sync_algorithms.make(name, replicas.REPLICA_AXIS, config.num_replicas, sync.elastic_alpha,
                                   sync.block_momentum, sync.block_lr, sync.nesterov)
  groups = SYNCED_GROUPS[sync.what]
  if mode == 'fr':
    return ForegroundSync(algorithm, name, mesh, groups, sync.every_k_steps)
  if mode == 'shadow':
    return shadow_sync.ShadowSync(algorithm, name, mesh, groups, sync.min_interval_s)
  raise ValueError(f'sync.algorithm={sync.algorithm!r} has no driver.')
