"""A split of a prepared dataset as a random-access source of `Batch`es, read through grain.

  source = source_lib.PreparedSource(version_dir, 'train')     # version_dir: manifest.find(config.data.prepared_dir)
  len(source)                      # rows of the split
  batch = source.read(1000, 256)   # rows 1000..1255 of the split, in stream order
  p = source.true_probability(0, 256)   # generated inputs: the teacher's probabilities; otherwise None

It plugs into `input_pipeline.train_batches` like the synthetic and TSV sources, which gives each process its own
replicas' rows, in stream order, resumable at any step. The shards are read with grain's `ArrayRecordDataSource`
(array_record releases the GIL while it reads and decompresses, so the pipeline's prefetch threads use several
cores) and each record is decoded as a whole block (`records.decode`). Consecutive steps and the prefetch threads
ask for the same block, so the last decoded blocks (`CACHED_ROWS`) are kept and a block wanted by two threads at
once is decoded once. A process whose share of a step is smaller than a block still decodes the whole block: with P
processes each decodes up to P times its own rows, which is why blocks are stored uncompressed by default
(`prepare.DEFAULT_COMPRESSION`; docs/studies/criteo.md).
"""

import collections
import os
import threading

import grain
import numpy as np

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.prepared import manifest as manifest_lib
from shadowsync_jax.data.prepared import records

# Decoded blocks kept: the pipeline's prefetch threads read a few groups of steps at once, and a block that one of
# them still needs must not be dropped; 64k rows (10 MB) covers them at any block size.
CACHED_ROWS = 1 << 16


class PreparedSource:
  """Rows of one split of a prepared dataset (thread-safe)."""

  def __init__(self, version_dir: str, split: str):
    self.version_dir, self.split = version_dir, split
    self.manifest = manifest_lib.read(version_dir)
    shards = manifest_lib.shards(self.manifest, split)
    self._rows_R = np.asarray([rows for shard in shards for rows in shard['rows_per_record']], np.int64)
    self._first_row = np.concatenate([[0], np.cumsum(self._rows_R)])
    paths = [os.path.join(version_dir, shard['file']) for shard in shards]
    self._records = grain.sources.ArrayRecordDataSource(paths) if paths else []
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
