"""What an emulated failure takes down and its part reloads (`emulated`), and the bytes that emulated costs scale by.

  parts = failed_parts.FailedParts(config, checkpointer, abstract)   # abstract: the training tree's shapes
  failed_RxV = parts.failed_rows(failure, state_L)                    # the (replica, row) entries lost
  state_L = parts.reload(state_L, failure, checkpoint, failed_RxV, priority)
  parts.warm_up(step, state_L, ...)                                   # the readers open, the programs compiled
  parts.row_bytes(num_rows); parts.failed_fraction(); parts.checkpoint_bytes

A failure takes down one replica (its whole train state but its step counter; with shared tables its MLP only: the
table lives on, like a parameter server) or one embedding shard (rows of every table, `failures.embedding_shard_rows`,
in every replica, with their row-wise Adagrad accumulators). Its part reloads from the checkpoint through orbax's
partial restore (`Checkpointer.restore_partial`), then the failed rows of the newest priority save after it (CPR).
"""

from collections.abc import Callable
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from shadowsync_jax.parallel import memory
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import differentials
from shadowsync_jax.recovery import failures
from shadowsync_jax.recovery import restore

PyTree = Any
Priority = tuple[int, np.ndarray, dict[str, np.ndarray]]  # A priority save: (step, rows, values by leaf).


class FailedParts:
  """The parts of a one-process run that emulated failures take down, and their reload (module docstring)."""

  def __init__(self, config: ml_collections.ConfigDict, checkpointer: checkpointing.Checkpointer, abstract: PyTree):
    recovery = config.recovery
    self._config, self._checkpointer, self._abstract = config, checkpointer, abstract
    self._num_shards = recovery.num_embedding_shards
    self._shared_tables = config.sync.embedding_placement == 'shared'
    self._cardinalities = [int(c) for c in config.data.cardinalities]
    self.checkpoint_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(abstract))
    # Of the leaves indexed by row (tables, their optimizer state, stamps): what a differential writes a share of.
    self.rows_bytes = memory.state_bytes([x for _, x in differentials.row_and_dense_leaves(abstract)[0]])

  def failed_rows(self, failure: failures.Failure, state_L: Any) -> np.ndarray:
    """[R, V]: the (replica, row) entries of the tables `failure` loses (none for a replica's with shared tables)."""
    failed_RxV = np.zeros((self._config.num_replicas, state_L.params['embedding'].shape[1]), bool)  # Padded rows.
    if failure.kind == 'embedding_shard':
      failed_RxV[:, failures.embedding_shard_rows(self._cardinalities, self._num_shards, failure.index)] = True
    else:
      failed_RxV[failure.index] = not self._shared_tables  # Shared tables live on: they lose nothing.
    return failed_RxV

  def restore_fraction(self, failure: failures.Failure, failed_RxV: np.ndarray) -> float:
    """The share of the checkpoint's bytes `failure`'s reload reads (for an emulated restore cost)."""
    if failure.kind == 'replica':
      return 1 / self._config.num_replicas
    return self.row_bytes(int(failed_RxV[0].sum())) / self.checkpoint_bytes

  def failed_fraction(self) -> float:
    """The share of the checkpoint's bytes one failure reloads under partial recovery."""
    if self._config.recovery.failure_target == 'replica':
      return 1 / self._config.num_replicas
    rows = failures.embedding_shard_rows(self._cardinalities, self._num_shards, 0)
    return self.row_bytes(len(rows)) / self.checkpoint_bytes

  def row_bytes(self, num_rows: int) -> float:
    """Bytes of `num_rows` rows of the tables and accumulators of every replica."""
    rows = [
      x
      for path, x in jax.tree_util.tree_flatten_with_path(self._abstract)[0]
      if jax.tree_util.keystr(path) in (restore.TABLE_PATH, restore.ACCUMULATOR_PATH)
    ]
    return sum(math.prod(x.shape) * x.dtype.itemsize / x.shape[1] for x in rows) * num_rows

  def reload(
    self, state_L: Any, failure: failures.Failure, checkpoint: int, failed_RxV: np.ndarray, priority: Priority | None
  ) -> Any:
    """The failed part's leaves read from the checkpoint through orbax's partial restore: a replica's slice of
    its train state, or the failed (replica, row) entries of the tables and accumulators; then the failed rows of
    the priority save."""
    if failure.kind == 'embedding_shard':
      restored = self._checkpointer.restore_partial(
        checkpoint, self._keep(lambda p: p in (restore.TABLE_PATH, restore.ACCUMULATOR_PATH))
      )
    else:
      restored = self._checkpointer.restore_partial(checkpoint, self._keep(self._replica_leaf))
      state_L = restore.with_replica(state_L, restored['train'], failure.index)
    if not failed_RxV.any():
      return state_L
    live = restore.row_leaves(state_L)
    if priority is None:
      priority_K, priority_values = np.zeros(0, np.int32), jax.tree.map(lambda x: x[:, :0], live)
    else:
      _, priority_K, priority_values = priority
    recovered = restore.recover_rows(
      live,
      jnp.asarray(failed_RxV),
      restore.row_leaves(restored['train']),
      jnp.asarray(priority_K),
      priority_values,
      jnp.asarray(failed_RxV[:, priority_K]),
    )
    return restore.with_row_leaves(state_L, restore.placed_like(recovered, live))

  def warm_up(self, step: int, state_L: Any, full: bool, partial: bool, priority_rows: int | None) -> dict[str, float]:
    """Opens the checkpoint readers and compiles the restore programs before the clock starts, as the train step
    is compiled before timing starts: a restore then costs what it costs in a running system. `full`, `partial`:
    which kinds (`cpr`: both, each then timed once more for its choice: the seconds returned by kind);
    `priority_rows`: a priority save's rows, whose reload is compiled too."""
    timed: dict[str, float] = {}
    if full:
      self._checkpointer.restore_latest(self._abstract)
      started = time.perf_counter()
      jax.block_until_ready(self._checkpointer.restore_latest(self._abstract))
      timed['full'] = time.perf_counter() - started
      if not partial:
        return timed
    failure = failures.Failure(step, self._config.recovery.failure_target, 0)
    rows_lost = not (failure.kind == 'replica' and self._shared_tables)  # Whether a failure reloads table rows.
    failed_RxV = np.full((self._config.num_replicas, state_L.params['embedding'].shape[1]), rows_lost)
    self.reload(state_L, failure, step, failed_RxV, None)
    if full:
      one_part_RxV = np.zeros_like(failed_RxV)
      if failure.kind == 'embedding_shard':
        one_part_RxV[:, failures.embedding_shard_rows(self._cardinalities, self._num_shards, 0)] = True
      else:
        one_part_RxV[0] = rows_lost
      started = time.perf_counter()
      jax.block_until_ready(self.reload(state_L, failure, step, one_part_RxV, None))
      timed['partial'] = time.perf_counter() - started
    if priority_rows is not None:
      rows_K = np.zeros(priority_rows, np.int32)
      values = {
        name: np.zeros((x.shape[0], len(rows_K), *x.shape[2:]), x.dtype)
        for name, x in restore.row_leaves(state_L).items()
      }
      self.reload(state_L, failure, step, failed_RxV, (step, rows_K, values))
    return timed

  def _replica_leaf(self, path: str) -> bool:
    """What a failed replica reloads: its whole train state but the step counter and the gather scratch, and with
    shared tables its MLP only (the table lives on, like a parameter server)."""
    if not path.startswith("['train']") or path == "['train'].step" or 'owner_scratch' in path:
      return False
    return not (
      self._shared_tables and (path == restore.TABLE_PATH or path.startswith("['train'].embedding_opt_state"))
    )

  def _keep(self, keep: Callable[[str], bool]) -> PyTree:
    return checkpointing.keep_leaves(self._abstract, keep)
