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
  """(label uint8 [n], dense float32 [n, 13], sparse int32 [n, 26]): read-only views of the record's bytes.

  The tf.Example is walked by hand (Example.features -> map entries -> Feature.bytes_list.value), so the three
  arrays are views into `record`: protobuf's parser would copy each 1.3 MB block twice more, which costs as much as
  reading it.
  """
  view = memoryview(record)
  arrays = {}
  for field, start, end in _fields(view, 0, len(view)):  # Example
    if field != 1:
      continue
    for entry, entry_start, entry_end in _fields(view, start, end):  # Features: map<string, Feature> entries
      if entry != 1:
        continue
      key, value = None, None
      for part, part_start, part_end in _fields(view, entry_start, entry_end):
        if part == 1:
          key = bytes(view[part_start:part_end]).decode()
        elif part == 2:
          value = _bytes_value(view, part_start, part_end)
      if key in _LAYOUT and value is not None:
        dtype, width = _LAYOUT[key]
        array = np.frombuffer(record, dtype, (value[1] - value[0]) // np.dtype(dtype).itemsize, value[0])
        arrays[key] = array if width is None else array.reshape(-1, width)
  if set(arrays) != set(_LAYOUT):
    raise ValueError(f'a record holds features {sorted(arrays)}; expected {sorted(_LAYOUT)}.')
  label_N, dense_NxF, sparse_NxT = arrays['label'], arrays['dense'], arrays['sparse']
  if not len(label_N) == len(dense_NxF) == len(sparse_NxT):
    raise ValueError(f'a record holds {len(label_N)} labels, {len(dense_NxF)} dense and {len(sparse_NxT)} sparse rows.')
  return label_N, dense_NxF, sparse_NxT


_LAYOUT = {
  'label': (np.uint8, None),
  'dense': (np.float32, NUM_DENSE_FEATURES),
  'sparse': (np.int32, NUM_SPARSE_FEATURES),
}


def _bytes_value(view: memoryview, start: int, end: int) -> tuple[int, int] | None:
  """(start, end) of the one bytes value of a Feature's bytes_list, or None for another kind of Feature."""
  for kind, list_start, list_end in _fields(view, start, end):
    if kind == 1:  # bytes_list
      for field, value_start, value_end in _fields(view, list_start, list_end):
        if field == 1:
          return value_start, value_end
  return None


def _fields(view: memoryview, start: int, end: int):
  """(field number, start, end) of the length-delimited fields of the protobuf message in view[start:end]; fields
  of other wire types are skipped."""
  position = start
  while position < end:
    tag, position = _varint(view, position)
    wire_type = tag & 7
    if wire_type == 2:
      length, position = _varint(view, position)
      yield tag >> 3, position, position + length
      position += length
    elif wire_type == 0:
      _, position = _varint(view, position)
    elif wire_type in (1, 5):
      position += 8 if wire_type == 1 else 4
    else:
      raise ValueError(f'a record is not a tf.Example: wire type {wire_type} at byte {position}.')


def _varint(view: memoryview, position: int) -> tuple[int, int]:
  value, shift = 0, 0
  while True:
    byte = view[position]
    position += 1
    value |= (byte & 0x7F) << shift
    if byte < 0x80:
      return value, position
    shift += 7
