"""Where a replica's step finds its embedding rows and which updates its own table applies (docs/design.md §4).

  placement = table_placement.make('sharded', num_rows=V, axis_name='replica', num_shards=R)
  rows_NxD, routing = placement.lookup(table, row_ids_N)      # inside shard_map over `axis_name`
  ...                                                         # gradient of the loss w.r.t. rows_NxD
  ids_M, grads_MxD = placement.updates(routing, row_grads_NxD)  # what this device's sparse optimizer applies

- `replicated`: each replica its own table [V, D]; it reads and updates only its own rows.
- `all replicas` (`shared` placement, and sync SGD's tables): each device holds a copy of one logical table and
  applies the sparse gradients of every replica along the axis (all-gathered; their sum for a shared table, their
  mean, `mean=True`, for sync SGD's), so the copies stay identical.
- `sharded` (TorchRec's row-wise sharding; jax-tpu-embedding's layout): row e of the concatenated table lives on
  shard e % S as its local row e // S, so each device holds ceil(V / S) rows and the job holds every row once.
  A lookup is a collective: all-gather the ids, every shard reads the rows it owns (zeros elsewhere), and a
  reduce-scatter sums them back to the device that asked (`all_gather`), or ids go to their owners and rows come
  back by two all-to-alls (`all_to_all`). The owner applies the update: the gradients of every replica reach it
  (all-gathered, or by all-to-all), duplicate ids summed by the sparse optimizer before it applies them.

Ids here are rows of the concatenated table (`embedding.global_row_ids`); every function but `ShardLayout`'s runs
per device inside `jax.shard_map` over `axis_name`.
"""

from typing import Any, NamedTuple, Protocol

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

PLACEMENTS = ('replicated', 'shared', 'sharded')
EXCHANGES = ('all_gather', 'all_to_all')
# A device's table has a multiple of this many rows (the last ones padding, never looked up): checkpoint writers cut
# arrays into chunks that divide their rows, and a prime row count (Criteo Kaggle's 33,762,577) means 1-row chunks.
ROW_ALIGN = 256


class ShardLayout(NamedTuple):
  """Rows of the concatenated [V, D] table spread over S shards: row e on shard e % S, local row e // S."""

  num_rows: int  # V
  num_shards: int  # S

  @property
  def rows_per_shard(self) -> int:
    """ceil(V / S): every shard holds as many; the last local rows of some shards hold no table row."""
    return -(-self.num_rows // self.num_shards)

  def global_rows(self, shard: Any, local_rows: Any) -> Any:
    """The table rows that local rows `local_rows` of `shard` hold (>= V: padding, no row)."""
    return local_rows * self.num_shards + shard

  def shard_of(self, rows: np.ndarray) -> np.ndarray:
    return rows % self.num_shards

  def local_row(self, rows: np.ndarray) -> np.ndarray:
    return rows // self.num_shards


class TablePlacement(Protocol):
  """How one device's step reaches the rows of the ids its replica looks up (module docstring)."""

  def lookup(self, table: jax.Array, row_ids_N: jax.Array) -> tuple[jax.Array, Any]:
    """(rows [N, D] of `row_ids_N`, the routing that `updates` needs)."""

  def updates(self, routing: Any, row_grads_NxD: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(ids into this device's table [M], gradients [M, D]): ids >= this table's rows are to be dropped."""


class Replicated(NamedTuple):
  """Each replica its own table: a local gather, a local update."""

  def lookup(self, table, row_ids_N):
    return _gather(table, row_ids_N), row_ids_N

  def updates(self, routing, row_grads_NxD):
    return routing, row_grads_NxD


class AllReplicas(NamedTuple):
  """A copy of one logical table per device: every replica's sparse gradients (or `mean`: over the replicas) land
  in every copy."""

  axis_name: str
  mean: bool = False

  def lookup(self, table, row_ids_N):
    return _gather(table, row_ids_N), row_ids_N

  def updates(self, routing, row_grads_NxD):
    row_grads_NxD = _scaled(row_grads_NxD, self.axis_name, self.mean)
    return lax.all_gather(routing, self.axis_name, tiled=True), lax.all_gather(
      row_grads_NxD, self.axis_name, tiled=True
    )


class _Owned(NamedTuple):
  """The all-gather route's routing: the ids of every replica as rows of this shard (or past it: not owned)."""

  local_ids_SN: jax.Array


class _Sent(NamedTuple):
  """The all-to-all route's routing: where each id went (destination shard, slot) and what each owner received."""

  destination_N: jax.Array
  slot_N: jax.Array
  received_SxN: jax.Array  # Local rows on this shard asked for by each source device; >= rows per shard: padding.


class Sharded(NamedTuple):
  """Rows on shard e % S (`ShardLayout`); lookups and updates are collectives over `axis_name` (S devices)."""

  axis_name: str
  layout: ShardLayout
  exchange: str = 'all_gather'
  mean: bool = False  # Sync SGD: the owner applies the replicas' mean gradient, not their sum.

  def lookup(self, table, row_ids_N):
    if self.exchange == 'all_gather':
      routing = self._owned(lax.all_gather(row_ids_N, self.axis_name, tiled=True), table.shape[0])
      rows_SNxD = _gather(table, routing.local_ids_SN, fill=True)
      return lax.psum_scatter(rows_SNxD, self.axis_name, scatter_dimension=0, tiled=True), routing
    routing = self._send(row_ids_N, table.shape[0])
    rows_SxNxD = _gather(table, routing.received_SxN, fill=True)
    back_SxNxD = lax.all_to_all(rows_SxNxD, self.axis_name, 0, 0, tiled=True)
    return back_SxNxD[routing.destination_N, routing.slot_N], routing

  def updates(self, routing, row_grads_NxD):
    row_grads_NxD = _scaled(row_grads_NxD, self.axis_name, self.mean)
    if self.exchange == 'all_gather':
      return routing.local_ids_SN, lax.all_gather(row_grads_NxD, self.axis_name, tiled=True)
    num_shards, n = self.layout.num_shards, row_grads_NxD.shape[0]
    outgoing_SxNxD = jnp.zeros((num_shards, n, row_grads_NxD.shape[1]), row_grads_NxD.dtype)
    outgoing_SxNxD = outgoing_SxNxD.at[routing.destination_N, routing.slot_N].set(row_grads_NxD)
    received_SxNxD = lax.all_to_all(outgoing_SxNxD, self.axis_name, 0, 0, tiled=True)
    return routing.received_SxN.reshape(-1), received_SxNxD.reshape(num_shards * n, -1)

  def _owned(self, row_ids_M, shard_rows: int):
    """`row_ids_M` as local rows of this device's shard (of `shard_rows` rows, padding included); the rows of
    other shards past its end."""
    shard = lax.axis_index(self.axis_name)
    mine = self.layout.shard_of(row_ids_M) == shard
    return _Owned(jnp.where(mine, self.layout.local_row(row_ids_M), shard_rows))

  def _send(self, row_ids_N, shard_rows: int):
    """Each id to its owner: slot k of the owner's bucket holds the k-th id this device sends it. Buckets hold N
    ids (every id may belong to one shard), so one all-to-all moves as much as an all-gather of the ids."""
    num_shards, n = self.layout.num_shards, row_ids_N.shape[0]
    destination_N = self.layout.shard_of(row_ids_N)
    one_hot_NxS = destination_N[:, None] == jnp.arange(num_shards, dtype=destination_N.dtype)
    slot_N = jnp.take_along_axis(jnp.cumsum(one_hot_NxS, axis=0, dtype=jnp.int32), destination_N[:, None], 1)[:, 0] - 1
    outgoing_SxN = jnp.full((num_shards, n), shard_rows, row_ids_N.dtype)  # Padding slots: past the shard.
    outgoing_SxN = outgoing_SxN.at[destination_N, slot_N].set(self.layout.local_row(row_ids_N))
    return _Sent(destination_N, slot_N, lax.all_to_all(outgoing_SxN, self.axis_name, 0, 0, tiled=True))


def _scaled(row_grads_NxD: jax.Array, axis_name: str, mean: bool) -> jax.Array:
  return row_grads_NxD / lax.axis_size(axis_name) if mean else row_grads_NxD


def _gather(table: jax.Array, ids: jax.Array, fill: bool = False) -> jax.Array:
  """Rows of `table` at `ids`; `fill`: ids past the table read zeros (not owned, padding)."""
  if fill:
    return table.at[ids].get(mode='fill', fill_value=0.0)
  return table.at[ids].get(mode='promise_in_bounds')  # Ids are checked when batches are read (input_pipeline).


def make(
  placement: str,
  num_rows: int,
  axis_name: str | None = None,
  num_devices: int = 1,
  exchange: str = 'all_gather',
  mean_gradients: bool = False,
) -> TablePlacement:
  """The placement named by `sync.embedding_placement` for a step over `num_devices` devices along `axis_name`.

  `mean_gradients` (sync SGD): the tables' updates are the replicas' mean gradient, as the MLPs' are; otherwise
  every replica's gradient counts whole (trainers pushing to one table, as to an embedding parameter server).
  """
  if placement == 'sharded':
    if exchange not in EXCHANGES:
      raise ValueError(f'exchange={exchange!r} is not one of {", ".join(EXCHANGES)}.')
    return Sharded(axis_name, ShardLayout(num_rows, num_devices), exchange, mean_gradients)
  if placement == 'shared' or mean_gradients:
    return AllReplicas(axis_name, mean_gradients)
  if placement == 'replicated':
    return Replicated()
  raise ValueError(f'placement={placement!r} is not one of {", ".join(PLACEMENTS)}.')


def rows_held(placement: str, num_rows: int, num_devices: int) -> int:
  """Rows of the table each device holds: all of them, or its shard's, padded to a multiple of `ROW_ALIGN`."""
  rows = ShardLayout(num_rows, num_devices).rows_per_shard if placement == 'sharded' else num_rows
  return -(-rows // ROW_ALIGN) * ROW_ALIGN
