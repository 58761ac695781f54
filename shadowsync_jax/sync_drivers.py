"""When sync rounds run: never, every k steps in the foreground, or continuously in a background thread.

  driver = sync_drivers.make_driver(config, meshes)  # meshes = replicas.make_meshes(num_replicas)
  sync_state_R = driver.initial_sync_state(state_L)  # EA center, BMUF global model and momentum; None if no rounds
  driver.start(state_L, sync_state_R)          # or a sync state restored from a checkpoint
  for step in ...:
    state_L, _ = train_step(state_L, batch_L)
    state_L = driver.after_step(step, state_L)  # foreground: a blocking round every k steps; shadow: merge a result
    state_L = driver.pause(state_L); save(state_L); driver.resume(state_L)   # around the loop's own collectives
  state_L = driver.finish(state_L)             # ends the rounds (shadow: with every process) and joins the thread
  params = driver.consensus(state_L.params)    # the model to evaluate (DESIGN §3), whole on every device
  driver.stats()                               # sync_rounds, mean/max sync gap, mean round latency

The train state `state_L` holds this process's replicas (`meshes.local`); rounds and the consensus run over all
the job's replicas (`meshes.job`, the same mesh in a one-process job), so the sync state `sync_state_R` is a
job-wide array. The math of a round lives in `sync_algorithms` (pure, testable on numbers); this module owns timing,
threads and the bookkeeping of sync gaps. The background driver itself is `shadow_sync.ShadowSync`.
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

  def initial_sync_state(self, state_L: Any) -> PyTree | None:
    ...

  def start(self, state_L: Any, sync_state_R: PyTree | None) -> None:
    """Compiles what the rounds run (so that no compile happens among the timed training steps), then starts
    them."""

  def sync_state(self) -> PyTree | None:
    """The current sync state, to checkpoint with the train state (None for algorithms without rounds)."""

  def after_step(self, step: int, state_L: Any) -> Any:
    ...

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    """Ends the rounds (`abandon`: at once, the run is failing) and returns the final train state."""

  def pause(self, state_L: Any) -> Any:
    """Lets the training thread issue collectives (a checkpoint save) until `resume`; returns the train state."""

  def resume(self, state_L: Any) -> None:
    ...

  def consensus(self, params_L: PyTree) -> PyTree:
    """The model to evaluate, one tree without the replica axis (read it with `replicas.fetch`)."""

  def stats(self) -> dict[str, Any]:
    ...


class GapTracker:
  """Counts rounds and the sync gap: training steps made between two consecutive merges (DESIGN §2)."""

  def __init__(self):
    self.rounds, self.gaps, self.latencies_s = 0, [], []
    self._last_merge_step = 0

  def reset(self, step: int) -> None:
    self._last_merge_step = step

  def merged(self, step: int | None, latency_s: float) -> None:
    """A round merged at `step`; None: after the last step (it counts as a round, not as a sync gap)."""
    self.rounds += 1
    self.latencies_s.append(latency_s)
    if step is not None:
      self.gaps.append(step - self._last_merge_step)
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


class _TrainingThreadOnly:
  """A driver without a thread of its own: the training thread issues every collective, so there is nothing to end
  or to pause."""

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    return state_L

  def pause(self, state_L: Any) -> Any:
    return state_L

  def resume(self, state_L: Any) -> None:
    pass


class NoSync(_TrainingThreadOnly):
  """`none` (R independent models) and `sync_sgd` (synchronized inside the train step, no rounds)."""

  def __init__(self, algorithm: str, meshes: replicas.ReplicaMeshes):
    self._algorithm, self._meshes = algorithm, meshes
    self._steps = 0

  def initial_sync_state(self, state_L: Any) -> None:
    return None

  def start(self, state_L: Any, sync_state_R: None) -> None:
    pass

  def sync_state(self) -> None:
    return None

  def after_step(self, step: int, state_L: Any) -> Any:
    self._steps += 1
    return state_L

  def consensus(self, params_L: PyTree) -> PyTree:
    if self._algorithm == 'sync_sgd':  # All replicas are the same model: this process's first one.
      return jax.tree.map(lambda x: x[0], params_L)
    return replicas.job_mean(params_L, self._meshes)

  def stats(self) -> dict[str, Any]:
    if self._algorithm == 'sync_sgd':  # One gradient all-reduce per step: always in sync.
      return {'sync_rounds': self._steps, 'mean_sync_gap': 1.0 if self._steps else None,
              'max_sync_gap': 1 if self._steps else None, 'mean_round_latency_s': None}
    return {'sync_rounds': 0, 'mean_sync_gap': None, 'max_sync_gap': None, 'mean_round_latency_s': None}


class ForegroundSync(_TrainingThreadOnly):
  """`fr_*`: a blocking round on the live params every `every_k_steps` steps (the classic way)."""

  def __init__(self, algorithm: sync_algorithms.SyncAlgorithm, name: str, meshes: replicas.ReplicaMeshes,
               groups: tuple[str, ...], every_k_steps: int):
    self._name, self._meshes, self._groups, self._every = name, meshes, groups, every_k_steps
    self._init_R, self._sync_R = sync_algorithms.stacked(algorithm, meshes.job, donate=True)
    self._consensus_R = sync_algorithms.stacked_consensus(name, meshes.job)
    self._sync_state_R = None
    self._gaps = GapTracker()

  def initial_sync_state(self, state_L: Any) -> PyTree:
    return self._init_R(replicas.to_job(select(state_L.params, self._groups), self._meshes))

  def start(self, state_L: Any, sync_state_R: PyTree) -> None:
    """Compiles the round for these shapes (not at the first round, inside the run's timed steps)."""
    self._sync_R.lower(replicas.to_job(select(state_L.params, self._groups), self._meshes), sync_state_R).compile()
    self._sync_state_R = sync_state_R
    self._gaps.reset(int(state_L.step[0]))

  def sync_state(self) -> PyTree:
    return self._sync_state_R

  def after_step(self, step: int, state_L: Any) -> Any:
    if step % self._every:
      return state_L
    started = time.perf_counter()
    synced_R, self._sync_state_R = self._sync_R(replicas.to_job(select(state_L.params, self._groups), self._meshes),
                                                self._sync_state_R)
    jax.block_until_ready(synced_R)
    self._gaps.merged(step, time.perf_counter() - started)
    return state_L._replace(params=with_synced(state_L.params, replicas.to_local(synced_R, self._meshes)))

  def consensus(self, params_L: PyTree) -> PyTree:
    return consensus(self._consensus_R, self._groups, params_L, self._sync_state_R, self._meshes)

  def stats(self) -> dict[str, Any]:
    return self._gaps.stats()


def consensus(consensus_R, groups: tuple[str, ...], params_L: PyTree, sync_state_R: PyTree,
              meshes: replicas.ReplicaMeshes) -> PyTree:
  """The model to evaluate: the algorithm's consensus (`consensus_R`) of the synced groups, the job's replica mean
  of the rest; whole on every device of the job."""
  replicas.check_collective_thread('the consensus')
  synced = consensus_R(replicas.to_job(select(params_L, groups), meshes), sync_state_R)
  return with_synced(replicas.job_mean(params_L, meshes), synced)


def make_driver(config: ml_collections.ConfigDict, meshes: replicas.ReplicaMeshes) -> SyncDriver:
  """The driver for `config.sync.algorithm`: NoSync, ForegroundSync (`fr_*`) or ShadowSync (`shadow_*`)."""
  from shadowsync_jax import shadow_sync  # pylint: disable=g-import-not-at-top  (shadow_sync imports this module)
  sync = config.sync
  if sync.algorithm in ('none', 'sync_sgd'):
    return NoSync(sync.algorithm, meshes)
  mode, name = sync.algorithm.split('_', 1)
  algorithm = sync_algorithms.make(name, replicas.REPLICA_AXIS, config.num_replicas, sync.elastic_alpha,
                                   sync.block_momentum, sync.block_lr, sync.nesterov)
  groups = SYNCED_GROUPS[sync.what]
  if mode == 'fr':
    return ForegroundSync(algorithm, name, meshes, groups, sync.every_k_steps)
  if mode == 'shadow':
    return shadow_sync.ShadowSync(algorithm, name, meshes, groups, sync.min_interval_s)
  raise ValueError(f'sync.algorithm={sync.algorithm!r} has no driver.')
