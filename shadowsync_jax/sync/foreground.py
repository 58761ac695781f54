"""Drivers without a thread of their own: `none` and `sync_sgd` (no rounds) and `fr_*` (a blocking round every k steps).

  driver = foreground.ForegroundSync(algorithm, 'ma', meshes, groups=('mlp', 'embedding'), every_k_steps=10)
  driver.start(state_L, driver.initial_sync_state(state_L))
  driver.at_boundary(b)      # after the block that ends at a multiple of k: a round on b.state, waited for
  driver.next_due(step)      # the next multiple of k: where the loop ends a block (`hooks.Hook`)

The training thread issues every collective, so there is no thread to end (`drivers.SyncDriver`).
"""

import time
from typing import Any

import jax

from shadowsync_jax import hooks
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import rounds

PyTree = Any


class _TrainingThreadOnly(hooks.Hook):
  """A driver without a thread of its own: the training thread issues every collective, so there is nothing to
  end."""

  _meshes: replicas.ReplicaMeshes

  def consensus_rule(self) -> consensus.Rule:
    raise NotImplementedError

  def sync_state(self) -> PyTree:
    raise NotImplementedError

  def consensus(self, params_L: PyTree) -> PyTree:
    return consensus.materialize(self.consensus_rule(), params_L, self.sync_state(), self._meshes)

  def settled(self, state_L: Any) -> tuple[Any, PyTree]:
    return state_L, self.sync_state()  # A round here is whole when it returns.

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    return state_L

  def restarted(self, state_L: Any, sync_state_R: PyTree) -> '_TrainingThreadOnly':
    """Itself, started again from a restored (`state_L`, `sync_state_R`) (full recovery): nothing runs beside the
    training thread to end."""
    self.finish(state_L, abandon=True)
    self.start(state_L, sync_state_R)
    return self

  def between_steps(self) -> None:
    return None  # Its rounds, if any, go between blocks.


class NoSync(_TrainingThreadOnly):
  """`none` (R independent models) and `sync_sgd` (synchronized inside the train step, no rounds)."""

  def __init__(self, algorithm: str, meshes: replicas.ReplicaMeshes, tables: consensus.Tables = consensus.REPLICATED):
    self._algorithm, self._meshes, self._tables = algorithm, meshes, tables
    self._steps = 0

  def consensus_rule(self) -> consensus.Rule:
    return consensus.Rule(self._algorithm, (), self._tables)

  def initial_sync_state(self, state_L: Any) -> None:
    return None

  def start(self, state_L: Any, sync_state_R: None) -> None:
    pass

  def sync_state(self) -> None:
    return None

  def at_boundary(self, b: hooks.Boundary) -> None:
    self._steps += b.steps

  def stats(self) -> dict[str, Any]:
    if self._algorithm == 'sync_sgd':  # One gradient all-reduce per step: always in sync.
      return {
        'sync_rounds': self._steps,
        'mean_sync_gap': 1.0 if self._steps else None,
        'max_sync_gap': 1 if self._steps else None,
        'mean_round_latency_s': None,
      }
    return {'sync_rounds': 0, 'mean_sync_gap': None, 'max_sync_gap': None, 'mean_round_latency_s': None}


class ForegroundSync(_TrainingThreadOnly):
  """`fr_*`: a blocking round on the live params every `every_k_steps` steps (the classic way)."""

  def __init__(
    self,
    algorithm: algorithms.SyncAlgorithm,
    name: str,
    meshes: replicas.ReplicaMeshes,
    groups: tuple[str, ...],
    every_k_steps: int,
    donate: bool = True,
    tables: consensus.Tables = consensus.REPLICATED,
  ):
    """`donate`: a round updates the params in place; not where a round that fails (a peer died) must leave the
    live params to be saved (partial recovery of real failures)."""
    self._name, self._meshes, self._groups, self._every = name, meshes, groups, every_k_steps
    self._tables = tables
    self._init_R, self._sync_R = algorithms.stacked(algorithm, meshes.job, donate=donate)
    self._sync_state_R = None
    self._gaps = rounds.GapTracker()

  def initial_sync_state(self, state_L: Any) -> PyTree:
    return self._init_R(replicas.to_job(rounds.select(state_L.params, self._groups), self._meshes))

  def start(self, state_L: Any, sync_state_R: PyTree) -> None:
    """Compiles the round for these shapes (not at the first round, inside the run's timed steps)."""
    self._sync_R.lower(
      replicas.to_job(rounds.select(state_L.params, self._groups), self._meshes), sync_state_R
    ).compile()
    self._sync_state_R = sync_state_R
    self._last_round = self._last_boundary = int(state_L.step[0])  # A round due at the start ran before it.
    self._gaps.reset(self._last_round)

  def sync_state(self) -> PyTree:
    return self._sync_state_R

  def next_due(self, step: int) -> int:
    return (step // self._every + 1) * self._every

  def at_boundary(self, b: hooks.Boundary) -> None:
    """After the block that ends at `b.step`: the round due there, before the boundary's later hooks, so that a
    checkpoint of that step holds it (the round due at a start ran before it, `start`: a restart that rewinds to a
    multiple of k once skipped the round its checkpoint did not hold, and ended with another model than the run
    that never failed)."""
    self._last_boundary = b.step
    b.state = self._round(b.step, b.state)

  def _round(self, step: int, state_L: Any) -> Any:
    """A round if `step` is a multiple of k after the start (the loop ends a block at each: `next_due`), waited
    for before the loop goes on; once a step."""
    if step % self._every or step <= self._last_round:
      return state_L
    self._last_round = step
    started = time.perf_counter()
    synced_R, self._sync_state_R = self._sync_R(
      replicas.to_job(rounds.select(state_L.params, self._groups), self._meshes), self._sync_state_R
    )
    jax.block_until_ready(synced_R)
    self._gaps.merged(step, time.perf_counter() - started)
    return state_L._replace(params=rounds.with_synced(state_L.params, replicas.to_local(synced_R, self._meshes)))

  def consensus_rule(self) -> consensus.Rule:
    return consensus.Rule(self._name, self._groups, self._tables)

  def stats(self) -> dict[str, Any]:
    return self._gaps.stats()
