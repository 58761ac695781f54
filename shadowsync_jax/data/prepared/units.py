"""The work of a preparation: input pieces cut into units, and one unit turned into finished parts (in a worker).

  units = units_lib.plan({'train': train_pieces, 'heldout': heldout_pieces}, unit_bytes=64 << 20)
  parts = units_lib.prepare_unit(units[0], settings, report)   # [part description], finished parts kept

A unit is a run of whole lines that one worker reads from start to end: about `unit_bytes` of a plain file, cut at
a line end (so one big file keeps every core busy), or a whole gzip file (a gzip stream cannot be entered in the
middle). The worker streams the unit in chunks, cuts blocks of `block_rows` lines, parses and hashes each block
(`criteo.parse`), and writes it as one record (`records`). Memory: a chunk and a block, whatever the file's size.

Every `part_blocks` records a part is finished: its array_record file is closed and renamed from `*.incomplete`,
then its description is written (`<part>.json`, also renamed into place): rows per record, where it starts and ends
in the unit's TSV bytes and lines, the sha256 of those bytes, malformed lines by kind, CPU seconds. A rerun reads
the descriptions back and starts after the last finished part: a plain unit seeks there, a gzip unit inflates up to
there without parsing. So an interrupted preparation redoes at most one part per worker.

Malformed lines stop the unit with `CriteoFormatError` naming the input file and its 1-based line, or, with
`skip_malformed`, are dropped and counted by kind, with the first file:line of each kind.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import hashlib
import json
import os
import time
from typing import Any, NamedTuple

from array_record.python import array_record_module
import numpy as np

from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.criteo import malformed
from shadowsync_jax.data.criteo import parse
from shadowsync_jax.data.prepared import records

_REPORT_EVERY_S = 0.5


@dataclasses.dataclass(frozen=True)
class Unit:
  """Lines [start, end) of a plain file, or a whole gzip file (end None), that belong to `split`."""

  split: str
  piece: int  # Index of the piece in its split (a day).
  index: int  # Index of the unit in its piece.
  path: str
  start: int
  end: int | None
  first_line: int | None  # 1-based line of the unit's first line; None = count it when needed (errors only).

  @property
  def key(self) -> str:
    return f'{self.split}-{self.piece:05d}-{self.index:05d}'

  def input_bytes(self) -> int:
    """Bytes of input the unit reads (compressed bytes for gzip): the measure of progress."""
    return os.path.getsize(self.path) if self.end is None else self.end - self.start


class Settings(NamedTuple):
  """What every unit of one preparation shares."""

  work_dir: str
  cardinalities: tuple[int, ...]
  block_rows: int
  part_blocks: int
  writer_options: str  # array_record's: 'group_size:1,uncompressed' (group_size:1: any record read alone).
  skip_malformed: bool


def plan(splits: Mapping[str, Sequence[files.Piece]], unit_bytes: int) -> list[Unit]:
  """The units of every piece, in stream order: split, then piece, then position in the file."""
  units = []
  for split, pieces in splits.items():
    for piece_index, piece in enumerate(pieces):
      if files.is_gzip(piece.path):
        units.append(Unit(split, piece_index, 0, piece.path, 0, None, 1))
        continue
      bounds = _cut_at_line_ends(piece, unit_bytes)
      for index, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        units.append(Unit(split, piece_index, index, piece.path, start, end, piece.first_line if index == 0 else None))
  return units


def _cut_at_line_ends(piece: files.Piece, unit_bytes: int) -> list[int]:
  end = os.path.getsize(piece.path) if piece.end is None else piece.end
  bounds = [piece.start]
  with open(piece.path, 'rb') as f:
    while bounds[-1] + unit_bytes < end:
      f.seek(bounds[-1] + unit_bytes)
      f.readline()  # To the end of the line it landed in.
      if f.tell() >= end:
        break
      bounds.append(f.tell())
  return [*bounds, end]


def part_paths(work_dir: str, unit: Unit, part: int) -> tuple[str, str]:
  """(array_record file, description json) of part `part` of `unit`."""
  base = os.path.join(work_dir, 'parts', f'{unit.key}-{part:05d}')
  return base + '.array_record', base + '.json'


def finished_parts(work_dir: str, unit: Unit) -> list[dict[str, Any]]:
  """Descriptions of the unit's finished parts, in order."""
  parts = []
  while os.path.exists(path := part_paths(work_dir, unit, len(parts))[1]):
    with open(path) as f:
      parts.append(json.load(f))
  return parts


def prepare_unit(unit: Unit, settings: Settings, report: Callable[..., None]) -> list[dict[str, Any]]:
  """Writes the unit's remaining parts; returns all its part descriptions. `report(rows=, input_bytes=)` is called
  about every half second with the work done since the last call."""
  done = finished_parts(settings.work_dir, unit)
  if done and done[-1]['last']:
    report(rows=0, input_bytes=unit.input_bytes())
    return done
  writer = _PartWriter(unit, settings, done, report)
  skip = done[-1]['end_offset'] if done else 0
  if unit.end is not None:
    writer.count_input(skip)  # A plain unit seeks past its finished parts; gzip counts the bytes it inflates.
  carry = b''
  for chunk, consumed in files.read_chunks(unit.path, unit.start, unit.end, skip=skip):
    writer.count_input(consumed)
    data = carry + chunk
    newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == ord('\n'))
    start = 0
    for block_end in newlines[settings.block_rows - 1 :: settings.block_rows]:
      writer.add_block(data[start : int(block_end) + 1], settings.block_rows)
      start = int(block_end) + 1
    carry = data[start:]
  if carry:
    writer.add_block(carry, carry.count(b'\n') + (not carry.endswith(b'\n')))
  return writer.finish()


class _PartWriter:
  """The part being written: blocks go in as records; every `part_blocks` records the part is finished."""

  def __init__(self, unit: Unit, settings: Settings, done: list[dict[str, Any]], report: Callable[..., None]):
    self.unit, self.settings, self.done, self._report = unit, settings, done, report
    self.offset = done[-1]['end_offset'] if done else 0  # TSV bytes of the unit behind the finished blocks.
    self.line = done[-1]['end_line'] if done else 0  # Lines of the unit behind them.
    self._unit_first_line = unit.first_line
    self._writer = None
    self._pending_rows, self._pending_bytes, self._last_report = 0, 0, time.monotonic()

  def count_input(self, consumed: int) -> None:
    self._pending_bytes += consumed
    self._maybe_report()

  def add_block(self, data: bytes, num_lines: int) -> None:
    if self._writer is None:
      self._open()
    batch = self._parse(data)
    if len(batch.label):
      self._writer.write(records.encode(batch))
      self._rows_per_record.append(len(batch.label))
    self.offset += len(data)
    self.line += num_lines
    self._sha256.update(data)
    self._pending_rows += len(batch.label)
    if len(self._rows_per_record) >= self.settings.part_blocks:
      self._close(last=False)
    self._maybe_report()

  def finish(self) -> list[dict[str, Any]]:
    if self._writer is None:
      self._open()
    self._close(last=True)
    self._report(rows=self._pending_rows, input_bytes=self._pending_bytes)
    return self.done

  def _parse(self, data: bytes):
    cardinalities = self.settings.cardinalities
    try:
      return parse.parse_rows(data, cardinalities, self.unit.path, first_line=1)
    except parse.CriteoFormatError as error:
      if not self.settings.skip_malformed:
        raise parse.CriteoFormatError(
          self.unit.path, self._file_line(error.line - 1), error.kind, error.detail
        ) from None
    batch, dropped = malformed.parse_skipping(data, cardinalities)
    for kind, lines in dropped.items():
      self._malformed[kind] += len(lines)
      if len(lines) and kind not in self._first_malformed:
        self._first_malformed[kind] = f'{self.unit.path}:{self._file_line(int(lines[0]))}'
    return batch

  def _file_line(self, line_in_block: int) -> int:
    """The 1-based line in the input file of a line of the current block."""
    if self._unit_first_line is None:  # Counted only now: a plain unit past the start of its file.
      self._unit_first_line = files.lines_before(self.unit.path, self.unit.start) + 1
    return self._unit_first_line + self.line + line_in_block

  def _open(self) -> None:
    data_path, _ = part_paths(self.settings.work_dir, self.unit, len(self.done))
    self._writer = array_record_module.ArrayRecordWriter(data_path + '.incomplete', self.settings.writer_options)
    self._rows_per_record, self._sha256 = [], hashlib.sha256()
    self._malformed = dict.fromkeys(parse.MALFORMED_KINDS, 0)
    self._first_malformed = {}
    self._start_offset, self._start_line, self._cpu_start = self.offset, self.line, time.process_time()

  def _close(self, last: bool) -> None:
    self._writer.close()
    self._writer = None
    data_path, json_path = part_paths(self.settings.work_dir, self.unit, len(self.done))
    if self._rows_per_record:
      os.replace(data_path + '.incomplete', data_path)
    else:  # No row survived (an empty unit, or all malformed): a part without a file.
      os.remove(data_path + '.incomplete')
    description = {
      'unit': self.unit.key,
      'split': self.unit.split,
      'piece': self.unit.piece,
      'unit_index': self.unit.index,
      'path': self.unit.path,
      'part': len(self.done),
      'file': os.path.basename(data_path) if self._rows_per_record else None,
      'rows': sum(self._rows_per_record),
      'rows_per_record': self._rows_per_record,
      'start_offset': self._start_offset,
      'end_offset': self.offset,
      'start_line': self._start_line,
      'end_line': self.line,
      'tsv_sha256': self._sha256.hexdigest(),
      'malformed': self._malformed,
      'first_malformed': self._first_malformed,
      'cpu_s': time.process_time() - self._cpu_start,
      'last': last,
    }
    with open(json_path + '.incomplete', 'w') as f:
      json.dump(description, f)
    os.replace(json_path + '.incomplete', json_path)
    self.done.append(description)

  def _maybe_report(self) -> None:
    now = time.monotonic()
    if now - self._last_report >= _REPORT_EVERY_S:
      self._report(rows=self._pending_rows, input_bytes=self._pending_bytes)
      self._pending_rows, self._pending_bytes, self._last_report = 0, 0, now
