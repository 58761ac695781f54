"""Criteo TSV files (Kaggle / Terabyte layout) as one random-access source of `Batch`es, parsed as it is read.

  source = source_lib.CriteoSource(['day_0', 'day_1'], cardinalities=(100_000,) * 26)  # indexes the line offsets
  len(source)                       # rows of all files, in order
  batch = source.read(1000, 256)    # rows 1000..1255 (0-based) of the concatenation, parsed (`parse.parse_rows`)
  p = source.true_probability(0, 256)   # generated files: the teacher's click probabilities; otherwise None

It keeps the byte offset of every line (8 bytes a row: 35 GB for Terabyte) and parses every read, so it suits
files of a few GB; at the real sizes, prepare the files once (`data.prepared`). Gzip files cannot be read at random
and are refused. Malformed input raises `parse.CriteoFormatError` naming the file and the 1-based line.
"""

from collections.abc import Sequence
import os

import numpy as np

from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.criteo import parse

_INDEX_BLOCK_BYTES = 1 << 24


def index_lines(path: str) -> np.ndarray:
  """int64 [rows + 1]: byte offset of each line's start, then the end of the last line."""
  if not os.path.exists(path):
    raise FileNotFoundError(f'Criteo file {path!r} does not exist.')
  if files.is_gzip(path):
    raise ValueError(
      f'{path} is gzip-compressed and cannot be read at random; prepare it once '
      '(python -m experiments.prepare_criteo) and train with data.source=prepared.'
    )
  newlines, position = [], 0
  with open(path, 'rb') as f:
    while block := f.read(_INDEX_BLOCK_BYTES):
      newlines.append(np.flatnonzero(np.frombuffer(block, np.uint8) == ord('\n')) + position)
      position += len(block)
  if position == 0:
    raise parse.CriteoFormatError(path, None, 'empty', 'the file is empty; expected Criteo TSV rows.')
  ends = np.concatenate(newlines) + 1
  if ends.size == 0 or ends[-1] != position:  # The last line has no trailing newline.
    ends = np.append(ends, position)
  return np.concatenate([[0], ends]).astype(np.int64)


class CriteoSource:
  """Rows of Criteo TSV files, in file order, read by index range (thread-safe: every read opens the file)."""

  def __init__(self, paths: str | Sequence[str], cardinalities: tuple[int, ...]):
    if len(cardinalities) != NUM_SPARSE_FEATURES or min(cardinalities) < 1:
      raise ValueError(f'cardinalities must be {NUM_SPARSE_FEATURES} positive ints, got {cardinalities}.')
    self.paths = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    self.cardinalities = tuple(int(c) for c in cardinalities)
    self._offsets = [index_lines(path) for path in self.paths]
    self._first_row = np.cumsum([0] + [len(offsets) - 1 for offsets in self._offsets])
    self._p_true = [_true_probabilities(path, len(offsets) - 1) for path, offsets in zip(self.paths, self._offsets)]

  def __len__(self) -> int:
    return int(self._first_row[-1])

  @property
  def file_rows(self) -> list[int]:
    """Rows of each file, in order."""
    return [len(offsets) - 1 for offsets in self._offsets]

  def read(self, start: int, count: int) -> Batch:
    """Rows [start, start + count) (0-based, across the files), parsed and transformed."""
    self._check_range(start, count)
    parts = [self._read_file(i, first, n) for i, first, n in self._pieces(start, count)]
    if not parts:
      return parse.empty_batch()
    return parts[0] if len(parts) == 1 else Batch(*(np.concatenate(field) for field in zip(*parts)))

  def true_probability(self, start: int, count: int) -> np.ndarray | None:
    """float32 [count]: the click probabilities a generated file keeps beside it (`generate`); None when a file
    read has none (real data)."""
    self._check_range(start, count)
    pieces = list(self._pieces(start, count))
    if any(self._p_true[i] is None for i, _, _ in pieces):
      return None
    return np.concatenate([np.zeros(0, np.float32), *(self._p_true[i][first : first + n] for i, first, n in pieces)])

  def _check_range(self, start: int, count: int) -> None:
    if start < 0 or count < 0 or start + count > len(self):
      files_named = self.paths[0] if len(self.paths) == 1 else f'{self.paths[0]} .. {self.paths[-1]}'
      raise ValueError(f'{files_named}: cannot read rows [{start}, {start + count}); there are {len(self)} rows.')

  def _pieces(self, start: int, count: int):
    """(file index, first row in the file, rows) of the files that rows [start, start + count) touch."""
    end = start + count
    for i in range(len(self.paths)):
      first, last = max(start, self._first_row[i]), min(end, self._first_row[i + 1])
      if first < last:
        yield i, int(first - self._first_row[i]), int(last - first)

  def _read_file(self, index: int, first: int, count: int) -> Batch:
    offsets = self._offsets[index]
    with open(self.paths[index], 'rb') as f:
      f.seek(offsets[first])
      data = f.read(offsets[first + count] - offsets[first])
    return parse.parse_rows(data, self.cardinalities, self.paths[index], first_line=first + 1)


def _true_probabilities(path: str, rows: int) -> np.ndarray | None:
  """The generator's float32 probabilities of `path`'s rows (memory-mapped), or None when there are none."""
  sidecar = files.true_probability_path(path)
  if not os.path.exists(sidecar):
    return None
  p_true = np.load(sidecar, mmap_mode='r')
  if p_true.shape != (rows,):
    raise ValueError(f'{sidecar} holds {p_true.shape[0]} probabilities for the {rows} rows of {path}.')
  return p_true
