"""Criteo Kaggle / Terabyte click logs (TSV) as a random-access source of `Batch`es.

  source = criteo.CriteoSource('train.txt', cardinalities=(100_000,) * 26)   # indexes the line offsets once
  len(source)                     # rows in the file
  batch = source.read(1000, 256)  # rows 1000..1255 (0-based), parsed: Batch of numpy arrays

Layout of every line: 40 tab-separated columns, no header: the label (0/1), I1..I13 (integer counts, may be
negative, empty = missing), C1..C26 (hexadecimal category hashes, typically 8 digits, empty = missing).
Transform, as the DLRM reference (facebookresearch/dlrm, data_utils.py) does it:
  - dense: log(1 + max(x, 0)); missing = 0 (the same value as a count of 0);
  - categorical: int(hex, 16) % cardinalities[t]: the raw values are already hashes, so a modulo spreads them
    evenly over the table (collisions are the price of a fixed table size); missing = id 0.
Malformed input raises `CriteoFormatError` naming the file and the 1-based line; nothing is silently replaced.
"""

import os

import numpy as np

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch

NUM_COLUMNS = 1 + NUM_DENSE_FEATURES + NUM_SPARSE_FEATURES
_INDEX_BLOCK_BYTES = 1 << 24
_MAX_HEX_DIGITS = 16  # Fits uint64; real Criteo categories have 8.
_INVALID = 0xFF  # Nibble code of a byte that is not a hex digit.


class CriteoFormatError(ValueError):
  """A Criteo file that cannot be read as such; the message names the file and the 1-based line."""


def _hex_nibbles() -> np.ndarray:
  """Lookup table: ASCII byte -> its hex digit value, or _INVALID."""
  table = np.full(256, _INVALID, np.uint8)
  for digit, chars in enumerate(zip('0123456789abcdef', '0123456789ABCDEF')):
    for char in chars:
      table[ord(char)] = digit
  return table


_NIBBLE = _hex_nibbles()


def index_lines(path: str) -> np.ndarray:
  """int64 [rows + 1]: byte offset of each line's start, then the end of the last line."""
  if not os.path.exists(path):
    raise FileNotFoundError(f'Criteo file {path!r} does not exist.')
  newlines, position = [], 0
  with open(path, 'rb') as f:
    while block := f.read(_INDEX_BLOCK_BYTES):
      newlines.append(np.flatnonzero(np.frombuffer(block, np.uint8) == ord('\n')) + position)
      position += len(block)
  if position == 0:
    raise CriteoFormatError(f'{path}: the file is empty; expected Criteo TSV rows.')
  ends = np.concatenate(newlines) + 1
  if ends.size == 0 or ends[-1] != position:  # The last line has no trailing newline.
    ends = np.append(ends, position)
  return np.concatenate([[0], ends]).astype(np.int64)


class CriteoSource:
  """Rows of one Criteo TSV file, read by index range (thread-safe: every read opens the file)."""

  def __init__(self, path: str, cardinalities: tuple[int, ...]):
    if len(cardinalities) != NUM_SPARSE_FEATURES or min(cardinalities) < 1:
      raise ValueError(f'cardinalities must be {NUM_SPARSE_FEATURES} positive ints, got {cardinalities}.')
    self.path = str(path)
    self.cardinalities = tuple(int(c) for c in cardinalities)
    self._offsets = index_lines(self.path)

  def __len__(self) -> int:
    return len(self._offsets) - 1

  def read(self, start: int, count: int) -> Batch:
    """Rows [start, start + count) (0-based), parsed and transformed."""
    if start < 0 or count < 0 or start + count > len(self):
      raise ValueError(f'{self.path}: cannot read rows [{start}, {start + count}); the file has {len(self)} rows.')
    with open(self.path, 'rb') as f:
      f.seek(self._offsets[start])
      data = f.read(self._offsets[start + count] - self._offsets[start])
    return parse_rows(data, self.cardinalities, self.path, first_line=start + 1)


def parse_rows(data: bytes, cardinalities: tuple[int, ...], path: str, first_line: int) -> Batch:
  """Parses whole TSV lines into a Batch, vectorized over bytes; `first_line` is the 1-based line of the first."""
  if not data:
    return Batch(
      dense=np.zeros((0, NUM_DENSE_FEATURES), np.float32),
      sparse=np.zeros((0, NUM_SPARSE_FEATURES), np.int32),
      label=np.zeros(0, np.float32),
    )
  data = data.replace(b'\r\n', b'\n')
  if not data.endswith(b'\n'):
    data += b'\n'
  buffer = np.frombuffer(data, np.uint8)
  start_NxC, length_NxC = _field_bounds(buffer, path, first_line)
  label_N = _parse_labels(buffer, start_NxC[:, 0], length_NxC[:, 0], path, first_line)
  dense = slice(1, 1 + NUM_DENSE_FEATURES)
  count_NxF = _parse_counts(buffer, start_NxC[:, dense], length_NxC[:, dense], path, first_line)
  sparse = slice(1 + NUM_DENSE_FEATURES, NUM_COLUMNS)
  hash_NxT = _parse_hex(buffer, start_NxC[:, sparse], length_NxC[:, sparse], path, first_line)
  return Batch(
    dense=np.log1p(np.maximum(count_NxF, 0)).astype(np.float32),
    sparse=(hash_NxT % np.asarray(cardinalities, np.uint64)).astype(np.int32),
    label=label_N,
  )


def _field_bounds(buffer: np.ndarray, path: str, first_line: int) -> tuple[np.ndarray, np.ndarray]:
  """Start offset and length of every field, int64 [N, 40]; checks that every line has 40 columns."""
  is_tab, line_end_N = buffer == ord('\t'), np.flatnonzero(buffer == ord('\n'))
  tabs_before_end_N = np.searchsorted(np.flatnonzero(is_tab), line_end_N)
  columns_N = np.diff(tabs_before_end_N, prepend=0) + 1
  bad = np.flatnonzero(columns_N != NUM_COLUMNS)
  if bad.size:
    raise CriteoFormatError(
      f'{path}:{first_line + bad[0]}: expected {NUM_COLUMNS} tab-separated columns, found {columns_N[bad[0]]}.'
    )
  field_end = np.flatnonzero(is_tab | (buffer == ord('\n'))).reshape(-1, NUM_COLUMNS)
  field_start = np.concatenate([[0], field_end.ravel()[:-1] + 1]).reshape(-1, NUM_COLUMNS)
  return field_start, field_end - field_start


def _field_bytes(buffer: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The bytes of each field left-aligned in a [..., W] array (W = longest field) and the mask of real bytes."""
  width = max(int(length.max(initial=0)), 1)
  position = np.arange(width)
  index = np.minimum(start[..., None] + position, buffer.size - 1)
  return buffer[index], position < length[..., None]


def _first_bad(bad: np.ndarray) -> tuple[int, int]:
  row, column = np.unravel_index(np.flatnonzero(bad.ravel())[0], bad.shape)
  return int(row), int(column)


def _field_text(buffer: np.ndarray, start: int, length: int) -> str:
  return repr(buffer[start : start + length].tobytes().decode('utf-8', 'replace'))


def _parse_labels(
  buffer: np.ndarray, start_N: np.ndarray, length_N: np.ndarray, path: str, first_line: int
) -> np.ndarray:
  first_byte_N = buffer[start_N]
  bad = np.flatnonzero((length_N != 1) | ((first_byte_N != ord('0')) & (first_byte_N != ord('1'))))
  if bad.size:
    i = bad[0]
    raise CriteoFormatError(
      f'{path}:{first_line + i}: the label must be 0 or 1, found {_field_text(buffer, start_N[i], length_N[i])}.'
    )
  return (first_byte_N == ord('1')).astype(np.float32)


def _parse_counts(
  buffer: np.ndarray, start_NxF: np.ndarray, length_NxF: np.ndarray, path: str, first_line: int
) -> np.ndarray:
  """Decimal integers (optional leading '-'), int64 [N, F]; empty (missing) -> 0."""
  text_NxFxW, present_NxFxW = _field_bytes(buffer, start_NxF, length_NxF)
  negative_NxF = (text_NxFxW[..., 0] == ord('-')) & (length_NxF > 0)
  digit_NxFxW = text_NxFxW.astype(np.int64) - ord('0')
  is_digit = (digit_NxFxW >= 0) & (digit_NxFxW <= 9)
  is_digit[..., 0] |= negative_NxF
  num_digits_NxF = length_NxF - negative_NxF
  bad = np.any(present_NxFxW & ~is_digit, axis=-1) | (negative_NxF & (num_digits_NxF == 0)) | (num_digits_NxF > 18)
  if bad.any():
    row, feature = _first_bad(bad)
    raise CriteoFormatError(
      f'{path}:{first_line + row}: dense feature I{feature + 1} must be an integer, found '
      f'{_field_text(buffer, start_NxF[row, feature], length_NxF[row, feature])}.'
    )
  value_NxF = np.zeros(start_NxF.shape, np.int64)
  for position in range(digit_NxFxW.shape[-1]):
    use = present_NxFxW[..., position] & ~(negative_NxF & (position == 0))
    value_NxF = np.where(use, value_NxF * 10 + digit_NxFxW[..., position], value_NxF)
  return np.where(negative_NxF, -value_NxF, value_NxF)


def _parse_hex(
  buffer: np.ndarray, start_NxT: np.ndarray, length_NxT: np.ndarray, path: str, first_line: int
) -> np.ndarray:
  """Hexadecimal values (up to 16 digits), uint64 [N, T]; empty (missing) -> 0."""
  text_NxTxW, present_NxTxW = _field_bytes(buffer, start_NxT, length_NxT)
  nibble_NxTxW = _NIBBLE[text_NxTxW]
  bad = np.any(present_NxTxW & (nibble_NxTxW > 15), axis=-1) | (length_NxT > _MAX_HEX_DIGITS)
  if bad.any():
    row, table = _first_bad(bad)
    raise CriteoFormatError(
      f'{path}:{first_line + row}: category C{table + 1} must be hexadecimal (at most '
      f'{_MAX_HEX_DIGITS} digits), found '
      f'{_field_text(buffer, start_NxT[row, table], length_NxT[row, table])}.'
    )
  value_NxT = np.zeros(start_NxT.shape, np.uint64)
  for position in range(nibble_NxTxW.shape[-1]):
    shifted = (value_NxT << np.uint64(4)) | nibble_NxTxW[..., position].astype(np.uint64)
    value_NxT = np.where(present_NxTxW[..., position], shifted, value_NxT)
  return value_NxT
