"""Criteo TSV lines to a `Batch`, vectorized over the bytes of a block of lines.

  batch = parse.parse_rows(data, cardinalities=(100_000,) * 26, path='day_0.gz', first_line=1)
  # data: whole lines (bytes); raises CriteoFormatError(path, line, kind) at the first malformed line

Layout of every line: 40 tab-separated columns, no header: the label (0/1), I1..I13 (integer counts, may be
negative, empty = missing), C1..C26 (hexadecimal category hashes, typically 8 digits, empty = missing).
Transform, as the DLRM reference (facebookresearch/dlrm, data_utils.py) does it:
  - dense: log(1 + max(x, 0)); missing = 0 (the same value as a count of 0);
  - categorical: int(hex, 16) % cardinalities[t]: the raw values are already hashes, so a modulo spreads them
    evenly over the table (collisions are the price of a fixed table size); missing = id 0.

Two paths give the same numbers bit for bit. The fast one reads each field as one or two unaligned 64-bit words
that end at the field's end and decodes them with shifts and masks (SWAR), so there is no loop over digit
positions; it takes blocks whose hex fields are all 8 digits or empty and whose counts have at most 16 digits, which
is all of real Criteo. Any other block, malformed ones included, takes the general path, which reads fields through
right-aligned byte windows and words the error. The problem masks (`label_problems`, `count_problems`,
`hex_problems`) are shared with `malformed`, which skips bad lines instead of stopping.
"""

import numpy as np

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch

NUM_COLUMNS = 1 + NUM_DENSE_FEATURES + NUM_SPARSE_FEATURES
DENSE_COLUMNS = slice(1, 1 + NUM_DENSE_FEATURES)
SPARSE_COLUMNS = slice(1 + NUM_DENSE_FEATURES, NUM_COLUMNS)
# What can be wrong with a line, in the order it is checked; a line is counted under the first that applies.
MALFORMED_KINDS = ('columns', 'label', 'dense', 'categorical')
MAX_COUNT_DIGITS = 18  # Fits int64.
MAX_HEX_DIGITS = 16  # Fits uint64; real Criteo categories have 8.
_INVALID = 0xFF  # Nibble code of a byte that is not a hex digit.
_U64 = np.uint64
_ASCII_ZEROS = _U64(0x3030303030303030)
# _KEEP[L]: the top L bytes of a little-endian word, i.e. the last L characters of the 8 loaded.
_KEEP = np.array([0] + [((1 << (8 * n)) - 1) << (8 * (8 - n)) for n in range(1, 9)], np.uint64)
_POW10_F = 10.0 ** np.arange(15)[::-1]
_POW10_I = 10 ** np.arange(MAX_COUNT_DIGITS + 1, dtype=np.int64)[::-1]
_WORD_PAD = 16  # Zero bytes in front of the buffer, so that the word before any field end exists.


class CriteoFormatError(ValueError):
  """A line that is not Criteo TSV. `path`, `line` (1-based, None for the whole file) and `kind` (one of
  MALFORMED_KINDS, or 'empty') say where and what; the message says it in words."""

  def __init__(self, path: str, line: int | None, kind: str, detail: str):
    self.path, self.line, self.kind, self.detail = path, line, kind, detail
    super().__init__(f'{path}:{line}: {detail}' if line is not None else f'{path}: {detail}')

  def __reduce__(self):  # Crosses process boundaries (the parallel prepare) with its fields.
    return CriteoFormatError, (self.path, self.line, self.kind, self.detail)


def _hex_nibbles() -> np.ndarray:
  """Lookup table: ASCII byte -> its hex digit value, or _INVALID."""
  table = np.full(256, _INVALID, np.uint8)
  for digit, chars in enumerate(zip('0123456789abcdef', '0123456789ABCDEF')):
    for char in chars:
      table[ord(char)] = digit
  return table


NIBBLE = _hex_nibbles()


def empty_batch() -> Batch:
  return Batch(
    dense=np.zeros((0, NUM_DENSE_FEATURES), np.float32),
    sparse=np.zeros((0, NUM_SPARSE_FEATURES), np.int32),
    label=np.zeros(0, np.float32),
  )


def as_lines(data: bytes) -> np.ndarray:
  """uint8 view of `data` with CRLF turned into LF and a final newline ensured."""
  if b'\r' in data:
    data = data.replace(b'\r\n', b'\n')
  if not data.endswith(b'\n'):
    data += b'\n'
  return np.frombuffer(data, np.uint8)


def column_counts(buffer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(columns of every line, positions of every tab and newline) of a buffer that ends with a newline."""
  separators = np.flatnonzero((buffer == ord('\t')) | (buffer == ord('\n')))
  line_ends = np.flatnonzero(buffer[separators] == ord('\n'))
  return np.diff(line_ends, prepend=-1), separators


def field_bounds(separators: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Start and end (exclusive) of every field, int64 [N, 40], from the separators of lines of 40 columns."""
  end_NxC = separators.reshape(-1, NUM_COLUMNS)
  start_NxC = np.empty_like(end_NxC)
  start_NxC.ravel()[0] = 0
  start_NxC.ravel()[1:] = end_NxC.ravel()[:-1] + 1
  return start_NxC, end_NxC


def parse_rows(data: bytes, cardinalities: tuple[int, ...], path: str, first_line: int) -> Batch:
  """Parses whole TSV lines into a Batch; `first_line` is the 1-based line number of the first, for errors."""
  if not data:
    return empty_batch()
  buffer = as_lines(data)
  columns_N, separators = column_counts(buffer)
  bad = np.flatnonzero(columns_N != NUM_COLUMNS)
  if bad.size:
    raise CriteoFormatError(
      path,
      first_line + int(bad[0]),
      'columns',
      f'expected {NUM_COLUMNS} tab-separated columns, found {columns_N[bad[0]]}.',
    )
  start_NxC, end_NxC = field_bounds(separators)
  length_NxC = end_NxC - start_NxC
  label_N = _labels(buffer, start_NxC[:, 0], length_NxC[:, 0], path, first_line)
  padded = np.concatenate([np.zeros(_WORD_PAD, np.uint8), buffer])
  count_NxF = _swar_counts(padded, end_NxC[:, DENSE_COLUMNS], length_NxC[:, DENSE_COLUMNS])
  hash_NxT = _swar_hashes(padded, end_NxC[:, SPARSE_COLUMNS], length_NxC[:, SPARSE_COLUMNS])
  if count_NxF is None:
    count_NxF = _general_counts(buffer, start_NxC[:, DENSE_COLUMNS], end_NxC[:, DENSE_COLUMNS], path, first_line)
  if hash_NxT is None:
    hash_NxT = _general_hashes(buffer, start_NxC[:, SPARSE_COLUMNS], end_NxC[:, SPARSE_COLUMNS], path, first_line)
  return Batch(
    dense=np.log1p(np.maximum(count_NxF, 0)).astype(np.float32),
    sparse=(hash_NxT % np.asarray(cardinalities, np.uint64)).astype(np.int32),
    label=label_N,
  )


def label_problems(buffer: np.ndarray, start_N: np.ndarray, length_N: np.ndarray) -> np.ndarray:
  """bool [N]: the label is not exactly '0' or '1'."""
  first_byte_N = buffer[start_N]
  return (length_N != 1) | ((first_byte_N != ord('0')) & (first_byte_N != ord('1')))


def right_windows(buffer: np.ndarray, end: np.ndarray, width: int) -> np.ndarray:
  """uint8 [..., width]: the `width` bytes before each field end (zeros before the buffer's start)."""
  padded = np.concatenate([np.zeros(width, np.uint8), buffer])
  return np.lib.stride_tricks.sliding_window_view(padded, width)[end]


def _count_text(buffer: np.ndarray, end: np.ndarray, length: np.ndarray):
  """Windows of the count fields and their masks: (text, present, sign position, negative)."""
  width = int(np.clip(length.max(initial=0), 1, MAX_COUNT_DIGITS + 1))
  text = right_windows(buffer, end, width)
  position = np.arange(width)
  present = position >= (width - length)[..., None]
  leading = position == (width - length)[..., None]
  negative = np.any(leading & (text == ord('-')), axis=-1) & (length > 0)
  return text, present, leading, negative


def count_problems(buffer: np.ndarray, end: np.ndarray, length: np.ndarray) -> np.ndarray:
  """bool [..]: the field is not a decimal integer (optional leading '-') of at most 18 digits."""
  text, present, leading, negative = _count_text(buffer, end, length)
  is_digit = ((text - np.uint8(ord('0'))) <= 9) | (leading & negative[..., None])
  num_digits = length - negative
  return np.any(present & ~is_digit, axis=-1) | (negative & (num_digits == 0)) | (num_digits > MAX_COUNT_DIGITS)


def hex_problems(buffer: np.ndarray, end: np.ndarray, length: np.ndarray) -> np.ndarray:
  """bool [..]: the field is not hexadecimal of at most 16 digits."""
  width = int(np.clip(length.max(initial=0), 1, MAX_HEX_DIGITS))
  present = np.arange(width) >= (width - length)[..., None]
  return np.any(present & (NIBBLE[right_windows(buffer, end, width)] > 15), axis=-1) | (length > MAX_HEX_DIGITS)


def _labels(buffer: np.ndarray, start_N: np.ndarray, length_N: np.ndarray, path: str, first_line: int) -> np.ndarray:
  bad = np.flatnonzero(label_problems(buffer, start_N, length_N))
  if bad.size:
    i = bad[0]
    found = _field_text(buffer, start_N[i], start_N[i] + length_N[i])
    raise CriteoFormatError(path, first_line + int(i), 'label', f'the label must be 0 or 1, found {found}.')
  return (buffer[start_N] == ord('1')).astype(np.float32)


def _general_counts(buffer: np.ndarray, start: np.ndarray, end: np.ndarray, path: str, first_line: int) -> np.ndarray:
  """float64 [N, F] counts through byte windows; raises at the first field that is not an integer."""
  length = end - start
  bad = count_problems(buffer, end, length)
  if bad.any():
    row, feature = _first(bad)
    raise CriteoFormatError(
      path,
      first_line + row,
      'dense',
      f'dense feature I{feature + 1} must be an integer, found '
      f'{_field_text(buffer, start[row, feature], end[row, feature])}.',
    )
  text, present, leading, negative = _count_text(buffer, end, length)
  digit = np.where(present & ~(leading & negative[..., None]), text - np.uint8(ord('0')), np.uint8(0))
  width = digit.shape[-1]
  if width <= len(_POW10_F):  # Exact in float64 below 10^15.
    value = digit.astype(np.float64) @ _POW10_F[-width:]
  else:
    value = (digit.astype(np.int64) @ _POW10_I[-width:]).astype(np.float64)
  return np.where(negative, -value, value)


def _general_hashes(buffer: np.ndarray, start: np.ndarray, end: np.ndarray, path: str, first_line: int) -> np.ndarray:
  """uint64 [N, T] hash values through byte windows; raises at the first field that is not hexadecimal."""
  length = end - start
  bad = hex_problems(buffer, end, length)
  if bad.any():
    row, table = _first(bad)
    raise CriteoFormatError(
      path,
      first_line + row,
      'categorical',
      f'category C{table + 1} must be hexadecimal (at most {MAX_HEX_DIGITS} digits), found '
      f'{_field_text(buffer, start[row, table], end[row, table])}.',
    )
  width = 8 if length.max(initial=0) <= 8 else MAX_HEX_DIGITS
  present = np.arange(width) >= (width - length)[..., None]
  nibble = np.where(present, NIBBLE[right_windows(buffer, end, width)], np.uint8(0))
  packed = np.ascontiguousarray((nibble[..., 0::2] << 4) | nibble[..., 1::2])  # Two digits a byte, big-endian.
  return packed.view('>u4' if width == 8 else '>u8')[..., 0].astype(np.uint64)


def _words(padded: np.ndarray, end: np.ndarray, back: int) -> np.ndarray:
  """uint64 (little-endian) of the 8 bytes ending `back` bytes before each field end; `padded` has _WORD_PAD zero
  bytes in front of the buffer."""
  view = np.ndarray(shape=(len(padded) - 7,), dtype='<u8', buffer=padded, strides=(1,))
  return view[end + (_WORD_PAD - 8 - back)]


def _outside(x: np.ndarray, length: np.ndarray, low: int, high: int) -> np.ndarray:
  """True where one of the last `length` bytes of x lies outside [low, high]."""
  outside = (x.view(np.uint8).reshape(*x.shape, 8) - np.uint8(low)) > np.uint8(high - low)
  return (outside.view(np.uint64)[..., 0] & _KEEP[length]) != 0  # Booleans are bytes 0/1: mask whole bytes.


def _decimal_word(x: np.ndarray, length: np.ndarray) -> np.ndarray:
  """Value of the (already checked) decimal digits in the last `length` bytes of x: pairs, quads, then octets."""
  keep = _KEEP[length]
  d = ((x & keep) | (_ASCII_ZEROS & ~keep)) - _ASCII_ZEROS
  d = (d * _U64(10) + (d >> _U64(8))) & _U64(0x00FF00FF00FF00FF)
  d = (d * _U64(100) + (d >> _U64(16))) & _U64(0x0000FFFF0000FFFF)
  return (d * _U64(10000) + (d >> _U64(32))) & _U64(0xFFFFFFFF)


def _swar_counts(padded: np.ndarray, end: np.ndarray, length: np.ndarray) -> np.ndarray | None:
  """float64 counts of fields of at most 16 characters, or None when the block needs the general path."""
  if length.max(initial=0) > 16:
    return None
  low_length, high_length = np.minimum(length, 8), np.maximum(length - 8, 0)
  x_low, x_high = _words(padded, end, 0), _words(padded, end, 8)
  # A sign is the first character: in x_high when the field is longer than 8, else in x_low.
  long = length > 8
  first_shift = (_U64(8) * (_U64(8) - np.where(long, high_length, low_length).astype(_U64))) % _U64(64)
  negative = (((np.where(long, x_high, x_low) >> first_shift) & _U64(0xFF)) == _U64(ord('-'))) & (length > 0)
  sign_byte = np.where(negative, _U64(0xFF) << first_shift, _U64(0))
  as_zero = lambda x, where: (x & ~where) | (_ASCII_ZEROS & where)
  x_low = as_zero(x_low, np.where(long, _U64(0), sign_byte))
  x_high = as_zero(x_high, np.where(long, sign_byte, _U64(0)))
  bad = _outside(x_low, low_length, 0x30, 0x39) | _outside(x_high, high_length, 0x30, 0x39) | (negative & (length == 1))
  if bad.any():
    return None
  value = _decimal_word(x_high, high_length).astype(np.float64) * 1e8 + _decimal_word(x_low, low_length)
  return np.where(negative, -value, value)


def _swar_hashes(padded: np.ndarray, end: np.ndarray, length: np.ndarray) -> np.ndarray | None:
  """uint64 values of 8-digit (or empty) hex fields, or None when the block needs the general path."""
  if not np.all((length == 0) | (length == 8)):
    return None
  nibble = np.take(NIBBLE, _words(padded, end, 0).view(np.uint8)).view(np.uint64).reshape(length.shape)
  full = length == 8
  if np.any(full & ((nibble & _U64(0xF0F0F0F0F0F0F0F0)) != 0)):
    return None
  # The first character is the lowest byte and the most significant digit: merge pairs, then quads, then octets.
  v = ((nibble << _U64(4)) | (nibble >> _U64(8))) & _U64(0x00FF00FF00FF00FF)
  v = ((v << _U64(8)) | (v >> _U64(16))) & _U64(0x0000FFFF0000FFFF)
  v = ((v << _U64(16)) | (v >> _U64(32))) & _U64(0xFFFFFFFF)
  return np.where(full, v, _U64(0))


def _first(bad: np.ndarray) -> tuple[int, int]:
  row, column = np.unravel_index(np.flatnonzero(bad.ravel())[0], bad.shape)
  return int(row), int(column)


def _field_text(buffer: np.ndarray, start: int, end: int) -> str:
  return repr(buffer[start:end].tobytes().decode('utf-8', 'replace'))
