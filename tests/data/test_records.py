"""A prepared record: what `encode` writes, `decode` reads back as views of it, as protobuf reads it."""

import numpy as np
import pytest
from tensorflow_datasets.proto import tf_example_pb2

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.prepared import records


def _batch(rows: int, seed: int = 0) -> Batch:
  rng = np.random.default_rng(seed)
  return Batch(
    dense=rng.random((rows, 13), dtype=np.float32),
    sparse=rng.integers(0, 2**31 - 1, (rows, 26), dtype=np.int32),
    label=rng.integers(0, 2, rows).astype(np.float32),
  )


@pytest.mark.parametrize('rows', [1, 300, 8192])
def test_decode_gives_back_the_block_as_views(rows):
  batch = _batch(rows)
  record = records.encode(batch)
  label, dense, sparse = records.decode(record)
  np.testing.assert_array_equal(label, batch.label.astype(np.uint8))
  np.testing.assert_array_equal(dense, batch.dense)
  np.testing.assert_array_equal(sparse, batch.sparse)
  assert not dense.flags.owndata and not dense.flags.writeable  # A view of the record, not a copy.
  parsed = tf_example_pb2.Example.FromString(record).features.feature  # What protobuf (and tfds) read.
  assert parsed['sparse'].bytes_list.value[0] == sparse.tobytes()


def test_decode_reads_what_protobuf_writes_in_any_field_order():
  batch = _batch(50, seed=1)
  example = tf_example_pb2.Example()
  for key, array in (('sparse', batch.sparse), ('label', batch.label.astype(np.uint8)), ('dense', batch.dense)):
    example.features.feature[key].bytes_list.value.append(array.tobytes())
  example.features.feature['extra'].int64_list.value.extend([1, 2, 3])  # Another kind of feature is skipped.
  label, dense, sparse = records.decode(example.SerializeToString())
  np.testing.assert_array_equal(sparse, batch.sparse)
  np.testing.assert_array_equal(dense, batch.dense)
  np.testing.assert_array_equal(label, batch.label)
  del example.features.feature['dense']
  with pytest.raises(ValueError, match="features \\['label', 'sparse'\\]"):
    records.decode(example.SerializeToString())
