"""Criteo-format day files of any size from the synthetic teacher, with the true click probabilities beside them.

  spec = synthetic.SyntheticSpec(seed=0, cardinalities=config.data.cardinalities)
  paths = generate.write_days('/data/gen', rows=4_000_000, days=7, spec=spec)   # day_0.gz .. day_6.gz
  np.load('/data/gen/day_6.p_true.npy')      # float32, one probability per line of day_6.gz

The real Criteo files cannot be downloaded here, so tests and benchmarks read these. Day d holds examples
[first_d, first_d + rows_d) of the synthetic stream, the rows cut into days as the DLRM reference cuts Kaggle
(`files.day_sizes`), so the days in order are the stream. Each line looks like real Criteo: heavy-tailed integer
counts (I2 sometimes -1 where the count is 0), categories as 8 lowercase hex digits of a 32-bit value, fields left
empty (missing) at per-column rates. Values are chosen so that reading a file with the spec's cardinalities gives
the stream back: a category is written as id + k * cardinality (k random, the value below 2^32), so
`int(hex, 16) % cardinality` is the id; a field is only left empty, or a count written as -1, where the value
parses to the same number (count 0, id 0). Ids and labels come back exactly, dense features as
`log1p(float64(count))`, which can differ from the stream's float32 `log(count + 1)` in the last bit.

Labels are the teacher's draws from the saved probabilities, so the Bayes NE floor holds on TSV and prepared
input as on the stream. Chunks of rows are generated and compressed in parallel (spawned workers); a gzip day
file is their gzip members, concatenated.
"""

from collections.abc import Callable
import functools
import os
import zlib

import numpy as np

from shadowsync_jax.data import counter_hash
from shadowsync_jax.data import synthetic
from shadowsync_jax.data import workers
from shadowsync_jax.data.criteo import files

CHUNK_ROWS = 1 << 17
_HEX_DIGITS = np.frombuffer(b'0123456789abcdef', np.uint8)
_TAB, _NEWLINE = ord('\t'), ord('\n')
_MISSING_KEY = 0x5EED_C417E0  # Key of the hashes that choose missing fields (the teacher's key is separate).
_DENSE_MISSING_RATE = np.linspace(0.0, 0.45, 13)  # Real Criteo leaves I1..I13 empty 0-45 % of the time.
_SPARSE_MISSING_RATE = np.linspace(0.0, 0.4, 26)
_NEGATIVE_FEATURE, _NEGATIVE_RATE = 1, 0.3  # I2 holds -1, -2, -3 in real Criteo.


def write_days(
  output_dir: str,
  rows: int,
  days: int,
  spec: synthetic.SyntheticSpec,
  gzip: bool = True,
  num_workers: int | None = None,
  chunk_rows: int = CHUNK_ROWS,
  print_fn: Callable[[str], None] = print,
) -> list[str]:
  """Writes day_0 .. day_{days-1} (`.gz` with `gzip`) and their `.p_true.npy` under output_dir; returns the paths.
  `num_workers` defaults to one per core. A file appears under its name only once it is complete."""
  if rows < days or days < 1:
    raise ValueError(f'rows={rows} and days={days}: need at least one row a day.')
  os.makedirs(output_dir, exist_ok=True)
  day_rows = files.day_sizes(rows, days)
  day_first = np.cumsum([0, *day_rows])
  paths = [os.path.join(output_dir, f'day_{day}' + ('.gz' if gzip else '')) for day in range(days)]
  chunks = [
    (day, start, min(chunk_rows, day_first[day + 1] - start), gzip)
    for day in range(days)
    for start in range(day_first[day], day_first[day + 1], chunk_rows)
  ]
  num_workers = os.cpu_count() if num_workers is None else num_workers
  results = workers.run(_chunk_text, chunks, num_workers, setup=functools.partial(synthetic.SyntheticSource, spec))
  text_file = p_true = None
  try:
    for index, (text, probability) in _in_order(results):
      day, start, count, _ = chunks[index]
      partial = (paths[day] + '.partial', files.true_probability_path(paths[day]) + '.partial')
      if text_file is None:  # The day's first chunk.
        text_file = open(partial[0], 'wb')
        p_true = np.lib.format.open_memmap(partial[1], 'w+', np.float32, (day_rows[day],))
      text_file.write(text)
      p_true[start - day_first[day] : start - day_first[day] + count] = probability
      if start + count == day_first[day + 1]:  # The day's last chunk.
        text_file.close()
        p_true.flush()
        text_file = p_true = None
        os.replace(partial[1], files.true_probability_path(paths[day]))
        os.replace(partial[0], paths[day])
        print_fn(f'{paths[day]}: {day_rows[day]:,} rows (examples {day_first[day]:,}.. of the stream)')
  finally:
    if text_file is not None:
      text_file.close()
  return paths


def _in_order(results):
  """The (index, result) pairs of `workers.run` in index order (chunks finish out of order)."""
  waiting, next_index = {}, 0
  for index, result in results:
    waiting[index] = result
    while next_index in waiting:
      yield next_index, waiting.pop(next_index)
      next_index += 1


def _chunk_text(
  chunk: tuple[int, int, int, bool], source: synthetic.SyntheticSource, report
) -> tuple[bytes, np.ndarray]:
  """(TSV bytes, gzip-compressed when asked, and the true probabilities) of stream examples [start, start + n)."""
  del report
  _, start, count, compress = chunk
  batch, probability = source.read_with_probability(start, count)
  counts_NxF = source.dense_counts(start, count).astype(np.int64)
  cardinality_T = np.asarray(source.spec.cardinalities, np.uint64)
  draws = counter_hash.splitmix64(
    np.arange(start, start + count, dtype=np.uint64)[:, None] * np.uint64(64) + np.arange(40, dtype=np.uint64),
    _MISSING_KEY,
  )
  uniform = (draws >> np.uint64(11)).astype(np.float64) * 2.0**-53
  dense_missing = (counts_NxF == 0) & (uniform[:, :13] < _DENSE_MISSING_RATE)
  negative = (counts_NxF[:, _NEGATIVE_FEATURE] == 0) & (uniform[:, 13] < _NEGATIVE_RATE)
  counts_NxF[:, _NEGATIVE_FEATURE] -= negative
  ids_NxT = batch.sparse.astype(np.uint64)
  sparse_missing = (ids_NxT == 0) & (uniform[:, 14:40] < _SPARSE_MISSING_RATE)
  multiples_T = np.uint64(2**32) // cardinality_T  # id + k * cardinality < 2^32 for k < 2^32 // cardinality.
  hashes_NxT = ids_NxT + (draws[:, 14:40] % multiples_T) * cardinality_T
  text = format_rows(batch.label.astype(np.uint8), counts_NxF, hashes_NxT, dense_missing, sparse_missing)
  if compress:
    packer = zlib.compressobj(3, zlib.DEFLATED, 31)  # One gzip member per chunk.
    text = packer.compress(text) + packer.flush()
  return text, probability


def format_rows(
  label_N: np.ndarray,
  count_NxF: np.ndarray,
  hash_NxT: np.ndarray,
  dense_missing_NxF: np.ndarray,
  sparse_missing_NxT: np.ndarray,
) -> bytes:
  """N lines of Criteo TSV, vectorized: every field laid out at a fixed width, then the unused bytes dropped."""
  n = len(label_N)
  dense_text, dense_keep = _decimal_fields(count_NxF, dense_missing_NxF)
  hex_text, hex_keep = _hex_fields(hash_NxT, sparse_missing_NxT)
  dense_text, dense_keep = _with_tabs(dense_text, dense_keep)
  hex_text, hex_keep = _with_tabs(hex_text, hex_keep)
  hex_text[:, -1, -1] = _NEWLINE
  label = np.stack([label_N.astype(np.uint8) + ord('0'), np.full(n, _TAB, np.uint8)], axis=1)
  text = np.concatenate([label, dense_text.reshape(n, -1), hex_text.reshape(n, -1)], axis=1)
  keep = np.concatenate([np.ones((n, 2), bool), dense_keep.reshape(n, -1), hex_keep.reshape(n, -1)], axis=1)
  return text[keep].tobytes()


def _with_tabs(text_NxFxW: np.ndarray, keep_NxFxW: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Every field followed by a tab (kept)."""
  tab = np.full((*text_NxFxW.shape[:2], 1), _TAB, np.uint8)
  return np.concatenate([text_NxFxW, tab], -1), np.concatenate([keep_NxFxW, np.ones(tab.shape, bool)], -1)


def _decimal_fields(count_NxF: np.ndarray, missing_NxF: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """uint8 [N, F, 1 + W] (a sign slot, then W digits right-aligned) and the mask of the bytes to keep."""
  magnitude = np.abs(count_NxF).astype(np.uint64)
  width = max(1, len(str(int(magnitude.max(initial=0)))))
  digits = np.empty((*count_NxF.shape, width), np.uint8)
  rest = magnitude.copy()
  for position in range(width - 1, -1, -1):
    digits[..., position] = (rest % np.uint64(10)).astype(np.uint8) + ord('0')
    rest //= np.uint64(10)
  num_digits = 1 + sum(magnitude >= np.uint64(10**d) for d in range(1, width))
  keep_digits = np.arange(width) >= (width - num_digits)[..., None]
  negative = count_NxF < 0
  sign = np.where(negative, ord('-'), ord('0')).astype(np.uint8)[..., None]
  keep = np.concatenate([negative[..., None], keep_digits], axis=-1) & ~missing_NxF[..., None]
  return np.concatenate([sign, digits], axis=-1), keep


def _hex_fields(hash_NxT: np.ndarray, missing_NxT: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """uint8 [N, T, 8]: 8 lowercase hex digits of the low 32 bits, and the mask of the bytes to keep."""
  shifts = np.arange(28, -1, -4, dtype=np.uint32)
  text = _HEX_DIGITS[(hash_NxT.astype(np.uint32)[..., None] >> shifts) & np.uint32(15)]
  return text, np.broadcast_to(~missing_NxT[..., None], text.shape)
