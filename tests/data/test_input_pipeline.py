"""Tests of the one-pass stream layout: replica shards, resume, both sources through the same pipeline."""

import pathlib
import threading

import jax
import ml_collections
import numpy as np
import pytest

from shadowsync_jax.data import input_pipeline
from shadowsync_jax.data import readers
from shadowsync_jax.data import synthetic
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.criteo import source as criteo

TINY = pathlib.Path(__file__).resolve().parent / 'criteo_tiny.tsv'


class IndexSource:
  """A stream whose example i carries i in every field, so batches show which examples they hold."""

  def read(self, start: int, count: int) -> Batch:
    index = np.arange(start, start + count)
    return Batch(
      dense=np.repeat(index[:, None], 13, axis=1).astype(np.float32),
      sparse=np.repeat(index[:, None], 26, axis=1).astype(np.int32),
      label=index.astype(np.float32),
    )


def _data_config(**overrides) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(
    dict(
      source='synthetic',
      train_path='',
      eval_path='',
      prepared_dir='',
      train_split='train',
      eval_split='heldout',
      num_train_examples=1000,
      num_eval_examples=300,
      cardinalities=[50] * 26,
      zipf_exponent=1.05,
      drift=0.0,
      in_memory=False,
    )
  )
  config.update(overrides)
  return config


def _stack(batches: list[Batch]) -> Batch:
  return Batch(*(np.stack(field) for field in zip(*batches)))


@pytest.mark.parametrize('num_replicas, batch_size, num_train', [(1, 8, 100), (4, 3, 100), (8, 16, 1024)])
def test_replica_shards_are_disjoint_ordered_and_cover_the_stream(num_replicas, batch_size, num_train):
  batches = list(input_pipeline.train_batches(IndexSource(), num_replicas, batch_size, num_train))
  steps = num_train // (num_replicas * batch_size)
  assert len(batches) == steps == input_pipeline.num_steps(num_train, num_replicas, batch_size)
  for step, batch in enumerate(batches):
    assert batch.sparse.shape == (num_replicas, batch_size, 26) and batch.dense.shape == (num_replicas, batch_size, 13)
    for replica in range(num_replicas):
      first = step * num_replicas * batch_size + replica * batch_size
      np.testing.assert_array_equal(batch.label[replica], np.arange(first, first + batch_size))
  seen = np.concatenate([b.sparse[..., 0].ravel() for b in batches])
  np.testing.assert_array_equal(np.sort(seen), np.arange(steps * num_replicas * batch_size))  # no overlap, no gap


def test_resume_continues_exactly_where_it_stopped():
  config = _data_config()
  train, _ = input_pipeline.make_sources(config, seed=0)
  full = list(input_pipeline.train_batches(train, 2, 16, 1000))
  resumed = list(input_pipeline.train_batches(train, 2, 16, 1000, start_step=11))
  assert len(full) == 31 and len(resumed) == 20
  for a, b in zip(full[11:], resumed):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
  assert list(input_pipeline.train_batches(train, 2, 16, 1000, start_step=31)) == []
  with pytest.raises(ValueError, match='start_step'):
    input_pipeline.train_batches(train, 2, 16, 1000, start_step=32)


def test_synthetic_stream_is_deterministic_and_prefetch_does_not_change_it():
  train, _ = input_pipeline.make_sources(_data_config(), seed=4)
  threaded = _stack(list(input_pipeline.train_batches(train, 4, 25, 1000, prefetch=2)))
  inline = _stack(list(input_pipeline.train_batches(train, 4, 25, 1000, prefetch=0)))
  train_again, _ = input_pipeline.make_sources(_data_config(), seed=4)
  again = _stack(list(input_pipeline.train_batches(train_again, 4, 25, 1000)))
  flat = synthetic.SyntheticSource(synthetic.SyntheticSpec(seed=4, cardinalities=(50,) * 26)).read(0, 1000)
  for name, a, b, c, d in zip(Batch._fields, threaded, inline, again, flat):
    np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(a, c, err_msg=name)
    np.testing.assert_array_equal(a.reshape(1000, *a.shape[3:]), d, err_msg=name)  # [steps, R, B] in stream order


def test_a_stream_in_memory_reads_as_the_stream_and_is_read_by_threads():
  stream, _ = input_pipeline.make_sources(_data_config(), seed=2)
  held, _ = input_pipeline.make_sources(_data_config(in_memory=True), seed=2)
  assert len(held) == len(stream) == 1000
  for start, count in ((0, 1000), (17, 300), (999, 1)):
    for a, b in zip(held.read(start, count), stream.read(start, count)):
      np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match='cannot read examples'):
    held.read(900, 101)
  for source, kind in ((held, readers.Threads), (stream, readers.Processes)):  # Held: no copy a reader process.
    made = readers.make(source, 2)
    made.close()
    assert isinstance(made, kind)


def test_synthetic_eval_follows_the_training_stream():
  config = _data_config(drift=0.5)
  _, eval_source = input_pipeline.make_sources(config, seed=2)
  batch = input_pipeline.eval_batch(eval_source, 300)
  probability = input_pipeline.eval_true_probability(eval_source, 300)
  spec = synthetic.SyntheticSpec(seed=2, cardinalities=(50,) * 26, drift=0.5)
  expected, expected_probability = synthetic.SyntheticSource(spec).read_with_probability(1000, 300)
  for a, b in zip(batch, expected):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(probability, expected_probability)


def test_criteo_through_the_same_pipeline():
  config = _data_config(
    source='criteo', train_path=str(TINY), num_train_examples=40, num_eval_examples=10, cardinalities=[1000] * 26
  )
  train, eval_source = input_pipeline.make_sources(config, seed=0)
  rows = criteo.CriteoSource(str(TINY), (1000,) * 26).read(0, 50)
  batches = list(input_pipeline.train_batches(train, 2, 4, 40))
  assert len(batches) == 5
  np.testing.assert_array_equal(_stack(batches).sparse.reshape(40, 26), rows.sparse[:40])
  np.testing.assert_array_equal(input_pipeline.eval_batch(eval_source, 10).sparse, rows.sparse[40:])
  assert input_pipeline.eval_true_probability(eval_source, 10) is None


def test_criteo_eval_file():
  config = _data_config(
    source='criteo',
    train_path=str(TINY),
    eval_path=str(TINY),
    num_train_examples=50,
    num_eval_examples=20,
    cardinalities=[1000] * 26,
  )
  _, eval_source = input_pipeline.make_sources(config, seed=0)
  rows = criteo.CriteoSource(str(TINY), (1000,) * 26).read(0, 20)
  np.testing.assert_array_equal(input_pipeline.eval_batch(eval_source, 20).dense, rows.dense)


@pytest.mark.parametrize(
  'overrides, key',
  [
    (dict(num_train_examples=45), 'data.num_train_examples'),  # 45 + 10 eval rows > 50
    (dict(num_train_examples=51, eval_path=str(TINY)), 'data.num_train_examples'),
    (dict(num_eval_examples=51, eval_path=str(TINY)), 'data.num_eval_examples'),
    (dict(source='parquet'), 'data.source'),
  ],
)
def test_config_errors_name_the_key(overrides, key):
  config = _data_config(source='criteo', train_path=str(TINY), num_train_examples=40, num_eval_examples=10)
  config.update(overrides)
  with pytest.raises(ValueError, match=key.replace('.', r'\.')):
    input_pipeline.make_sources(config, seed=0)


def test_errors_in_the_reader_reach_the_consumer():
  class Failing(IndexSource):
    def read(self, start, count):
      if start >= 30:
        raise RuntimeError('disk gone')
      return super().read(start, count)

  batches = input_pipeline.train_batches(Failing(), 2, 5, 100)
  assert next(batches).label.shape == (2, 5)
  with pytest.raises(RuntimeError, match='disk gone'):
    list(batches)


def test_an_id_past_its_table_is_named_with_its_example():
  """Data whose ids do not fit `data.cardinalities` (here: a stream of 50-row tables read into 40-row ones) stops
  at the first such id, naming the example, the table and its rows, instead of training on other rows."""
  stream = synthetic.SyntheticSource(synthetic.SyntheticSpec(seed=1, cardinalities=(50,) * 26))
  checked = input_pipeline.StreamSlice(stream, 100, 1000, cardinalities=(40,) * 26)
  with pytest.raises(ValueError, match=r'example \d+ of the data has id 4\d in table \d+ .*40 rows'):
    checked.read(0, 1000)
  np.testing.assert_array_equal(
    input_pipeline.StreamSlice(stream, 100, 1000, (50,) * 26).read(0, 5).sparse, stream.read(100, 5).sparse
  )


@pytest.mark.parametrize('replicas', [None, range(2, 4)])
def test_a_block_holds_the_steps_replica_first_and_zeros_past_its_steps(replicas):
  """Block [L, K, B, ...]: replica l's step k is the same slice `train_batches` gives for that step."""
  num_replicas, batch_size = 4, 3
  steps = _stack(list(input_pipeline.train_batches(IndexSource(), num_replicas, batch_size, 120)))  # [S, R, B, ...]
  block = input_pipeline.read_block(IndexSource(), num_replicas, batch_size, 2, 3, 5, replicas=replicas)
  kept = range(num_replicas) if replicas is None else replicas
  assert block.label.shape == (len(kept), 5, batch_size) and block.sparse.shape == (len(kept), 5, batch_size, 26)
  for field, whole in zip(block, steps):
    np.testing.assert_array_equal(field[:, :3], np.swapaxes(whole[2:5, kept.start : kept.stop], 0, 1))
    assert not field[:, 3:].any()
  with pytest.raises(ValueError, match='num_steps=6'):
    input_pipeline.read_block(IndexSource(), num_replicas, batch_size, 0, 6, 5)


@pytest.mark.parametrize('kind', ['threads', 'processes'])
@pytest.mark.parametrize('replicas', [None, range(1, 3)])
def test_a_block_read_by_readers_side_by_side_is_the_block_read_at_once(kind, replicas):
  """Readers (`data.readers`, threads or processes) split a block's reads into pieces and change no value."""
  stream = input_pipeline.StreamSlice(synthetic.SyntheticSource(synthetic.SyntheticSpec(seed=3)), 100, 10**6)
  at_once = input_pipeline.read_block(stream, 4, 1024, 1, 5, 6, replicas=replicas)
  side_by_side = readers.make(stream, 2, processes=kind == 'processes')
  try:
    assert type(side_by_side).__name__ == kind.capitalize()
    for _ in range(2):  # The second read reuses the processes' shared memory.
      block = input_pipeline.read_block(stream, 4, 1024, 1, 5, 6, replicas=replicas, readers=side_by_side)
      for field, expected in zip(block, at_once):
        np.testing.assert_array_equal(field, expected)
  finally:
    side_by_side.close()


def test_readers_split_a_range_into_pieces_and_auto_counts_the_cores():
  assert readers.pieces(10, 100, 4) == [(10, 100)]  # Shorter than two pieces of MIN_PIECE: one.
  assert readers.pieces(0, 4 * readers.MIN_PIECE, 8) == [(i * 4096, 4096) for i in range(4)]
  assert len(readers.pieces(0, 10 * readers.MAX_PIECE, 2)) == 10  # A piece is MAX_PIECE at most.
  assert readers.count(3) == 3 and 1 <= readers.count('auto') <= readers.MAX_READERS
  assert isinstance(readers.make(IndexSource(), 1), readers.Serial)
  threads = readers.make(open(__file__), 2)  # A source that cannot be sent to a process: threads.
  assert isinstance(threads, readers.Threads)
  threads.close()


def test_the_block_reader_serves_a_prefetched_block_or_reads_the_one_asked_for():
  class Counting(IndexSource):
    reads = 0

    def read(self, start, count):
      Counting.reads += 1
      return super().read(start, count)

  placed_in = []  # The threads that placed a block.

  def place(block):
    placed_in.append(threading.current_thread().name)
    return jax.device_put(block)

  reader = input_pipeline.BlockReader(Counting(), 2, 4, block_steps=4, readers=2, processes=False, place=place)
  try:
    reader.prefetch(3, 4)
    block, placed = reader.take(3, 2)  # Its first two steps: the prefetched block serves (steps past 2 are never used).
    assert Counting.reads == 1 and block.label[0, 0, 0] == 3 * 2 * 4
    assert isinstance(placed.label, jax.Array) and np.array_equal(np.asarray(placed.label), block.label)
    assert placed_in[0].startswith('block-reader')  # Placed where it was read, off the loop's thread.
    reader.prefetch(5, 4)
    again, _ = reader.take(0, 1)  # Not what was prefetched: read now.
    assert Counting.reads == 3 and again.label[0, 0, 0] == 0 and not again.label[:, 1:].any()
    reader.resize(8)
    assert reader.take(0, 6)[0].label.shape == (2, 8, 4)
  finally:
    reader.close()
