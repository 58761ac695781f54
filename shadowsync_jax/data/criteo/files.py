"""Criteo input files: plain or gzip TSV read in chunks, their rows, the standard day splits, and the true click
probabilities a generated day file keeps beside it.

  for tsv, consumed in files.read_chunks('day_0.gz'):     # decompressed TSV bytes, ~8 MiB at a time
    ...                                                     # consumed: input (compressed) bytes read for it
  files.count_rows('train.txt')                 # lines; a last line without a newline counts
  files.day_sizes(45_840_617, 7)                # the DLRM reference's days of Kaggle's train.txt
  splits = files.day_layout(['train.txt'], days=7, heldout_days=1)
  splits['train'], splits['heldout']            # Pieces: days 1-6 of train.txt, then day 7
  files.true_probability_path('day_3.gz')       # 'day_3.p_true.npy'

A gzip file (found by its magic bytes, whatever its name) is read as one stream: it cannot be entered in the middle.
Concatenated gzip members (what `cat a.gz b.gz` or a parallel writer makes) read as one file. Criteo Terabyte ships
as day_0.gz .. day_23.gz; Kaggle as one plain train.txt whose 7 days the DLRM reference cuts by row count.
"""

from collections.abc import Iterator, Sequence
import dataclasses
import glob
import os
import re
import zlib

import numpy as np

CHUNK_BYTES = 8 << 20
_GZIP_MAGIC = b'\x1f\x8b'
_GZIP_WBITS = 31  # zlib: a gzip header and trailer.
_STRIPPED_SUFFIXES = ('.gz', '.tsv', '.txt')


@dataclasses.dataclass(frozen=True)
class Piece:
  """A run of whole lines of one input file that belongs to one split: the whole file, or a row range of a plain
  file (a day of Kaggle's train.txt)."""

  path: str
  start: int = 0  # Byte offset of its first line.
  end: int | None = None  # Byte offset past its last line; None = the end of the file.
  first_line: int = 1  # 1-based line number of its first line in the file.


def split_paths(paths: str) -> list[str]:
  """The files of a comma-separated list, in order (a config value: `data.train_path=day_0,day_1`)."""
  return [path.strip() for path in paths.split(',') if path.strip()]


def expand_inputs(patterns: str) -> list[str]:
  """The files of a comma-separated list of paths and glob patterns; a pattern's matches in natural order (day_2
  before day_10). Raises FileNotFoundError naming a path or pattern that matches nothing."""
  paths = []
  for pattern in split_paths(patterns):
    matches = sorted(glob.glob(os.path.expanduser(pattern)), key=_natural_key)
    if not matches:
      raise FileNotFoundError(f'{pattern!r} matches no file.')
    paths.extend(matches)
  return paths


def _natural_key(path: str) -> list:
  return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', path)]


def is_gzip(path: str) -> bool:
  with open(path, 'rb') as f:
    return f.read(2) == _GZIP_MAGIC


def read_chunks(
  path: str, start: int = 0, end: int | None = None, skip: int = 0, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[bytes, int]]:
  """(TSV bytes, input bytes read for them) of bytes [start, end) of a plain file, or of a whole gzip file, from
  `skip` bytes in (decompressed bytes for gzip: skipping them costs an inflate, no parse)."""
  if is_gzip(path):
    if start or end is not None:
      raise ValueError(f'{path}: a gzip file is read whole; byte range [{start}, {end}) was asked for.')
    yield from _gzip_chunks(path, skip, chunk_bytes)
    return
  end = os.path.getsize(path) if end is None else end
  with open(path, 'rb') as f:
    f.seek(start + skip)
    remaining = end - start - skip
    while remaining > 0:
      chunk = f.read(min(chunk_bytes, remaining))
      if not chunk:
        raise OSError(f'{path}: the file ended at byte {end - remaining}, before {end}: it changed while being read.')
      remaining -= len(chunk)
      yield chunk, len(chunk)


def _gzip_chunks(path: str, skip: int, chunk_bytes: int) -> Iterator[tuple[bytes, int]]:
  inflate, consumed = zlib.decompressobj(wbits=_GZIP_WBITS), 0
  with open(path, 'rb') as f:
    while compressed := f.read(chunk_bytes):
      consumed += len(compressed)
      while compressed:
        out = inflate.decompress(compressed)
        compressed = b''
        if inflate.eof:  # The next gzip member, if any, starts in what is left over.
          compressed = inflate.unused_data
          inflate = zlib.decompressobj(wbits=_GZIP_WBITS)
        if skip >= len(out):
          skip -= len(out)
          continue
        out, skip = out[skip:], 0
        yield out, consumed
        consumed = 0
  if consumed:
    yield b'', consumed


def count_rows(path: str) -> int:
  """Lines of a plain or gzip file (a last line without a newline counts)."""
  rows, last = 0, b'\n'
  for chunk, _ in read_chunks(path):
    if chunk:
      rows += int(np.count_nonzero(np.frombuffer(chunk, np.uint8) == ord('\n')))
      last = chunk[-1:]
  return rows + int(last != b'\n')


def line_starts(path: str, lines: Sequence[int]) -> list[int]:
  """Byte offsets where the given 0-based lines of a plain file start, in ascending order of the lines (the line
  after the last one starts at the file's size)."""
  wanted = sorted(lines)
  offsets = [0 for line in wanted if line == 0]
  seen = position = 0
  for chunk, _ in read_chunks(path):
    newlines = np.flatnonzero(np.frombuffer(chunk, np.uint8) == ord('\n'))
    while len(offsets) < len(wanted) and wanted[len(offsets)] - 1 - seen < len(newlines):
      offsets.append(position + int(newlines[wanted[len(offsets)] - 1 - seen]) + 1)  # After newline number line - 1.
    seen += len(newlines)
    position += len(chunk)
  if len(offsets) < len(wanted):
    raise ValueError(f'{path} has {seen} lines; the start of line {wanted[len(offsets)]} was asked for.')
  return offsets


def lines_before(path: str, offset: int) -> int:
  """Newlines in bytes [0, offset) of a plain file: the 0-based line number of the line starting at `offset`."""
  return sum(chunk.count(b'\n') for chunk, _ in read_chunks(path, 0, offset))


def day_sizes(total_rows: int, days: int) -> list[int]:
  """Rows of each day when one file of `total_rows` is cut into `days` days, as the DLRM reference cuts Kaggle's
  train.txt (facebookresearch/dlrm, data_utils.py): equal days, the first `total_rows % days` one row longer."""
  per_day, extra = divmod(total_rows, days)
  return [per_day + (day < extra) for day in range(days)]


def day_layout(paths: Sequence[str], days: int = 0, heldout_days: int = 1) -> dict[str, list[Piece]]:
  """{'train': pieces, 'heldout': pieces}: the standard one-pass split, the last `heldout_days` days held out.

  Several paths are one day each, in time order (Terabyte: day_0 .. day_23). One plain path with `days` > 1 is cut
  into that many days by row count (Kaggle: 7 days of train.txt, `day_sizes`).
  """
  if not paths:
    raise ValueError('no input files.')
  if days > 1 and len(paths) == 1:
    pieces = _cut_into_days(paths[0], days)
  elif days in (0, 1, len(paths)):
    pieces = [Piece(os.fspath(path)) for path in paths]
  else:
    raise ValueError(f'days={days} with {len(paths)} files: give one file to cut into days, or one file per day.')
  if not 0 <= heldout_days < len(pieces):
    raise ValueError(f'heldout_days={heldout_days} must leave at least one of the {len(pieces)} days to train on.')
  cut = len(pieces) - heldout_days
  return {'train': pieces[:cut], 'heldout': pieces[cut:]} if heldout_days else {'train': pieces}


def _cut_into_days(path: str, days: int) -> list[Piece]:
  path = os.fspath(path)
  if is_gzip(path):
    raise ValueError(
      f'{path}: cutting one file into days needs a plain file (a gzip file cannot be entered in the middle); '
      'gunzip it first, or give one file per day.'
    )
  first_lines = np.cumsum([0, *day_sizes(count_rows(path), days)])[:-1]
  starts = line_starts(path, [int(line) for line in first_lines])
  ends = [*starts[1:], None]
  return [Piece(path, start, end, int(line) + 1) for start, end, line in zip(starts, ends, first_lines)]


def true_probability_path(path: str) -> str:
  """Where the true click probabilities of a generated file lie: `day_3.gz`, `day_3.tsv` -> `day_3.p_true.npy`."""
  stem = os.fspath(path)
  for suffix in _STRIPPED_SUFFIXES:
    stem = stem.removesuffix(suffix)
  return stem + '.p_true.npy'
