"""CPR's priority saves: counts against bincount, the rows each save takes, what comes back from disk."""

import threading
import time

import jax.numpy as jnp
import numpy as np

from shadowsync_jax.model import embedding
from shadowsync_jax.model import step
from shadowsync_jax.model import table_placement
from shadowsync_jax.recovery import priority_rows
from shadowsync_jax.recovery import priority_saves
from shadowsync_jax.recovery import restore

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


def test_row_sharded_tables_count_and_save_each_shard_of_this_process_its_own_rows(tmp_path):
  """V = 260 rows on S = 4 shards (row e on shard e % 4 as local row e // 4, 65 rows, held padded to 72); this
  process holds shards 2 and 3. It counts only their rows, and each shard saves its own most used local rows."""
  layout = table_placement.ShardLayout(260, 4)
  shards = priority_rows.HeldShards(layout, first=2, count=2, rows_held=72)
  saver = priority_rows.PrioritySaver(tmp_path, CARDINALITIES, fraction=0.1, sample_rate=None, seed=0, shards=shards)
  assert saver.rows_per_save == 6  # floor(0.1 * 65) a shard.
  offsets_T = embedding.table_offsets(CARDINALITIES)
  batches = _ids(3, 5) + _ids(None, 10, np.random.default_rng(1))
  for ids in batches:
    saver.count(ids)
  table_LxVxD = jnp.arange(2 * 72 * 3, dtype=jnp.float32).reshape(2, 72, 3)
  rows_LxK = saver.save(4, {'table': table_LxVxD, 'accumulator': table_LxVxD[..., 0]})
  step, saved_rows, values = saver.latest()
  saver.close()

  every_id = np.concatenate([np.ravel(ids + offsets_T) for ids in batches])
  for local in range(2):
    mine = every_id[every_id % 4 == 2 + local] // 4
    expected = np.bincount(mine, minlength=72)
    np.testing.assert_array_equal(saver.counts_V[local * 72 : (local + 1) * 72], expected)
    np.testing.assert_array_equal(rows_LxK[local], priority_rows.fixed_size_top_rows(expected[:65], 6))
  hot = offsets_T + 3  # Row 3 of every table, the most used rows: 13 of them on shard 3, none on shard 2.
  assert set(rows_LxK[1]) < set(hot[hot % 4 == 3] // 4)
  assert step == 4 and saved_rows.shape == (2, 6)
  np.testing.assert_array_equal(saved_rows, rows_LxK)
  for local in range(2):
    np.testing.assert_array_equal(values['table'][local], np.asarray(table_LxVxD)[local, rows_LxK[local]])
    np.testing.assert_array_equal(values['accumulator'][local], np.asarray(table_LxVxD)[local, rows_LxK[local], 0])


def test_a_shards_rows_written_back_into_that_shard_only():
  live = {'table': jnp.zeros((2, 8, 3)), 'accumulator': jnp.zeros((2, 8))}
  rows_LxK = jnp.array([[1, 5], [0, 7]])
  values = {'table': jnp.ones((2, 2, 3)) * jnp.array([1.0, 2.0])[:, None, None], 'accumulator': jnp.ones((2, 2))}
  written = restore.write_rows_per_replica(live, rows_LxK, values)
  table = np.asarray(written['table'])
  assert set(np.flatnonzero(table[0, :, 0])) == {1, 5} and np.all(table[0, [1, 5]] == 1.0)
  assert set(np.flatnonzero(table[1, :, 0])) == {0, 7} and np.all(table[1, [0, 7]] == 2.0)
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(written['accumulator'])[1]), [0, 7])


def test_a_byte_budget_caps_the_rows_a_save_takes_to_the_most_used(tmp_path):
  """26 rows a save by the share; 2 replicas x (3 floats + 1 accumulator) = 32 bytes a row: 320 bytes take 10."""
  table_RxVxD = jnp.arange(2 * 260 * 3, dtype=jnp.float32).reshape(2, 260, 3)
  rows = {'table': table_RxVxD, 'accumulator': table_RxVxD[..., 0]}
  state = type('State', (), {})()  # `restore.bytes_per_row` reads the row leaves of a train state.
  state.params = {'embedding': table_RxVxD}
  state.embedding_opt_state = embedding.RowwiseAdagradState(rows['accumulator'], rows['accumulator'])
  assert restore.bytes_per_row(state) == 2 * (3 + 1) * 4
  saver = priority_rows.PrioritySaver(
    tmp_path, CARDINALITIES, fraction=0.1, sample_rate=None, seed=0, max_bytes=320, bytes_per_row=32
  )
  assert saver.rows_per_save == 10
  offsets_T = embedding.table_offsets(CARDINALITIES)
  for ids in _ids(3, 5) + _ids(7, 2):
    saver.count(ids)
  taken = saver.save(1, rows)  # Row 3 of every table, looked up most, ties by position: the first 10 tables'.
  np.testing.assert_array_equal(taken, (offsets_T + 3)[:10])
  saver.close()


def test_a_save_still_being_written_says_so_and_the_loop_skips_the_next(tmp_path, monkeypatch):
  """`writing()` is true from a save until it is on disk (its rows ranked, its file written): the loop skips a
  priority save due meanwhile instead of queueing it behind (a Kaggle-size save blocked 3 s at the median)."""
  release = threading.Event()
  saver = priority_rows.PrioritySaver(tmp_path, CARDINALITIES, fraction=0.1, sample_rate=None, seed=0)
  write = saver._write  # pylint: disable=protected-access
  monkeypatch.setattr(saver, '_write', lambda item: (release.wait(10), write(item)))
  saver._writer._handle = saver._write  # pylint: disable=protected-access
  rows = {'table': jnp.zeros((1, 260, 3), jnp.float32)}
  assert not saver.writing()
  saver.save(1, rows)
  assert saver.writing()
  release.set()
  saver.wait()
  assert not saver.writing() and saver.latest()[0] == 1
  saver.close()


def test_a_save_is_due_once_its_threads_took_at_most_the_share_of_the_time_since_it_started(tmp_path):
  """`max_overhead`: the ranking and writing of the last save (timed in their threads) over the time since it
  started must be within the share before the next one is due; 0 = whenever the last one is written."""
  rows = {'table': jnp.zeros((1, 260, 3), jnp.float32)}
  for share, due_after_wait in ((0.0, True), (1e-12, False)):
    saver = priority_rows.PrioritySaver(
      tmp_path / str(share), CARDINALITIES, fraction=0.1, sample_rate=None, seed=0, max_overhead=share
    )
    if share:
      assert not saver.due()  # With a budget the first call ranks the counts so far, in the background.
      saver.wait()
    assert saver.due()
    saver.save(1, rows)
    saver.wait()
    assert saver.last_cost_s > 0 and saver.due() is due_after_wait
    saver.close()
  saver = priority_rows.PrioritySaver(
    tmp_path / 'half', CARDINALITIES, fraction=0.1, sample_rate=None, seed=0, max_overhead=0.5
  )
  saver.save(1, rows)
  saver.wait()
  time.sleep(2 * saver.last_cost_s)
  assert saver.due()
  saver.close()


def test_with_a_budget_no_save_waits_for_a_ranking(tmp_path, monkeypatch):
  """With a budget, the first `due` of a saver starts ranking in the counting thread and says no; the save it then
  allows takes the rows ranked there, and the training thread never ranks."""
  saver = priority_rows.PrioritySaver(tmp_path, CARDINALITIES, fraction=0.1, sample_rate=None, seed=0, max_overhead=0.5)
  saver.count(np.arange(2 * 26).reshape(2, 26) % 10)  # Two examples' ids, one a table.
  ranked_in = []
  top_rows = saver._top_rows  # pylint: disable=protected-access
  monkeypatch.setattr(saver, '_top_rows', lambda: (ranked_in.append(threading.current_thread().name), top_rows())[1])
  assert not saver.due()
  saver.wait()
  assert saver.due()
  saver.save(1, {'table': jnp.zeros((1, 260, 3), jnp.float32)})
  saver.wait()
  assert ranked_in and threading.main_thread().name not in ranked_in, ranked_in
  saver.close()


def test_a_restart_stamps_only_the_priority_rows_it_changes(tmp_path):
  """A process that died takes back its newest priority save's rows over the checkpoint it restored, and stamps the
  rows those change, so that its next differential holds them; the rows the save holds as restored (padding to K,
  or unused since the checkpoint) keep the checkpoint's stamps (stamped all, they swelled every later differential
  of the process)."""
  table_LxVxD = jnp.arange(2 * 10 * 3, dtype=jnp.float32).reshape(2, 10, 3)
  accumulator_LxV = jnp.ones((2, 10), jnp.float32)
  row_steps_LxV = jnp.asarray(np.tile([0, 5, 0, 0, 7, 0, 0, 0, 0, 0], (2, 1)), jnp.int32)
  state_L = step.TrainState(
    params={'mlp': {}, 'embedding': table_LxVxD},
    mlp_opt_state=(),
    embedding_opt_state=embedding.RowwiseAdagradState(accumulator_LxV, jnp.zeros((2, 10), jnp.float32)),
    step=jnp.zeros(2, jnp.int32),
    row_steps=row_steps_LxV,
  )
  rows_K = np.array([1, 4, 6])
  table = np.asarray(table_LxVxD)[:, rows_K].copy()
  accumulator = np.asarray(accumulator_LxV)[:, rows_K].copy()
  table[:, 0, 2] += 1.0  # Row 1 trained since the checkpoint; row 4 as restored;
  accumulator[1, 2] = 2.0  # row 6 only its accumulator, and only in replica 1.
  np.savez(tmp_path / '30.npz', rows=rows_K, table=table, accumulator=accumulator)
  restored_L, priority_step = priority_saves.newer_rows(tmp_path, state_L, checkpoint_step=20, position=35)
  assert priority_step == 30
  np.testing.assert_array_equal(np.asarray(restored_L.params['embedding'])[:, rows_K], table)
  np.testing.assert_array_equal(np.asarray(restored_L.embedding_opt_state.accumulator_V)[:, rows_K], accumulator)
  expected = np.asarray(row_steps_LxV).copy()
  expected[:, 1] = 35
  expected[1, 6] = 35
  np.testing.assert_array_equal(np.asarray(restored_L.row_steps), expected)
