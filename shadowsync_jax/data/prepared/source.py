"""A split of a prepared dataset as a random-access source of `Batch`es.

  source = source_lib.PreparedSource(version_dir, 'train')     # version_dir: manifest.find(config.data.prepared_dir)
  len(source)                      # rows of the split
  batch = source.read(1000, 256)   # rows 1000..1255 of the split, in stream order
  p = source.true_probability(0, 256)   # generated inputs: the teacher's probabilities; otherwise None

It plugs into `input_pipeline.train_batches` (grain's threads) and the training loop's `BlockReader` like the
synthetic and TSV sources, which gives each process its own replicas' rows, in stream order, resumable at any step.
The shards are read with array_record's own reader, one a shard, whose file buffer holds a whole record (grain's
`ArrayRecordDataSource` opens them with a 32 KB buffer: a 1.3 MB block then reads in 2.2-4.2 ms, against 0.4 ms
through a 2 MB one). array_record releases the GIL while it reads and decompresses, so reading threads use several
cores. Each record is decoded as a whole block (`records.decode`). Consecutive steps and the prefetch threads
ask for the same block, so the last decoded blocks (`CACHED_ROWS`) are kept and a block wanted by two threads at
once is decoded once. A process whose share of a step is smaller than a block still decodes the whole block: with P
processes each decodes up to P times its own rows, which is why blocks are stored uncompressed by default
(`prepare.DEFAULT_COMPRESSION`; docs/studies/criteo.md).
"""

import collections
import os
import threading

from array_record.python import array_record_module
import numpy as np

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.prepared import manifest as manifest_lib
from shadowsync_jax.data.prepared import records

# Decoded blocks kept: the pipeline's prefetch threads read a few groups of steps at once, and a block that one of
# them still needs must not be dropped; 64k rows (10 MB) covers them at any block size.
CACHED_ROWS = 1 << 16
# Bytes of a row in a record (label uint8, 13 float32, 26 int32), for the readers' file buffer.
_ROW_BYTES = 1 + 4 * (NUM_DENSE_FEATURES + NUM_SPARSE_FEATURES)


class PreparedSource:
  """Rows of one split of a prepared dataset (thread-safe)."""

  def __init__(self, version_dir: str, split: str):
    self.version_dir, self.split = version_dir, split
    self.manifest = manifest_lib.read(version_dir)
    shards = manifest_lib.shards(self.manifest, split)
    self._rows_R = np.asarray([rows for shard in shards for rows in shard['rows_per_record']], np.int64)
    self._first_row = np.concatenate([[0], np.cumsum(self._rows_R)])
    self._records = _Records(
      [os.path.join(version_dir, shard['file']) for shard in shards], self.manifest['block_rows'] * _ROW_BYTES
    )
    if len(self._records) != len(self._rows_R):
      raise ValueError(
        f'{version_dir}: {len(self._records)} records in the {split} shards, the manifest lists {len(self._rows_R)}.'
      )
    p_true_file = manifest_lib.true_probability_file(self.manifest, split)
    self._p_true = None if p_true_file is None else np.load(os.path.join(version_dir, p_true_file), mmap_mode='r')
    self._cache = collections.OrderedDict()  # record index -> _Decoded, least recently used first
    self._cached_blocks, self._lock = max(8, CACHED_ROWS // self.manifest['block_rows']), threading.Lock()
    self.blocks_decoded = 0

  def __len__(self) -> int:
    return int(self._first_row[-1])

  def read(self, start: int, count: int) -> Batch:
    """Rows [start, start + count) of the split: label float32, dense float32, sparse int32."""
    self._check_range(start, count)
    batch = Batch(
      dense=np.empty((count, NUM_DENSE_FEATURES), np.float32),
      sparse=np.empty((count, NUM_SPARSE_FEATURES), np.int32),
      label=np.empty(count, np.float32),
    )
    record = int(np.searchsorted(self._first_row, start, side='right')) - 1
    done = 0
    while done < count:
      offset = start + done - int(self._first_row[record])
      take = min(count - done, int(self._rows_R[record]) - offset)
      label, dense, sparse = self._block(record)
      batch.label[done : done + take] = label[offset : offset + take]
      batch.dense[done : done + take] = dense[offset : offset + take]
      batch.sparse[done : done + take] = sparse[offset : offset + take]
      done += take
      record += 1
    return batch

  def true_probability(self, start: int, count: int) -> np.ndarray | None:
    """float32 [count]: the generator's click probabilities of the rows, or None (real data)."""
    self._check_range(start, count)
    return None if self._p_true is None else np.asarray(self._p_true[start : start + count])

  def _check_range(self, start: int, count: int) -> None:
    if start < 0 or count < 0 or start + count > len(self):
      raise ValueError(
        f'{self.version_dir} ({self.split}): cannot read rows [{start}, {start + count}) of {len(self)}.'
      )

  def _block(self, record: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The decoded block; a block another thread is decoding is waited for, not decoded again."""
    with self._lock:
      entry = self._cache.get(record)
      owner = entry is None
      if owner:
        entry = self._cache[record] = _Decoded()
        while len(self._cache) > self._cached_blocks:
          self._cache.popitem(last=False)
      else:
        self._cache.move_to_end(record)
    if owner:
      try:
        entry.arrays = records.decode(self._records[record])
        self.blocks_decoded += 1
      finally:
        if entry.arrays is None:  # Failed: the next reader tries again.
          with self._lock:
            self._cache.pop(record, None)
        entry.ready.set()
    entry.ready.wait()
    if entry.arrays is None:
      raise RuntimeError(f'{self.version_dir}: decoding record {record} failed in another thread.')
    if len(entry.arrays[0]) != self._rows_R[record]:
      raise ValueError(
        f'{self.version_dir}: record {record} holds {len(entry.arrays[0])} rows; the manifest says '
        f'{self._rows_R[record]}.'
      )
    return entry.arrays


class _Decoded:
  """A cache entry: set once by the thread that decodes it; others wait on `ready`."""

  def __init__(self):
    self.ready, self.arrays = threading.Event(), None


class _Records:
  """The records of a split's shards, in order, by index (thread-safe: array_record's reader is, and each shard's
  is opened once). A reader's file buffer holds a whole record, so a record is read in one go."""

  def __init__(self, paths: list[str], record_bytes: int):
    self._paths = paths
    self._buffer_bytes = 1 << max(16, int(1.5 * record_bytes) - 1).bit_length()  # A power of two, >= 1.5 records.
    self._readers = [self._open(path) for path in paths]
    self._first = np.concatenate([[0], np.cumsum([reader.num_records() for reader in self._readers])])

  def _open(self, path: str):
    reader = array_record_module.ArrayRecordReader(
      path, options='readahead_buffer_size:0', file_reader_buffer_size=self._buffer_bytes
    )
    if not reader.ok():
      raise OSError(f'{path}: array_record cannot read it.')
    return reader

  def __len__(self) -> int:
    return int(self._first[-1])

  def __getitem__(self, record: int) -> bytes:
    shard = int(np.searchsorted(self._first, record, side='right')) - 1
    return self._readers[shard].read([record - int(self._first[shard])])[0]
