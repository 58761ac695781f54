"""Row access counts, top rows and row save/restore against numpy references (bincount, lexsort, fancy indexing)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shadowsync_jax.model import embedding
from shadowsync_jax.recovery import failures
from shadowsync_jax.recovery import row_usage

CARDINALITIES = [50, 7, 200, 13]
NUM_ROWS = sum(CARDINALITIES)


def _zipf_row_ids(rng, shape):
  """[..., T] global row ids, skewed within each table like real categorical features."""
  sparse = np.stack([np.minimum(rng.zipf(1.3, shape), c) - 1 for c in CARDINALITIES], axis=-1).astype(np.int32)
  return np.asarray(embedding.global_row_ids(sparse, embedding.table_offsets(CARDINALITIES)))


def test_count_lookups_matches_bincount_on_replica_batches():
  rng = np.random.default_rng(0)
  ids_RxBxT = _zipf_row_ids(rng, (3, 64))
  counts_V = np.zeros(NUM_ROWS, np.int64)
  row_usage.count_lookups(counts_V, ids_RxBxT)
  row_usage.count_lookups(counts_V, ids_RxBxT[0])  # accumulates
  want = np.bincount(ids_RxBxT.ravel(), minlength=NUM_ROWS) + np.bincount(ids_RxBxT[0].ravel(), minlength=NUM_ROWS)
  np.testing.assert_array_equal(counts_V, want)
  assert counts_V.max() > 10  # hot rows repeat within a batch: the test covers duplicates


def test_device_count_lookups_matches_numpy():
  ids_BxT = _zipf_row_ids(np.random.default_rng(1), (128,))
  count = jax.jit(row_usage.device_count_lookups, donate_argnums=0)
  counts_V = count(jnp.zeros(NUM_ROWS, jnp.int32), jnp.asarray(ids_BxT))
  counts_V = count(counts_V, jnp.asarray(ids_BxT))
  np.testing.assert_array_equal(np.asarray(counts_V), 2 * np.bincount(ids_BxT.ravel(), minlength=NUM_ROWS))


def test_sampled_counts_are_an_unbiased_fraction_of_the_exact_counts():
  ids_BxT = _zipf_row_ids(np.random.default_rng(2), (20_000,))
  exact_V = np.bincount(ids_BxT.ravel(), minlength=NUM_ROWS)
  rate = 0.1
  sampled_V = row_usage.count_sampled_lookups(np.zeros(NUM_ROWS, np.int64), ids_BxT, rate, np.random.default_rng(7))
  total = ids_BxT.size
  assert abs(sampled_V.sum() - rate * total) < 4 * np.sqrt(total * rate * (1 - rate))
  hot = exact_V > 2_000  # counts large enough for a tight check: sd of a sampled count <= sqrt(rate * count)
  assert hot.sum() >= 4
  np.testing.assert_array_less(np.abs(sampled_V[hot] - rate * exact_V[hot]), 5 * np.sqrt(rate * exact_V[hot]))
  again = row_usage.count_sampled_lookups(np.zeros(NUM_ROWS, np.int64), ids_BxT, rate, np.random.default_rng(7))
  np.testing.assert_array_equal(again, sampled_V)  # seeded
  with pytest.raises(ValueError, match='sample_rate'):
    row_usage.count_sampled_lookups(sampled_V, ids_BxT, 0.0, np.random.default_rng(0))


def test_top_rows_matches_a_full_sort_with_ties_to_lower_ids():
  rng = np.random.default_rng(3)
  counts_V = rng.integers(0, 6, 1_000)  # many ties and zeros
  for fraction in (0.0, 0.01, 0.1, 0.37, 0.9, 1.0):
    k = min(int(fraction * 1_000), np.count_nonzero(counts_V))
    want = np.sort(np.lexsort((np.arange(1_000), -counts_V))[:k])
    got = row_usage.top_rows(counts_V, fraction)
    np.testing.assert_array_equal(got, want, err_msg=str(fraction))
    assert got.dtype == np.int32
  assert np.all(counts_V[row_usage.top_rows(counts_V, 1.0)] > 0)  # never an unused row
  assert row_usage.top_rows(np.zeros(10, np.int64), 0.5).shape == (0,)


def test_sub_sampled_top_rows_find_most_of_the_most_used_rows():
  """CPR-SSU's premise: a 5% sample of the lookups ranks the hot rows nearly as exact counts do."""
  ids_BxT = _zipf_row_ids(np.random.default_rng(4), (20_000,))
  exact = row_usage.top_rows(np.bincount(ids_BxT.ravel(), minlength=NUM_ROWS), 0.05)
  sampled_V = row_usage.count_sampled_lookups(np.zeros(NUM_ROWS, np.int64), ids_BxT, 0.05, np.random.default_rng(5))
  sampled = row_usage.top_rows(sampled_V, 0.05)
  assert len(exact) == len(sampled) == 13
  assert len(np.intersect1d(exact, sampled)) >= 0.8 * len(exact)


def _state(rng, num_replicas=2, dim=3):
  return {
    'table': jnp.asarray(rng.normal(size=(num_replicas, NUM_ROWS, dim)), jnp.float32),
    'accumulator': jnp.asarray(rng.uniform(size=(num_replicas, NUM_ROWS)), jnp.float32),
  }


def test_extract_and_write_rows_match_numpy_indexing():
  rng = np.random.default_rng(5)
  state, rows_K = _state(rng), np.array([0, 5, 100, NUM_ROWS - 1], np.int32)
  saved = row_usage.extract_rows(state, rows_K, row_axis=1)
  np.testing.assert_array_equal(saved['table'], np.asarray(state['table'])[:, rows_K])
  np.testing.assert_array_equal(saved['accumulator'], np.asarray(state['accumulator'])[:, rows_K])
  one = row_usage.extract_rows(state['table'][1], rows_K)  # a single replica: rows on axis 0
  np.testing.assert_array_equal(one, np.asarray(state['table'])[1, rows_K])
  other = _state(rng)
  written = row_usage.write_rows(other, rows_K, saved, row_axis=1)
  want = {key: np.asarray(value).copy() for key, value in other.items()}
  for key in want:
    want[key][:, rows_K] = np.asarray(state[key])[:, rows_K]
    np.testing.assert_array_equal(written[key], want[key], err_msg=key)


def test_recover_rows_takes_the_priority_save_over_the_full_checkpoint_for_failed_rows():
  rng = np.random.default_rng(6)
  live, full, priority = _state(rng), _state(rng), _state(rng)
  failed_F = failures.embedding_shard_rows(CARDINALITIES, num_shards=3, shard=1)
  priority_rows_K = np.array([0, 20, 30, 60, 150, 200], np.int32)  # some inside shard 1, some not
  in_shard = np.isin(priority_rows_K, failed_F)
  assert in_shard.any() and not in_shard.all()
  got = row_usage.recover_rows(
    live,
    failed_F,
    row_usage.extract_rows(full, failed_F, row_axis=1),
    priority_rows_K,
    row_usage.extract_rows(priority, priority_rows_K, row_axis=1),
    row_axis=1,
  )
  for key in live:
    want = np.asarray(live[key]).copy()
    want[:, failed_F] = np.asarray(full[key])[:, failed_F]
    fresh = priority_rows_K[in_shard]
    want[:, fresh] = np.asarray(priority[key])[:, fresh]
    np.testing.assert_array_equal(got[key], want, err_msg=key)
  no_priority = row_usage.recover_rows(
    live,
    failed_F,
    row_usage.extract_rows(full, failed_F, row_axis=1),
    np.zeros((0,), np.int32),
    row_usage.extract_rows(priority, [], row_axis=1),
    row_axis=1,
  )
  np.testing.assert_array_equal(no_priority['table'][:, failed_F], np.asarray(full['table'])[:, failed_F])


def test_lost_lookups_count_priority_rows_since_the_priority_save():
  rng = np.random.default_rng(8)
  since_full_V = rng.integers(0, 50, NUM_ROWS)
  since_priority_V = rng.integers(0, 5, NUM_ROWS)
  failed_F = failures.embedding_shard_rows(CARDINALITIES, num_shards=4, shard=0)
  priority_rows_K = row_usage.top_rows(since_full_V, 0.1)
  want = sum(int(since_priority_V[r]) if r in set(priority_rows_K.tolist()) else int(since_full_V[r]) for r in failed_F)
  assert row_usage.lost_lookups(since_full_V, since_priority_V, failed_F, priority_rows_K) == want
  assert (
    row_usage.lost_lookups(since_full_V, since_priority_V, failed_F, np.zeros((0,), np.int32))
    == since_full_V[failed_F].sum()
  )
