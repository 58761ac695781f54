"""A stretch of a stream renumbered from 0 (the training stream, the held-out set), its ids checked against the
tables. Apart from `input_pipeline` (which names it too) so that a reader process that unpickles one imports numpy and
its source, not grain and JAX (`readers.Processes`).

  train = StreamSlice(source, offset=0, length=2_000_000, cardinalities=(1000,) * 26)
  batch = train.read(0, 256)       # examples [0, 256) of the slice; an id past its table raises ValueError
"""

from typing import Protocol

import numpy as np

from shadowsync_jax.data.batch import Batch


class Source(Protocol):
  """Anything that reads examples [start, start + count) of a stream: SyntheticSource, CriteoSource, PreparedSource,
  StreamSlice."""

  def read(self, start: int, count: int) -> Batch: ...


class StreamSlice:
  """Examples [offset, offset + length) of `source`, renumbered from 0 (the training stream, the held-out set).

  With `cardinalities`, every read checks its ids against the tables' rows: an id past its table would read
  (and train) some other row, or memory past the table (`check_ids`)."""

  def __init__(self, source: Source, offset: int, length: int, cardinalities: tuple[int, ...] | None = None):
    self.source, self.offset, self.length = source, offset, length
    self._rows_T = None if cardinalities is None else np.asarray(cardinalities, np.int64)

  def __len__(self) -> int:
    return self.length

  def read(self, start: int, count: int) -> Batch:
    self._check_range(start, count)
    batch = self.source.read(self.offset + start, count)
    if self._rows_T is not None:
      check_ids(batch.sparse, self._rows_T, self.offset + start)
    return batch

  def true_probability(self, start: int, count: int) -> np.ndarray | None:
    """The true click probabilities where the source knows them (synthetic data, generated files), else None."""
    if not hasattr(self.source, 'true_probability'):
      return None
    self._check_range(start, count)
    return self.source.true_probability(self.offset + start, count)

  def _check_range(self, start: int, count: int) -> None:
    if start < 0 or count < 0 or start + count > self.length:
      raise ValueError(f'cannot read examples [{start}, {start + count}) of a stream of {self.length}.')


def check_ids(sparse_NxT: np.ndarray, rows_T: np.ndarray, first_example: int) -> None:
  """Raises ValueError naming the first id outside [0, rows of its table) and where it is."""
  bad_NxT = (sparse_NxT < 0) | (sparse_NxT >= rows_T)
  if not bad_NxT.any():
    return
  example, table = np.argwhere(bad_NxT)[0]
  raise ValueError(
    f'example {first_example + example} of the data has id {sparse_NxT[example, table]} in table {table} '
    f'(C{table + 1}), which has {rows_T[table]} rows (data.cardinalities[{table}]): the data and '
    'data.cardinalities disagree (data prepared or generated with other cardinalities?).'
  )


class InMemory:
  """The first `length` examples of `source` read into memory once, then served from there (`data.in_memory`): the
  loop without the stream's reading. Not sent to reader processes (a copy each): read by threads."""

  def __init__(self, source: Source, length: int):
    self._whole = source.read(0, length)

  def read(self, start: int, count: int) -> Batch:
    return Batch(*(field[start : start + count] for field in self._whole))

  def __getstate__(self):
    raise TypeError('a stream held in memory is read in its own process (`readers.make` takes threads for it).')
