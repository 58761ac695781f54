"""Parsing that skips malformed Criteo lines and says which lines were dropped, by kind.

  batch, dropped = malformed.parse_skipping(data, cardinalities)
  dropped['dense']   # 0-based indices (within `data`) of the lines dropped for a bad dense field

Kinds (`parse.MALFORMED_KINDS`), checked in this order, each line counted under the first that applies:
`columns` (not 40 tab-separated fields, empty lines included), `label` (not exactly '0' or '1'), `dense` (an I field
that is not a decimal integer of at most 18 digits), `categorical` (a C field that is not hex of at most 16 digits).
It uses the same checks as `parse.parse_rows`, so the lines it keeps parse there without error and to the same
numbers. It is the slow path of a preparation run with skipping on, taken only for blocks that hold a bad line.
"""

import numpy as np

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.criteo import parse


def parse_skipping(data: bytes, cardinalities: tuple[int, ...]) -> tuple[Batch, dict[str, np.ndarray]]:
  """(the good lines parsed, {kind: 0-based indices of the dropped lines of that kind}) for whole TSV lines."""
  dropped = {kind: np.zeros(0, np.int64) for kind in parse.MALFORMED_KINDS}
  if not data:
    return parse.empty_batch(), dropped
  buffer = parse.as_lines(data)
  columns_N, _ = parse.column_counts(buffer)
  has_columns = columns_N == parse.NUM_COLUMNS
  dropped['columns'] = np.flatnonzero(~has_columns)
  line_of_row = np.flatnonzero(has_columns)  # The original line of every line left.
  buffer = _keep_lines(buffer, has_columns)
  if buffer.size == 0:
    return parse.empty_batch(), dropped
  _, separators = parse.column_counts(buffer)
  start_NxC, end_NxC = parse.field_bounds(separators)
  length_NxC = end_NxC - start_NxC
  dense, sparse = parse.DENSE_COLUMNS, parse.SPARSE_COLUMNS
  problems = {
    'label': parse.label_problems(buffer, start_NxC[:, 0], length_NxC[:, 0]),
    'dense': parse.count_problems(buffer, end_NxC[:, dense], length_NxC[:, dense]).any(axis=1),
    'categorical': parse.hex_problems(buffer, end_NxC[:, sparse], length_NxC[:, sparse]).any(axis=1),
  }
  already = np.zeros(len(line_of_row), bool)
  for kind, bad_N in problems.items():
    dropped[kind] = line_of_row[bad_N & ~already]
    already |= bad_N
  good = _keep_lines(buffer, ~already)
  return parse.parse_rows(good.tobytes(), cardinalities, '(checked lines)', 1), dropped


def _keep_lines(buffer: np.ndarray, keep_N: np.ndarray) -> np.ndarray:
  """The bytes of the lines where keep_N is True (every line of `buffer` ends with a newline)."""
  line_of_byte = np.concatenate([[0], np.cumsum(buffer[:-1] == ord('\n'))])
  return buffer[keep_N[line_of_byte]]
