"""How a failed part of the train state comes back: a replica's slice or some embedding rows, over the live state.

  restored = checkpointer.restore_partial(step, wanted)          # recovery.checkpointing: only the failed leaves
  state_L = restore.with_replica(state_L, restored['train'], replica)   # one replica's slice of every leaf
  rows = restore.recover_rows(restore.row_leaves(state_L), failed_RxV, restore.row_leaves(restored['train']),
                              priority_rows_K, priority_values, priority_failed_RxK)
  state_L = restore.with_row_leaves(state_L, restore.placed_like(rows, restore.row_leaves(state_L)))

Pure array programs over masks (one compiled program serves every failure), kept apart from the policy that decides
what failed and where it reloads from (`emulated`, CPR's partial recovery).
"""

from typing import Any

import jax
import jax.numpy as jnp

from shadowsync_jax.model import embedding
from shadowsync_jax.recovery import checkpointing

PyTree = Any

TABLE_PATH = "['train'].params['embedding']"  # Leaf paths in a training checkpoint (`keep_leaves`).
ACCUMULATOR_PATH = "['train'].embedding_opt_state.accumulator_V"


def row_leaves(state_L: Any) -> dict[str, jax.Array]:
  """The leaves indexed by embedding row, [R, V, ...]: the table and, for row-wise Adagrad, its accumulator."""
  rows = {'table': state_L.params['embedding']}
  if isinstance(state_L.embedding_opt_state, embedding.RowwiseAdagradState):
    rows['accumulator'] = state_L.embedding_opt_state.accumulator_V
  return rows


def bytes_per_row(state_L: Any) -> int:
  """Bytes of one embedding row in `row_leaves` (the table's and the accumulator's), over every replica held."""
  return sum(x.size * x.dtype.itemsize // x.shape[1] for x in row_leaves(state_L).values())


def with_row_leaves(state_L: Any, rows: dict[str, jax.Array]) -> Any:
  state_L = state_L._replace(params={**state_L.params, 'embedding': rows['table']})
  if 'accumulator' in rows:
    state_L = state_L._replace(
      embedding_opt_state=state_L.embedding_opt_state._replace(accumulator_V=rows['accumulator'])
    )
  return state_L


def with_replica(state_L: Any, restored: Any, replica: int) -> Any:
  """`state_L` with replica `replica`'s slice of every restored leaf (`checkpointing.SKIPPED` ones stay live)."""
  live_leaves, structure = jax.tree.flatten(state_L)
  saved_leaves = jax.tree.leaves(restored)
  kept = [i for i, saved in enumerate(saved_leaves) if saved is not checkpointing.SKIPPED]
  replica_R = jnp.arange(state_L.step.shape[0]) == replica
  replaced = _select_replica([live_leaves[i] for i in kept], [saved_leaves[i] for i in kept], replica_R)
  for i, leaf in zip(kept, replaced):
    live_leaves[i] = jax.device_put(leaf, live_leaves[i].sharding)
  return jax.tree.unflatten(structure, live_leaves)


def _broadcast_to_rank(mask: jax.Array, rank: int) -> jax.Array:
  return mask.reshape(*mask.shape, *[1] * (rank - mask.ndim))


@jax.jit
def _select_replica(live: list[jax.Array], saved: list[jax.Array], replica_R: jax.Array) -> list[jax.Array]:
  """Each leaf [R, ...] from `saved` where `replica_R`, else from `live` (one compiled program for any replica)."""
  return [jnp.where(_broadcast_to_rank(replica_R, x.ndim), s, x) for x, s in zip(live, saved)]


@jax.jit
def recover_rows(
  live: PyTree,
  failed_RxV: jax.Array,
  checkpoint: PyTree,
  priority_rows_K: jax.Array,
  priority: PyTree,
  priority_failed_RxK: jax.Array,
) -> PyTree:
  """`row_usage.recover_rows` over masks, so that every failure reuses one compiled program: the failed (replica,
  row) entries of every [R, V, ...] leaf from `checkpoint`, then the failed ones among the priority rows
  `priority_rows_K` from `priority` ([R, K, ...])."""

  def one(x, saved, newer):
    x = jnp.where(_broadcast_to_rank(failed_RxV, x.ndim), saved, x)
    current = x[:, priority_rows_K]
    return x.at[:, priority_rows_K].set(jnp.where(_broadcast_to_rank(priority_failed_RxK, x.ndim), newer, current))

  return jax.tree.map(one, live, checkpoint, priority)


@jax.jit
def write_rows_per_replica(live: PyTree, rows_LxK: jax.Array, values: PyTree) -> PyTree:
  """Every leaf [L, V, ...] of `live` with replica (or shard) l's rows `rows_LxK[l]` set to `values[l]` ([L, K,
  ...]): a priority save of row-sharded tables, each shard its own rows, written back over the restored ones."""

  def one(x, v):
    return jax.vmap(lambda x_1, rows_K, v_1: x_1.at[rows_K].set(v_1))(x, rows_LxK, v)

  return jax.tree.map(one, live, values)


@jax.jit
def rows_that_differ(live: PyTree, rows_LxK: jax.Array, values: PyTree) -> jax.Array:
  """[L, K]: whether replica (or shard) l's row `rows_LxK[l, k]` holds other bits in `live` than in `values` (in any
  leaf): the rows a write of `values` (`write_rows_per_replica`) changes."""

  def one(x, v):
    held = jax.vmap(lambda x_1, rows_K: x_1[rows_K])(x, rows_LxK)
    bits = jnp.dtype(f'uint{8 * x.dtype.itemsize}')
    differ = jax.lax.bitcast_convert_type(held, bits) != jax.lax.bitcast_convert_type(v.astype(x.dtype), bits)
    return differ.reshape(*rows_LxK.shape, -1).any(axis=-1)

  return jax.tree.reduce(jnp.logical_or, jax.tree.map(one, live, values))


def placed_like(tree: PyTree, like: PyTree) -> PyTree:
  """`tree` with the shardings of `like`, so the jitted train step sees what it was compiled for."""
  return jax.tree.map(lambda x, y: jax.device_put(x, y.sharding), tree, like)
