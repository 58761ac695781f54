"""Which embedding rows are used most, for CPR's prioritized partial checkpoints (CPR-MFU and CPR-SSU).

  counts_V = np.zeros(num_rows, np.int64)                     # rows of the concatenated table
  row_usage.count_lookups(counts_V, row_ids)                  # MFU: every lookup of a batch (ids after offsets)
  row_usage.count_sampled_lookups(counts_V, row_ids, 0.05, rng)   # SSU: a seeded ~5% sample of the lookups
  rows_K = row_usage.top_rows(counts_V, fraction=0.1)         # the most used 10% of rows, ascending ids
  saved = row_usage.extract_rows({'table': table_RxVxD, 'accumulator': acc_RxV}, rows_K, row_axis=1)
  ...                                                         # save `saved` and rows_K every few steps
  live = row_usage.recover_rows(live, failed_rows_F, from_checkpoint, rows_K, saved, row_axis=1)

CPR (Maeng et al., MLSys 2021, arXiv:2011.02999) cuts the samples partial recovery loses by saving the rows that
take most updates more often than the full checkpoint: CPR-MFU (most frequently used) ranks rows by exact access
counts; CPR-SSU (sub-sampled used) avoids a counter update per lookup by recording only a random sub-sample of
the lookups, in which frequent rows are the ones that show up. Here both feed the same counters, so `top_rows`
ranks either; after a failure, the failed rows come back from the full checkpoint and, for the rows in the
newer priority save, from that save.

Counting cost, measured for one [B, 26] int32 batch of ids over V rows on this project's 2-core CPU host
(numpy 2.4, jax 0.10): `np.add.at` on the host takes 0.03 ms (B=256) to 0.13 ms (B=1024) whatever V (O(B)),
`np.bincount(minlength=V)` plus an add is O(V): 0.1 ms at V=10^5, 0.9 ms at 10^6, 3.2 ms at 2.6 * 10^6; a jitted,
donated jnp scatter-add (`device_count_lookups`) costs 0.08-0.19 ms, most of it dispatch. So host counting uses
`np.add.at` on the batch the input pipeline already holds in numpy; a 5% SSU sample takes 0.02-0.05 ms.
`device_count_lookups` is there for an accelerator, where the ids are on the device inside the train step.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shadowsync_jax.model import embedding

PyTree = Any


def count_lookups(counts_V: np.ndarray, row_ids: np.ndarray) -> np.ndarray:
  """Adds one per lookup (any shape of ids, repeats counted) into `counts_V`, in place; returns it."""
  np.add.at(counts_V, np.asarray(row_ids).reshape(-1), 1)
  return counts_V


def count_sampled_lookups(
  counts_V: np.ndarray, row_ids: np.ndarray, sample_rate: float, rng: np.random.Generator
) -> np.ndarray:
  """Adds one per lookup of a random sub-sample of the batch's lookups into `counts_V`, in place; returns it.

  Binomial(N, sample_rate) positions are drawn uniformly with replacement out of the N lookups, so each row's
  expected added count is `sample_rate` times its exact count and the work is O(sample_rate N), not O(N).
  """
  if not 0 < sample_rate <= 1:
    raise ValueError(f'sample_rate={sample_rate} must be in (0, 1].')
  ids_N = np.asarray(row_ids).reshape(-1)
  num_samples = rng.binomial(ids_N.shape[0], sample_rate)
  np.add.at(counts_V, ids_N[rng.integers(0, ids_N.shape[0], num_samples)], 1)
  return counts_V


def device_count_lookups(counts_V: jax.Array, row_ids: jax.Array) -> jax.Array:
  """`count_lookups` as a pure scatter-add, for the jitted train step (with `counts_V` donated, in place)."""
  return counts_V.at[row_ids.reshape(-1)].add(1, mode='drop')


def top_rows(counts_V: np.ndarray, fraction: float) -> np.ndarray:
  """The `floor(fraction * V)` most counted rows, ascending; never a row counted 0; ties go to lower ids.

  O(V) to find the counted rows (a scan), then a partition of those alone: a large table of which a few rows were
  used ranks in milliseconds (a partition of all 4.2M counters of a Kaggle shard took 0.8 s). Run once per
  priority save.
  """
  if not 0 <= fraction <= 1:
    raise ValueError(f'fraction={fraction} must be in [0, 1].')
  counts_V = np.asarray(counts_V)
  counted_C = np.flatnonzero(counts_V)  # Ascending ids.
  k = min(int(fraction * counts_V.shape[0]), counted_C.shape[0])
  if k == 0:
    return np.zeros((0,), np.int32)
  values_C = counts_V[counted_C]
  threshold = np.partition(values_C, values_C.shape[0] - k)[values_C.shape[0] - k]  # the k-th largest count (> 0)
  above = counted_C[values_C > threshold]
  tied = counted_C[values_C == threshold][: k - above.shape[0]]
  return np.sort(np.concatenate([above, tied])).astype(np.int32)


def _row_index(row_axis: int, rows_K: np.ndarray) -> tuple:
  return (slice(None),) * row_axis + (np.asarray(rows_K, np.int32),)


def extract_rows(tree: PyTree, rows_K: np.ndarray, row_axis: int = 0) -> PyTree:
  """Rows `rows_K` of every leaf along `row_axis` (0 for [V, ...], 1 for replica-stacked [R, V, ...])."""
  return jax.tree.map(lambda x: jnp.take(x, np.asarray(rows_K, np.int32), axis=row_axis), tree)


def extract_rows_per_replica(tree: PyTree, rows_LxK: np.ndarray) -> PyTree:
  """Each replica's (or shard's) own rows of every leaf [L, V, ...]: replica l's rows `rows_LxK[l]` -> [L, K, ...]."""
  return _take_per_replica(tree, jnp.asarray(rows_LxK, jnp.int32))


@jax.jit
def _take_per_replica(tree: PyTree, rows_LxK: jax.Array) -> PyTree:
  def one(x):
    index = rows_LxK.reshape(*rows_LxK.shape, *[1] * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)

  return jax.tree.map(one, tree)


def write_rows(tree: PyTree, rows_K: np.ndarray, values: PyTree, row_axis: int = 0) -> PyTree:
  """`tree` with rows `rows_K` of every leaf along `row_axis` replaced by `values` (as `extract_rows` gives)."""
  return jax.tree.map(lambda x, v: x.at[_row_index(row_axis, rows_K)].set(v), tree, values)


def recover_rows(
  live: PyTree,
  failed_rows_F: np.ndarray,
  checkpoint_values: PyTree,
  priority_rows_K: np.ndarray,
  priority_values: PyTree,
  row_axis: int = 0,
) -> PyTree:
  """The failed rows back from the checkpoints: the full checkpoint's values, then the priority save's.

  `checkpoint_values`: rows `failed_rows_F` of the last full checkpoint; `priority_values`: rows
  `priority_rows_K` saved by the newest priority save, which must be newer than that full checkpoint (else pass
  no priority rows). Rows not in `failed_rows_F` keep their live values.
  """
  recovered = write_rows(live, failed_rows_F, checkpoint_values, row_axis)
  keep_K = np.isin(priority_rows_K, failed_rows_F)
  if not keep_K.any():
    return recovered
  kept = jax.tree.map(lambda v: jnp.compress(jnp.asarray(keep_K), v, axis=row_axis), priority_values)
  return write_rows(recovered, np.asarray(priority_rows_K)[keep_K], kept, row_axis)


def lost_lookups(
  counts_since_full_V: np.ndarray,
  counts_since_priority_V: np.ndarray,
  failed_rows_F: np.ndarray,
  priority_rows_K: np.ndarray,
) -> int:
  """Lookups whose updates a failure of rows `failed_rows_F` loses: the lookup-weighted PLS numerator.

  A failed row in the priority save loses the lookups since that save, any other failed row those since the
  full checkpoint. Counters are exact lookup counts reset at each full save (`counts_since_full_V`) and at each
  priority save (`counts_since_priority_V`); reset the failed rows of both after a failure, so a second failure
  counts only what the first did not. Divided by all lookups of the run it is the portion of lost samples of
  `checkpoint_interval` weighted by use, which is where MFU/SSU gain over plain partial recovery.
  """
  in_priority_F = np.isin(failed_rows_F, priority_rows_K)
  return int(
    np.asarray(counts_since_priority_V)[failed_rows_F[in_priority_F]].sum()
    + np.asarray(counts_since_full_V)[failed_rows_F[~in_priority_F]].sum()
  )


class LostLookups:
  """Lookups whose updates failures lost (`lost_lookups`), per replica and row, for the lookup-weighted
  PLS that shows what priority saves recover. Instrumentation: exact counts, whatever the mode counts."""

  def __init__(self, num_replicas: int, cardinalities: list[int]):
    self._offsets_T = embedding.table_offsets(cardinalities)
    num_rows = sum(cardinalities)
    self._since_priority_RxV = np.zeros((num_replicas, num_rows), np.int64)  # Since the newest save of any kind.
    self._before_priority_RxV = np.zeros((num_replicas, num_rows), np.int64)  # Full save .. newest priority save.
    self._priority_rows_K = np.zeros(0, np.int32)  # Rows of the newest priority save after the full one.
    self._replica_offsets = np.arange(num_replicas, dtype=np.int64)[:, None] * num_rows
    self.lost = self.total = 0

  def count(self, sparse_RxBxT: np.ndarray) -> None:
    ids_RxN = (np.asarray(sparse_RxBxT) + self._offsets_T).reshape(sparse_RxBxT.shape[0], -1)
    np.add.at(self._since_priority_RxV.reshape(-1), (ids_RxN + self._replica_offsets).reshape(-1), 1)
    self.total += ids_RxN.size

  def full_saved(self) -> None:
    self._since_priority_RxV[:] = 0
    self._before_priority_RxV[:] = 0
    self._priority_rows_K = np.zeros(0, np.int32)

  def priority_saved(self, rows_K: np.ndarray) -> None:
    self._before_priority_RxV += self._since_priority_RxV
    self._since_priority_RxV[:] = 0
    self._priority_rows_K = rows_K

  def fail(self, replica_ids: np.ndarray, rows_F: np.ndarray) -> int:
    """Lookups lost when rows `rows_F` of replicas `replica_ids` reload; those counters restart from 0."""
    if len(replica_ids) == 0:
      return 0
    since_priority_V = self._since_priority_RxV[replica_ids].sum(axis=0)
    since_full_V = since_priority_V + self._before_priority_RxV[replica_ids].sum(axis=0)
    lost = lost_lookups(since_full_V, since_priority_V, rows_F, self._priority_rows_K)
    self._since_priority_RxV[np.ix_(replica_ids, rows_F)] = 0
    self._before_priority_RxV[np.ix_(replica_ids, rows_F)] = 0
    self.lost += lost
    return lost

  def lost_fraction(self) -> float:
    return self.lost / self.total if self.total else 0.0
