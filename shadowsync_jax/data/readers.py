"""Reading ranges of a stream side by side: in the caller, in threads, or in processes of their own.

  readers = readers.make(source, count=8, processes=True)        # or readers.Serial(source)
  a, b = readers.read_ranges([(0, 4096), (8192, 4096)])           # Batches of examples [0, 4096) and [8192, 12288)
  flat = readers.read_range(0, 1_000_000)                         # one range, split in pieces read side by side
  readers.close()

A block of the training stream (`input_pipeline.read_block`) is read through one of these. The synthetic stream's
generator is numpy work in chunks of a few thousand examples, so threads scale only until the GIL between its calls
binds: on a 16-core host 4 threads read the default stream ~2.2x faster than one and 8 no faster (BUILD.md, the GPU
section). Processes have a GIL each: a process reader holds the source (sent once, pickled: 11 MB for Criteo Kaggle's
cardinalities) and writes its pieces straight into shared memory, from which the caller copies the block it
assembles; nothing else crosses between processes. Pieces are what a reader reads at once: `MIN_PIECE` to
`MAX_PIECE` examples. The values never depend on how a range is read (every source is a pure function of the
example index).
"""

from collections.abc import Iterator, Sequence
from concurrent import futures
import contextlib
import multiprocessing
from multiprocessing import shared_memory
import os
import pickle
import queue
import sys
import traceback
from typing import Any

import numpy as np

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.stream_slice import Source

MIN_PIECE = 4096  # Examples a reader reads at once, at least,
MAX_PIECE = 65_536  # and at most: a reader that closes waits for one piece, not a whole block.
MAX_READERS = 8  # What 'auto' chooses at most.
_FIELDS = ((NUM_DENSE_FEATURES, np.float32), (NUM_SPARSE_FEATURES, np.int32), (0, np.float32))  # dense, sparse, label
_BYTES_PER_EXAMPLE = sum(max(width, 1) * np.dtype(dtype).itemsize for width, dtype in _FIELDS)


def count(setting: int | str) -> int:
  """`data.readers`: a count, or 'auto': one a core this process may run on, less one for the loop (at least 1, at
  most `MAX_READERS`): 1 on a 2-core machine, where the step takes the other core."""
  if setting != 'auto':
    return int(setting)
  return max(1, min(MAX_READERS, len(os.sched_getaffinity(0)) - 1))


def pieces(start: int, count_: int, readers: int) -> list[tuple[int, int]]:
  """[start, start + count_) as (start, count) pieces of `MIN_PIECE` to `MAX_PIECE` examples, as many as `readers`
  where the range is long enough."""
  number = max(1, min(readers, count_ // MIN_PIECE), -(-count_ // MAX_PIECE))
  bounds = np.linspace(start, start + count_, number + 1).astype(np.int64)
  return [(int(a), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:])]


class Serial:
  """Every range read in the caller, in order."""

  readers = 1

  def __init__(self, source: Source):
    self._source = source

  def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[Batch]:
    return [self._source.read(start, n) for start, n in ranges]

  def read_range(self, start: int, count_: int) -> Batch:
    return self._source.read(start, count_)

  def close(self) -> None:
    pass


class Threads(Serial):
  """Ranges read by `readers` threads side by side."""

  def __init__(self, source: Source, readers: int):
    super().__init__(source)
    self.readers = readers
    self._pool = futures.ThreadPoolExecutor(readers, thread_name_prefix='reader')

  def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[Batch]:
    return list(self._pool.map(lambda r: self._source.read(*r), ranges))

  def read_range(self, start: int, count_: int) -> Batch:
    parts = self.read_ranges(pieces(start, count_, self.readers))
    return parts[0] if len(parts) == 1 else Batch(*(np.concatenate(fields) for fields in zip(*parts)))

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)


class Processes(Serial):
  """Ranges read by `readers` spawned processes into shared memory (module docstring). The Batches returned are
  views of that memory, valid until the next read: the caller copies what it keeps. A reader that fails raises its
  error here, with its traceback; one that dies is named."""

  def __init__(self, source: Source, readers: int, source_bytes: bytes | None = None):
    """`source_bytes`: `source` pickled, where the caller has it already."""
    super().__init__(source)
    self.readers = readers
    context = multiprocessing.get_context('spawn')  # Never forked: the caller has started JAX's threads.
    self._tasks, self._done = context.Queue(), context.Queue()
    source_bytes = source_bytes or _pickled(source)
    with _main_module_hidden():
      self._processes = [
        context.Process(target=_reader, args=(source_bytes, self._tasks, self._done), daemon=True, name=f'reader-{i}')
        for i in range(readers)
      ]
      for process in self._processes:
        process.start()
    self._memory: shared_memory.SharedMemory | None = None
    self._capacity = 0

  def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[Batch]:
    total = sum(n for _, n in ranges)
    if total > self._capacity:
      self._allocate(total)
    offsets = np.cumsum([0] + [n for _, n in ranges])
    for offset, (start, n) in zip(offsets, ranges):
      self._tasks.put((self._memory.name, self._capacity, int(offset), start, n))
    for _ in ranges:
      self._wait_for_one()
    whole = _views(self._memory.buf, self._capacity)
    return [Batch(*(field[a:b] for field in whole)) for a, b in zip(offsets[:-1], offsets[1:])]

  def read_range(self, start: int, count_: int) -> Batch:
    self.read_ranges(pieces(start, count_, self.readers))  # Written one after the other from the memory's start.
    return Batch(*(field[:count_] for field in _views(self._memory.buf, self._capacity)))

  def close(self) -> None:
    for _ in self._processes:
      self._tasks.put(None)
    for process in self._processes:
      process.join(timeout=5)
      if process.is_alive():
        process.terminate()
    self._tasks.cancel_join_thread()
    self._release()

  def _wait_for_one(self) -> None:
    while True:
      try:
        error = self._done.get(timeout=1.0)
      except queue.Empty:
        dead = [p for p in self._processes if not p.is_alive()]
        if dead:
          raise RuntimeError(f'reader process {dead[0].name} died (exit code {dead[0].exitcode}).') from None
        continue
      if error is not None:
        raise RuntimeError(f'a reader process failed:\n{error}')
      return

  def _allocate(self, examples: int) -> None:
    self._release()
    self._capacity = max(examples, MAX_PIECE)
    self._memory = shared_memory.SharedMemory(create=True, size=self._capacity * _BYTES_PER_EXAMPLE)

  def _release(self) -> None:
    if self._memory is not None:
      self._memory.close()
      self._memory.unlink()
      self._memory, self._capacity = None, 0


def make(source: Source, readers: int, processes: bool | str = 'auto') -> Serial:
  """Readers of `source`: `Serial` for one, else `Processes` where `processes` says so ('auto': where the source can
  be sent to a process, as the synthetic stream can), else `Threads`."""
  if readers <= 1:
    return Serial(source)
  if processes is False:
    return Threads(source, readers)
  source_bytes = _pickled(source)
  if source_bytes is None and processes == 'auto':
    return Threads(source, readers)
  return Processes(source, readers, source_bytes)


def _pickled(source: Source) -> bytes | None:
  """`source` pickled, or None where it cannot be (file handles, readers of a prepared dataset, locks)."""
  try:
    return pickle.dumps(source, protocol=pickle.HIGHEST_PROTOCOL)
  except Exception:  # pylint: disable=broad-except
    return None


def _views(buffer: Any, capacity: int) -> Batch:
  """dense [capacity, 13], sparse [capacity, 26], label [capacity] laid one after the other in `buffer`."""
  fields, offset = [], 0
  for width, dtype in _FIELDS:
    shape = (capacity, width) if width else (capacity,)
    fields.append(np.ndarray(shape, dtype, buffer=buffer, offset=offset))
    offset += capacity * max(width, 1) * np.dtype(dtype).itemsize
  return Batch(*fields)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
  """While reader processes start: spawn would import the caller's main module in each (`python -m
  experiments.train`: the whole binary, JAX included, ~200 MB a reader; a script without a `__main__` guard would
  start itself again). A reader needs only the source's modules, which unpickling it imports."""
  main = sys.modules['__main__']
  saved = {name: main.__dict__[name] for name in ('__spec__', '__file__') if name in main.__dict__}
  main.__spec__ = None
  main.__dict__.pop('__file__', None)
  try:
    yield
  finally:
    main.__dict__.update(saved)


def _reader(source_bytes: bytes, tasks: Any, done: Any) -> None:
  """A reader process: reads the ranges it is given into the shared memory they name, until told to stop (None) or
  its parent is gone."""
  import threadpoolctl  # pylint: disable=g-import-not-at-top  (this process's own BLAS: one thread)

  threadpoolctl.threadpool_limits(limits=1, user_api='blas')
  source, memory, parent = pickle.loads(source_bytes), None, os.getppid()
  while True:
    try:
      task = tasks.get(timeout=1.0)
    except queue.Empty:
      if os.getppid() != parent:
        return
      continue
    if task is None:
      break
    name, capacity, offset, start, n = task
    try:
      if memory is None or memory.name != name:
        if memory is not None:
          memory.close()
        # Attached, not owned: the caller unlinks it (a spawned process shares the caller's resource tracker, which
        # unlinks what is left only when the caller ends).
        memory = shared_memory.SharedMemory(name=name)
      for into, field in zip(_views(memory.buf, capacity), source.read(start, n)):
        into[offset : offset + n] = field
      done.put(None)
    except Exception:  # pylint: disable=broad-except  (raised in the caller, with this traceback)
      done.put(traceback.format_exc())
  if memory is not None:
    memory.close()
