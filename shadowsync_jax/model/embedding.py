"""Embedding tables as one concatenated array, looked up and updated sparsely.

  offsets_T = table_offsets(cardinalities)
  table_VxD = init_table(key, cardinalities, embedding_dim)   # built in place, a chunk of rows at a time
  row_ids_BxT = global_row_ids(batch.sparse, offsets_T)
  emb_BxTxD = lookup(table_VxD, row_ids_BxT)
  ...  # gradient of the loss w.r.t. emb_BxTxD, not w.r.t. the table
  opt = rowwise_adagrad(learning_rate=0.05)
  opt_state = opt.init(table_VxD)
  table_VxD, opt_state = opt.update(table_VxD, opt_state, row_ids_N, row_grads_NxD)

All T tables live in one [V, D] array (V = sum of cardinalities), table t starting at row `offsets_T[t]`, so a
step does one gather and one scatter instead of T. Only the rows a batch touches are read and written: no
table-sized gradient or optimizer pass ever happens, as in DLRM's sparse updates.
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np


class SparseOptimizer(NamedTuple):
  """An optax-like pure pair for a table updated only at the rows a batch touched.

  init(table_VxD) -> state
  update(table_VxD, state, row_ids_N, row_grads_NxD) -> (table_VxD, state)
  `row_ids_N` may repeat a row; its gradients are summed. Ids >= V are ignored.
  """

  init: Callable[[jax.Array], Any]
  update: Callable[[jax.Array, Any, jax.Array, jax.Array], tuple[jax.Array, Any]]


def table_offsets(cardinalities: Sequence[int]) -> np.ndarray:
  """First row of each table inside the concatenated table: int32 [T]."""
  sizes = np.asarray(cardinalities, dtype=np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  if sizes.sum() >= 2**31:
    raise ValueError(f'{sizes.sum()} embedding rows do not fit int32 row ids.')
  return offsets.astype(np.int32)


_INIT_CHUNK_ROWS = 1 << 16  # Rows initialized at once: the only temporary of `init_table`, a few MB.


def _mix32(x_u32: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finalizer: a bijection of uint32 that scrambles every bit."""
  x_u32 = x_u32 ^ (x_u32 >> 16)
  x_u32 = x_u32 * jnp.uint32(0x85EBCA6B)
  x_u32 = x_u32 ^ (x_u32 >> 13)
  x_u32 = x_u32 * jnp.uint32(0xC2B2AE35)
  return x_u32 ^ (x_u32 >> 16)


def init_rows(seed_u32: jax.Array, cardinalities: Sequence[int], embedding_dim: int, rows_C: jax.Array) -> jax.Array:
  """DLRM's initialization of the concatenated table's rows `rows_C`: table t uniform in +-1/sqrt(cardinalities[t]).

  Each value is a counter hash of (seed, row, column), so any set of rows (a chunk, a shard) gets exactly the
  values the whole table has; rows >= V (a shard's padding) get zeros. float32 [C, D].
  """
  sizes_T = np.asarray(cardinalities, np.int64)
  bound_T = jnp.asarray(1.0 / np.sqrt(sizes_T.astype(np.float32)))
  row_hash_C = _mix32(rows_C.astype(jnp.uint32) ^ seed_u32)
  column_D = _mix32(jnp.arange(embedding_dim, dtype=jnp.uint32) * jnp.uint32(0x9E3779B9) + seed_u32)
  bits_CxD = _mix32(row_hash_C[:, None] ^ column_D[None, :])
  unit_CxD = (bits_CxD >> 8).astype(jnp.float32) * (2.0 / 2**24) - 1.0  # Uniform in [-1, 1), 24 bits.
  table_C = jnp.searchsorted(jnp.asarray(table_offsets(cardinalities)), rows_C, side='right') - 1
  bound_C = jnp.where(rows_C < sizes_T.sum(), bound_T[table_C], 0.0)
  return unit_CxD * bound_C[:, None]


def init_table(
  key: jax.Array,
  cardinalities: Sequence[int],
  embedding_dim: int,
  num_rows: int | None = None,
  global_row: Callable[[jax.Array], jax.Array] = lambda rows: rows,
) -> jax.Array:
  """DLRM's initialization (`init_rows`) of a [num_rows, D] table whose local row r holds the concatenated table's
  row `global_row(r)` (default: all V rows, in order; a shard of a sharded table passes its own map).

  Built in place, `_INIT_CHUNK_ROWS` rows at a time: no table-sized temporary (jit it, or call it inside jit).
  """
  num_rows = int(np.sum(cardinalities)) if num_rows is None else num_rows
  seed_u32 = jax.random.bits(key, (), jnp.uint32)
  chunk = min(_INIT_CHUNK_ROWS, num_rows)

  def fill_chunk(i, table_VxD):
    start = jnp.minimum(i * chunk, num_rows - chunk)  # The last chunk ends at the last row (rewriting a few).
    rows_C = global_row(start + jnp.arange(chunk, dtype=jnp.int32))
    return lax.dynamic_update_slice(table_VxD, init_rows(seed_u32, cardinalities, embedding_dim, rows_C), (start, 0))

  table_VxD = jnp.zeros((num_rows, embedding_dim), jnp.float32)
  return lax.fori_loop(0, -(-num_rows // chunk), fill_chunk, table_VxD)


def global_row_ids(sparse_BxT: jax.Array, offsets_T: np.ndarray) -> jax.Array:
  """Per-table ids [..., T] -> rows of the concatenated table."""
  return sparse_BxT + jnp.asarray(offsets_T, dtype=sparse_BxT.dtype)


def lookup(table_VxD: jax.Array, row_ids: jax.Array) -> jax.Array:
  """Rows of the table: [...] ids -> [..., D]. Ids are trusted to be in range (no clamping pass)."""
  return table_VxD.at[row_ids].get(mode='promise_in_bounds')


def sum_duplicate_rows(
  row_ids_N: jax.Array, row_grads_NxD: jax.Array, scratch_V: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Sums the gradients of repeated rows without sorting: -> (unique_ids_N, summed_NxD, scratch_V).

  Every position k writes k into `scratch_V[row_ids_N[k]]` and reads it back: all positions of a row read the
  same winner, the row's owner, which receives the row's summed gradient. Non-owner positions get an id
  >= V (so a scatter with mode='drop' skips them) and a zero gradient. O(N) work, where a sort-based unique
  costs several times more on CPU. `scratch_V` is a float32 [V] array of no meaning, returned with the touched
  entries overwritten; pass it donated so the write happens in place.
  """
  n, num_rows = row_ids_N.shape[0], scratch_V.shape[0]
  if n >= 2**24:
    raise ValueError(f'{n} row ids: positions must be exact in float32 (< 2**24).')
  position_N = jnp.arange(n, dtype=jnp.int32)
  scratch_V = scratch_V.at[row_ids_N].set(position_N.astype(scratch_V.dtype), mode='drop')
  owner_N = scratch_V.at[row_ids_N].get(mode='fill', fill_value=n).astype(jnp.int32)
  summed_NxD = jnp.zeros_like(row_grads_NxD).at[owner_N].add(row_grads_NxD, mode='drop')
  unique_ids_N = jnp.where(owner_N == position_N, row_ids_N, num_rows + position_N)
  return unique_ids_N, summed_NxD, scratch_V


class SparseSgdState(NamedTuple):
  """Plain SGD keeps no state."""


def sparse_sgd(learning_rate: float) -> SparseOptimizer:
  """row -= learning_rate * (sum of the row's gradients), for the touched rows only."""

  def init(table_VxD):
    del table_VxD
    return SparseSgdState()

  def update(table_VxD, state, row_ids_N, row_grads_NxD):
    table_VxD = table_VxD.at[row_ids_N].add(-learning_rate * row_grads_NxD, mode='drop')
    return table_VxD, state

  return SparseOptimizer(init, update)


class RowwiseAdagradState(NamedTuple):
  """The scratch is its own leaf: borrowing the accumulator instead makes XLA copy the whole [V] array."""

  accumulator_V: jax.Array  # float32 [V]: running sum of mean(g**2) of each row
  owner_scratch_V: jax.Array  # float32 [V]: workspace of `sum_duplicate_rows`, meaningless between steps


def rowwise_adagrad(learning_rate: float, epsilon: float = 1e-8, initial_accumulator: float = 0.0) -> SparseOptimizer:
  """Row-wise Adagrad as in torchrec/FBGEMM (one accumulator per row, not per element).

  For each distinct touched row with summed gradient g [D]: acc += mean(g**2); row -= lr * g / (sqrt(acc) + eps).
  Duchi et al. 2011 (Adagrad); the row-wise variant is the DLRM standard for embeddings.
  """

  def init(table_VxD):
    num_rows = table_VxD.shape[0]
    return RowwiseAdagradState(
      jnp.full((num_rows,), initial_accumulator, jnp.float32), jnp.zeros((num_rows,), jnp.float32)
    )

  def update(table_VxD, state, row_ids_N, row_grads_NxD):
    ids_N, grads_NxD, owner_scratch_V = sum_duplicate_rows(row_ids_N, row_grads_NxD, state.owner_scratch_V)
    acc_N = state.accumulator_V.at[ids_N].get(mode='fill', fill_value=0.0)
    acc_N = acc_N + jnp.mean(jnp.square(grads_NxD), axis=-1)
    rows_NxD = table_VxD.at[ids_N].get(mode='fill', fill_value=0.0)
    rows_NxD = rows_NxD - learning_rate * grads_NxD / (jnp.sqrt(acc_N) + epsilon)[:, None]
    table_VxD = table_VxD.at[ids_N].set(rows_NxD, mode='drop', unique_indices=True)
    accumulator_V = state.accumulator_V.at[ids_N].set(acc_N, mode='drop', unique_indices=True)
    return table_VxD, RowwiseAdagradState(accumulator_V, owner_scratch_V)

  return SparseOptimizer(init, update)
