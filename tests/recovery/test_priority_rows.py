"""CPR's priority saves: counts against bincount, the rows each save takes, what comes back from disk."""

import jax.numpy as jnp
import numpy as np

from shadowsync_jax.model import embedding
from shadowsync_jax.recovery import priority_rows

CARDINALITIES = [10] * 26  # V = 260; priority_fraction 0.1 -> 26 rows a save.


def _ids(row, num_batches, rng=None):
  """`num_batches` batches [1, 4, 26]: table t's id `row` everywhere, or random ids with `rng`."""
  shape = (num_batches, 1, 4, 26)
  return list(rng.integers(0, 10, shape) if rng is not None else np.full(shape, row))


def test_fixed_size_top_rows_pads_with_unused_rows():
  counts_V = np.zeros(20, np.int64)
  counts_V[[3, 17, 5]] = [9, 7, 9]
  np.testing.assert_array_equal(priority_rows.fixed_size_top_rows(counts_V, 2), [3, 5])
  np.testing.assert_array_equal(priority_rows.fixed_size_top_rows(counts_V, 5), [0, 1, 3, 5, 17])
  np.testing.assert_array_equal(priority_rows.fixed_size_top_rows(counts_V, 20), np.arange(20))


def test_counts_and_the_rows_each_save_takes(tmp_path):
  (tmp_path / '5.npz').write_bytes(b'from an earlier process')
  saver = priority_rows.PrioritySaver(tmp_path, CARDINALITIES, fraction=0.1, sample_rate=None, seed=0)
  assert not list(tmp_path.iterdir())  # An earlier process's saves could be newer than the resumed checkpoint.
  table_RxVxD = jnp.arange(2 * 260 * 3, dtype=jnp.float32).reshape(2, 260, 3)
  rows = {'table': table_RxVxD, 'accumulator': table_RxVxD[..., 0]}
  offsets_T = embedding.table_offsets(CARDINALITIES)
  random = _ids(None, 40, np.random.default_rng(0))
  hot_3, hot_7 = offsets_T + 3, offsets_T + 7
  for ids in _ids(3, 5) + random[:20]:
    saver.count(ids)
  first = saver.save(1, rows)  # The first save ranks every count so far: row 3 of each table leads.
  np.testing.assert_array_equal(first, hot_3)
  for ids in _ids(7, 30) + random[20:]:
    saver.count(ids)
  # Rows ranked on the counts of the previous save, whatever the counter did since: the same rows again.
  np.testing.assert_array_equal(saver.save(2, rows), hot_3)
  np.testing.assert_array_equal(saver.save(3, rows), hot_7)

  step, rows_K, values = saver.latest()
  assert step == 3 and sorted(p.name for p in tmp_path.iterdir()) == ['2.npz', '3.npz']  # Two kept.
  np.testing.assert_array_equal(rows_K, hot_7)
  np.testing.assert_array_equal(values['table'], np.asarray(table_RxVxD)[:, hot_7])
  np.testing.assert_array_equal(values['accumulator'], np.asarray(table_RxVxD)[:, hot_7, 0])
  saver.close()
  all_ids = np.concatenate([np.ravel(ids + offsets_T) for ids in _ids(3, 5) + _ids(7, 30) + random])
  np.testing.assert_array_equal(saver.counts_V, np.bincount(all_ids, minlength=260))


def test_sub_sampled_counts_are_a_fraction_of_the_lookups(tmp_path):
  saver = priority_rows.PrioritySaver(tmp_path, CARDINALITIES, fraction=0.1, sample_rate=0.05, seed=0)
  for ids in _ids(3, 400):
    saver.count(ids)
  saver.close()
  lookups = 400 * 4 * 26
  assert abs(saver.counts_V.sum() - 0.05 * lookups) < 4 * np.sqrt(0.05 * lookups)
  assert set(np.flatnonzero(saver.counts_V)) <= set(embedding.table_offsets(CARDINALITIES) + 3)
