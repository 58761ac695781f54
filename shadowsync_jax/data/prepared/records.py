"""One record of a prepared dataset = one block of parsed rows, as a tf.Example that tensorflow-datasets decodes.

  record = records.encode(batch)          # bytes: label uint8 [n], dense float32 [n, 13], sparse int32 [n, 26]
  label_N, dense_NxF, sparse_NxT = records.decode(record)    # zero-copy numpy views
  records.FEATURES                        # the tfds FeaturesDict: tfds.data_source(...)[i] gives the same arrays

A record holds a block (up to `block_rows`, 8192 by default) because one row per record decodes at about 14k rows/s
through TFDS, while whole blocks read at millions of rows/s. Each feature is one bytes field (`Encoding.BYTES`):
without it TFDS stores a [8192, 26] int32 tensor as 212,992 int64 proto values, large and slow. The tf.Example
costs about 70 bytes a record over raw bytes and keeps the dataset readable by `tfds.data_source`. TensorFlow is
not needed: TFDS bundles the protos.
"""

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_example_pb2

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch

_BYTES = tfds.features.Encoding.BYTES
FEATURES = tfds.features.FeaturesDict(
  {
    'label': tfds.features.Tensor(shape=(None,), dtype=np.uint8, encoding=_BYTES),
    'dense': tfds.features.Tensor(shape=(None, NUM_DENSE_FEATURES), dtype=np.float32, encoding=_BYTES),
    'sparse': tfds.features.Tensor(shape=(None, NUM_SPARSE_FEATURES), dtype=np.int32, encoding=_BYTES),
  }
)


def encode(batch: Batch) -> bytes:
  """The record of a block: TFDS's own serializer, so that tfds decodes it."""
  return FEATURES.serialize_example(
    {'label': batch.label.astype(np.uint8), 'dense': batch.dense, 'sparse': batch.sparse}
  )


def decode(record: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(label uint8 [n], dense float32 [n, 13], sparse int32 [n, 26]): read-only views of the record's bytes."""
  feature = tf_example_pb2.Example.FromString(record).features.feature
  label_N = np.frombuffer(feature['label'].bytes_list.value[0], np.uint8)
  dense_NxF = np.frombuffer(feature['dense'].bytes_list.value[0], np.float32).reshape(-1, NUM_DENSE_FEATURES)
  sparse_NxT = np.frombuffer(feature['sparse'].bytes_list.value[0], np.int32).reshape(-1, NUM_SPARSE_FEATURES)
  if not len(label_N) == len(dense_NxF) == len(sparse_NxT):
    raise ValueError(f'a record holds {len(label_N)} labels, {len(dense_NxF)} dense and {len(sparse_NxT)} sparse rows.')
  return label_N, dense_NxF, sparse_NxT
