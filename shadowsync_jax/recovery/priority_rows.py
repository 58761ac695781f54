"""CPR-MFU and CPR-SSU: count embedding row lookups and save the most used rows more often than full checkpoints.

  saver = priority_rows.PrioritySaver(workdir / 'priority_rows', cardinalities, fraction=0.1,
                                      sample_rate=None, seed=0,    # None: MFU (exact counts); 0.05: SSU
                                      max_bytes=64 << 20, bytes_per_row=restore.bytes_per_row(state_L))
  saver.count(batch.sparse)                    # every step: per-table ids [..., T] of the batch (counted async)
  saver.save(step, rows)                       # every few steps: rows {'table': [R, V, D], ...} -> top rows, async
  saved = saver.latest()                       # (step, rows_K, {'table': [R, K, D], ...}) of the newest save
  saver.close()

  # Row-sharded tables: this process's shards [first, first + L) of `layout`, each device `rows_held` local rows.
  saver = priority_rows.PrioritySaver(..., shards=priority_rows.HeldShards(layout, first, L, rows_held))
  saver.save(step, rows)                       # rows {'table': [L, rows_held, D], ...}: each shard's own top rows
  saved = saver.latest()                       # (step, rows_LxK, {'table': [L, K, D], ...}): local rows per shard

Maeng et al., "CPR: Understanding and Improving Failure Tolerant Training for Deep Learning Recommendation with
Partial Recovery" (MLSys 2021, arXiv:2011.02999): under partial recovery a failed embedding shard loses the
updates its rows took since the last checkpoint, and the most used rows took most of them, so saving those rows
more often recovers most of the lost updates for a fraction of the bytes. MFU ranks rows by exact lookup counts;
SSU counts a random sub-sample of the lookups (`row_usage.count_sampled_lookups`), cheaper per step.

Two background threads do the work, as the embedding servers would beside serving lookups: one counts (the loop
hands it the ids of 16 batches at a time: each hand-over wakes the thread, whose numpy work holds the GIL, so
fewer hand-overs disturb the training thread less), one writes. A save takes the rows ranked (`row_usage.top_rows`,
padded with unused rows to a fixed K = floor(fraction * V), fewer where that would write more than `max_bytes`, so
every save has the same shapes) on the counts as of the previous save, which the counter ranked in the meantime, so
that no save waits for counting and the rows do not depend on thread timing; the first save waits for the counts
and ranks them. It gathers the rows on the device (dispatched, not waited for: a copy, so the next step may donate
the table) and hands them to the writer,
which copies them to the host and writes `DIR/<step>.npz` (a temporary file renamed when complete: a process
killed mid-write leaves the previous save). The training thread is blocked only for hand-overs, and while a
thread is behind. With `max_overhead`, a save is due (`due`) only once the last one's ranking and writing, timed in
their threads, are that share of the time since it started: on a host whose cores the training shares (a process
pinned to one core), priority saves every few steps at Criteo Kaggle's size kept these threads busy without pause
and stepped the run 1.5x slower than counting alone. Not orbax: its CheckpointManager is not safe to drive
from a second thread while the training thread saves (concurrent saves were seen to time out on its process-wide
signalling), and its per-save bookkeeping blocks the caller 15-60 ms here, more than writing a few thousand rows.
An error in a thread is raised by the next call. The directory is emptied when a saver is made: saves of an
earlier process may be newer than the checkpoint a resumed run restarts from.

With row-sharded tables (`HeldShards`) a process holds, on each of its L devices, one shard of the concatenated
table (row e on shard e % S as local row e // S: `table_placement.ShardLayout`), and every replica's lookups reach
the shard that owns the row. So it counts the lookups of its shards' rows, whichever replica made them (its saver
sees only its own replicas' batches: a shard's counts are a sample of its rows' use, ranked like SSU's), and each
shard saves its own K = floor(fraction * V / S) most used local rows: `rows` is then [L, K], one row list per
shard, and a restore writes shard l's rows into shard l (`restore.write_rows_per_replica`).
"""

from collections.abc import Callable, Sequence
from concurrent import futures
import os
import pathlib
import queue
import threading
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from shadowsync_jax.model import embedding
from shadowsync_jax.model import table_placement
from shadowsync_jax.recovery import row_usage

PyTree = Any
_BATCHES_PER_HAND_OVER = 16
# Ids counted at a time: `np.add.at` holds the GIL throughout, so between pieces the counter lets the training
# thread have it (16 batches at once held it ~14 ms at Criteo Kaggle's size, each time the loop had just handed them
# over: its boundary work right then took 21 ms instead of 7.5 in a test on one core, 15 in pieces of 1/16).
_IDS_AT_A_TIME = 1 << 16


def fixed_size_top_rows(counts_V: np.ndarray, num_rows: int) -> np.ndarray:
  """The `num_rows` most counted rows, ascending: `row_usage.top_rows`, then the lowest unused ids to fill up."""
  counts_V = np.asarray(counts_V)
  top = row_usage.top_rows(counts_V, min(1.0, (num_rows + 0.5) / counts_V.shape[0]))  # floor(): num_rows
  if top.shape[0] < num_rows:
    # The lowest unused ids lie below num_rows: at most len(top) ids there are used.
    unused = np.setdiff1d(np.arange(min(num_rows, counts_V.shape[0]), dtype=np.int32), top, assume_unique=True)
    top = np.sort(np.concatenate([top, unused[: num_rows - top.shape[0]]])).astype(np.int32)
  return top


class HeldShards(NamedTuple):
  """The shards of a row-sharded table one process holds: shards [first, first + count) of `layout`, each device
  `rows_held` local rows (its shard's rows, padded)."""

  layout: table_placement.ShardLayout
  first: int
  count: int
  rows_held: int

  def local_index(self, row_ids: np.ndarray) -> np.ndarray:
    """Rows of the concatenated table -> index into this process's shards laid end to end (shard-major): -1 for a
    row another process holds."""
    shard = self.layout.shard_of(row_ids) - self.first
    mine = (shard >= 0) & (shard < self.count)
    return np.where(mine, shard * self.rows_held + self.layout.local_row(row_ids), -1)


class _Worker:
  """One thread that handles the items put to it in order; its first error is raised by `put` and `join`."""

  def __init__(self, name: str, handle: Callable[[Any], None], max_pending: int):
    self._handle = handle
    self._items: queue.Queue = queue.Queue(maxsize=max_pending)
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._run, name=name, daemon=True)
    self._thread.start()

  def put(self, item: Any) -> None:
    self.raise_if_failed()
    self._items.put(item)  # Waits while the thread is `max_pending` items behind.

  def busy(self) -> bool:
    """Whether an item put is not handled yet (the queue's count, which `join` waits on)."""
    with self._items.mutex:
      return self._items.unfinished_tasks > 0

  def join(self) -> None:
    """Returns when every item put so far is handled."""
    self._items.join()
    self.raise_if_failed()

  def close(self) -> None:
    self._items.put(None)
    self._thread.join()
    self.raise_if_failed()

  def raise_if_failed(self) -> None:
    if self._error is not None:
      raise RuntimeError(f'The {self._thread.name} thread failed.') from self._error

  def _run(self) -> None:
    while True:
      item = self._items.get()
      try:
        if item is None:
          return
        if self._error is not None:
          raise self._error
        self._handle(item)
      except BaseException as error:  # pylint: disable=broad-except  (re-raised in the training thread)
        self._error = self._error or error
        if isinstance(item, futures.Future) and not item.done():  # Whoever waits on it learns of the error.
          item.set_exception(self._error)
      finally:
        self._items.task_done()


class PrioritySaver:
  """Lookup counters of one process and async saves of its most used embedding rows."""

  def __init__(
    self,
    directory: str | pathlib.Path,
    cardinalities: Sequence[int],
    fraction: float,
    sample_rate: float | None,
    seed: int,
    max_to_keep: int = 2,
    shards: HeldShards | None = None,
    max_bytes: int = 0,
    bytes_per_row: int = 0,
    max_overhead: float = 0.0,
  ):
    """`max_bytes` (0: no cap) bounds a save's rows at `bytes_per_row` each (a row of every table leaf saved, over
    every replica or shard held): K = min(floor(fraction * V), max_bytes // bytes_per_row). `max_overhead` (0: none)
    is the share of the time the saves' threads may take (`due`)."""
    self.num_rows = int(sum(cardinalities))
    self._shards = shards
    rows_ranked = self.num_rows if shards is None else shards.layout.rows_per_shard
    self.rows_per_save = int(fraction * rows_ranked)  # Per shard, with `shards`.
    if max_bytes and bytes_per_row:
      self.rows_per_save = min(self.rows_per_save, max(1, max_bytes // bytes_per_row))
    if self.rows_per_save < 1:
      raise ValueError(f'recovery.priority_fraction={fraction} of {rows_ranked} embedding rows is no row.')
    # Written by the counting thread only. Sharded: this process's shards laid end to end.
    self.counts_V = np.zeros(self.num_rows if shards is None else shards.count * shards.rows_held, np.int64)
    self._offsets_T = embedding.table_offsets(cardinalities)
    self._sample_rate = sample_rate
    self._rng = np.random.default_rng([0x55_0C_0A7, seed])
    self._directory = pathlib.Path(directory)
    self._directory.mkdir(parents=True, exist_ok=True)
    for stale in self._directory.glob('*.npz*'):
      stale.unlink()
    self._max_to_keep = max_to_keep
    self._max_overhead = max_overhead
    self._started = -float('inf')  # When the last save started (monotonic seconds).
    self._cost_s = 0.0  # Its ranking and writing, timed in the threads (written there).
    self._uncounted: list[np.ndarray] = []
    self._ranked: futures.Future | None = None
    self._counter = _Worker('lookup-counter', self._count, max_pending=4)
    self._writer = _Worker('priority-rows-writer', self._write, max_pending=1)

  def count(self, sparse_BxT: np.ndarray) -> None:
    """Counts the lookups of a batch's per-table ids (any leading shape), in the background: all of them (MFU) or a
    sample (SSU)."""
    self._uncounted.append(sparse_BxT)
    if len(self._uncounted) == _BATCHES_PER_HAND_OVER:
      self._hand_over()

  def save(self, step: int, rows: dict[str, jax.Array]) -> np.ndarray:
    """Starts saving the top rows of `rows` (leaves [R, V, ...]), ranked on the counts of the previous save (on all
    counts so far at the first save); returns their ids ([K]; with `shards`, [L, K] local rows of each shard)."""
    self._hand_over()
    self._started, self._cost_s = time.monotonic(), 0.0
    if self._ranked is None:
      self._counter.join()
      rows_K = self._top_rows()
    else:
      rows_K = self._ranked.result()
    self._rank_in_background()  # The next save's rows: the counts up to here.
    if self._shards is None:
      values = row_usage.extract_rows(rows, rows_K, row_axis=1)
    else:
      values = row_usage.extract_rows_per_replica(rows, rows_K)
    self._writer.put((step, rows_K, values))
    return rows_K

  def writing(self) -> bool:
    """Whether the last save is still being written (or its rows ranked): a save started now would wait for it."""
    return self._writer.busy() or (self._ranked is not None and not self._ranked.done())

  @property
  def last_cost_s(self) -> float:
    """The last save's ranking and writing, timed in the threads (so far, if it is not done)."""
    return self._cost_s

  def due(self) -> bool:
    """Whether a save may start now: its rows are ranked, the last one is written, and its cost is within
    `max_overhead` of the time since it started. The loop skips a save that is not (`recovery.real`): a priority save
    never piles up behind the one before. With a budget, none waits for a ranking either: the first call of a saver
    starts ranking the counts so far in the background, and says no (at Criteo Kaggle's size a first save ranking
    them in the training thread blocked it 1.2 s, at every restart)."""
    if self._ranked is None and self._max_overhead:
      self._rank_in_background()
      return False
    if self.writing():
      return False
    return not self._max_overhead or time.monotonic() - self._started >= self._cost_s / self._max_overhead

  def _rank_in_background(self) -> None:
    """The counts handed over so far, ranked by the counting thread into `_ranked` (after the batches before)."""
    self._hand_over()
    self._ranked = futures.Future()
    self._counter.put(self._ranked)

  def _top_rows(self) -> np.ndarray:
    """The rows the next save takes: the most counted ones, [K]; with `shards`, each shard's own, [L, K]."""
    if self._shards is None:
      return fixed_size_top_rows(self.counts_V, self.rows_per_save)
    shards, per_shard = self._shards, self._shards.layout.rows_per_shard
    counts_LxV = self.counts_V.reshape(shards.count, shards.rows_held)[:, :per_shard]  # Never a padding row.
    return np.stack([fixed_size_top_rows(counts_V, self.rows_per_save) for counts_V in counts_LxV])

  def wait(self) -> None:
    """Returns when every save handed over is on disk (and the next one's rows are ranked)."""
    self._writer.join()
    self._counter.join()

  def latest(self) -> tuple[int, np.ndarray, dict[str, np.ndarray]] | None:
    """The newest complete save as (step, rows_K, {leaf: [R, K, ...]}), after waiting for pending ones; or None."""
    self.wait()
    return read_latest(self._directory)

  def close(self) -> None:
    self._hand_over()
    self._counter.close()
    self._writer.close()

  def _saved_steps(self) -> list[int]:
    return _saved_steps(self._directory)

  def _hand_over(self) -> None:
    if self._uncounted:
      self._counter.put(self._uncounted)
      self._uncounted = []

  def _count(self, batches: list[np.ndarray] | futures.Future) -> None:
    if isinstance(batches, futures.Future):  # A request to rank the counts so far.
      started = time.perf_counter()
      rows_K = self._top_rows()
      self._cost_s += time.perf_counter() - started
      batches.set_result(rows_K)
      return
    row_ids = np.concatenate([np.asarray(ids).reshape(-1, ids.shape[-1]) for ids in batches]) + self._offsets_T
    if self._shards is not None:
      row_ids = self._shards.local_index(row_ids)
      row_ids = row_ids[row_ids >= 0]
    row_ids = row_ids.reshape(-1)
    for start in range(0, row_ids.size, _IDS_AT_A_TIME):
      piece = row_ids[start : start + _IDS_AT_A_TIME]
      if self._sample_rate is None:
        row_usage.count_lookups(self.counts_V, piece)
      else:
        row_usage.count_sampled_lookups(self.counts_V, piece, self._sample_rate, self._rng)
      time.sleep(0)  # The GIL to a thread that waits for it.

  def _write(self, request: tuple[int, np.ndarray, dict[str, jax.Array]]) -> None:
    step, rows_K, values = request
    jax.block_until_ready(values)  # Behind the block in flight: waiting for it is not this save's cost.
    started = time.perf_counter()
    path = self._directory / f'{step}.npz'
    temporary = path.with_suffix('.npz.tmp')
    with open(temporary, 'wb') as file:
      np.savez(file, rows=rows_K, **jax.device_get(values))
      file.flush()
      os.fsync(file.fileno())
    os.replace(temporary, path)
    for old in self._saved_steps()[: -self._max_to_keep]:
      (self._directory / f'{old}.npz').unlink()
    self._cost_s += time.perf_counter() - started


def read_latest(directory: str | pathlib.Path) -> tuple[int, np.ndarray, dict[str, np.ndarray]] | None:
  """The newest complete save in `directory` as (step, rows_K or rows_LxK, {leaf: [R, K, ...]}), or None: what a
  process that died saved, read before a new saver empties the directory."""
  directory = pathlib.Path(directory)
  steps = _saved_steps(directory) if directory.is_dir() else []
  if not steps:
    return None
  with np.load(directory / f'{steps[-1]}.npz') as saved:
    values = {name: saved[name] for name in saved.files}
  return steps[-1], values.pop('rows'), values


def _saved_steps(directory: pathlib.Path) -> list[int]:
  return sorted(int(path.name.removesuffix('.npz')) for path in directory.glob('*.npz'))
