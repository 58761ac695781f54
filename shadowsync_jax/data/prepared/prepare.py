"""Criteo TSV files into prepared parts: in parallel over files and blocks on every core, resumable, with progress.

  result = prepare.run({'train': pieces, 'heldout': pieces}, work_dir, cardinalities=config.data.cardinalities)
  result.parts          # descriptions of every finished part, in stream order (`units`)
  result.rows, result.cpu_s, result.wall_s     # this run's work: rows parsed, worker CPU seconds, wall seconds

The inputs are planned into units (`units.plan`), the longest first, and handed to spawned workers (`workers`).
`work_dir` keeps the plan (`plan.json`) and the finished parts; a rerun with the same inputs and settings skips what
is finished, and one with other inputs or settings is refused (delete the work dir to start over). Whether
malformed lines stop the run or are skipped is not part of the plan: after a stop, rerun with skipping on.
A progress line every few seconds gives rows, rows/s, the share of the input read and the time left. The finished
parts become a tensorflow-datasets dataset in `builder`.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import json
import os
import time
from typing import Any, NamedTuple

from shadowsync_jax.data import workers
from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.prepared import units as units_lib

COMPRESSIONS = ('uncompressed', 'zstd:1', 'zstd:3', 'snappy')
# Reading decodes every block a process touches, and with P processes each decodes nearly all of them (a process's
# rows of a step are fewer than a block's): zstd:1 halves the bytes (generated data; real Criteo about 0.6x) but
# decodes several times slower, which keeps two processes on two cores under 1M rows/s each
# (docs/studies/criteo.md). Disk is the cheaper of the two.
DEFAULT_COMPRESSION = 'uncompressed'
DEFAULT_BLOCK_ROWS = 8192
DEFAULT_PART_BLOCKS = 64  # 512k rows, about 80 MB uncompressed: a TFDS shard, and the unit of resumption.
DEFAULT_UNIT_BYTES = 64 << 20
_PROGRESS_EVERY_S = 5.0


class Result(NamedTuple):
  parts: list[dict[str, Any]]
  rows: int  # Rows parsed in this run (parts finished earlier not counted).
  cpu_s: float  # Worker CPU seconds of this run's parts.
  wall_s: float


def writer_options(compression: str) -> str:
  """array_record options: every record its own group, so that any record can be read alone."""
  if compression not in COMPRESSIONS:
    raise ValueError(f'compression={compression!r} is not one of {", ".join(COMPRESSIONS)}.')
  return f'group_size:1,{compression}'


def run(
  splits: Mapping[str, Sequence[files.Piece]],
  work_dir: str,
  cardinalities: Sequence[int],
  block_rows: int = DEFAULT_BLOCK_ROWS,
  compression: str = DEFAULT_COMPRESSION,
  skip_malformed: bool = False,
  num_workers: int | None = None,
  part_blocks: int = DEFAULT_PART_BLOCKS,
  unit_bytes: int = DEFAULT_UNIT_BYTES,
  print_fn: Callable[[str], None] = print,
) -> Result:
  """Prepares every unit of `splits` not yet finished in `work_dir`; `num_workers` defaults to one per core."""
  if block_rows < 1 or part_blocks < 1 or unit_bytes < 1:
    raise ValueError(f'block_rows={block_rows}, part_blocks={part_blocks}, unit_bytes={unit_bytes}: need >= 1.')
  settings = units_lib.Settings(
    work_dir, tuple(int(c) for c in cardinalities), block_rows, part_blocks, writer_options(compression), skip_malformed
  )
  os.makedirs(os.path.join(work_dir, 'parts'), exist_ok=True)
  _check_plan(work_dir, splits, settings, unit_bytes)
  for name in os.listdir(os.path.join(work_dir, 'parts')):
    if name.endswith('.incomplete'):  # Left by a run that was stopped mid-part.
      os.remove(os.path.join(work_dir, 'parts', name))
  units = units_lib.plan(splits, unit_bytes)
  finished_before = {(p['unit'], p['part']) for unit in units for p in units_lib.finished_parts(work_dir, unit)}
  progress = _Progress(sum(unit.input_bytes() for unit in units), len(units), print_fn)
  by_unit = {}
  order = sorted(range(len(units)), key=lambda i: -units[i].input_bytes())  # Longest first: no long tail.
  num_workers = os.cpu_count() if num_workers is None else num_workers
  results = workers.run(_unit_task, [(units[i], settings) for i in order], num_workers, on_report=progress.add)
  for index, parts in results:
    by_unit[order[index]] = parts
    progress.unit_done()
  progress.finish()
  parts = [part for i in range(len(units)) for part in by_unit[i]]
  new = [part for part in parts if (part['unit'], part['part']) not in finished_before]
  return Result(parts, sum(p['rows'] for p in new), sum(p['cpu_s'] for p in new), progress.elapsed())


def _unit_task(task: tuple[units_lib.Unit, units_lib.Settings], state: None, report) -> list[dict[str, Any]]:
  del state
  unit, settings = task
  return units_lib.prepare_unit(unit, settings, report)


def _check_plan(
  work_dir: str, splits: Mapping[str, Sequence[files.Piece]], settings: units_lib.Settings, unit_bytes: int
) -> None:
  """Writes plan.json, or checks that the one there is this run's (same inputs, unchanged, same settings)."""
  plan = {
    'inputs': {
      split: [[*dataclasses.astuple(p), os.path.getsize(p.path), os.path.getmtime(p.path)] for p in pieces]
      for split, pieces in splits.items()
    },
    'cardinalities': list(settings.cardinalities),
    'block_rows': settings.block_rows,
    'part_blocks': settings.part_blocks,
    'unit_bytes': unit_bytes,
    'writer_options': settings.writer_options,
  }
  path = os.path.join(work_dir, 'plan.json')
  if os.path.exists(path):
    with open(path) as f:
      if json.load(f) != json.loads(json.dumps(plan)):
        raise ValueError(
          f'{work_dir} holds an unfinished preparation of other inputs or with other settings (its plan.json); '
          'delete that directory to start over, or rerun with what it was started with.'
        )
    return
  with open(path + '.incomplete', 'w') as f:
    json.dump(plan, f, indent=1)
  os.replace(path + '.incomplete', path)


class _Progress:
  """Rows and input bytes reported by the workers, printed as a line every few seconds."""

  def __init__(self, total_bytes: int, num_units: int, print_fn: Callable[[str], None]):
    self.total_bytes, self.num_units, self.print_fn = max(total_bytes, 1), num_units, print_fn
    self.rows = self.bytes = self.units_done = 0
    self.start = self.last_print = time.monotonic()

  def add(self, rows: int, input_bytes: int) -> None:
    self.rows += rows
    self.bytes += input_bytes
    if time.monotonic() - self.last_print >= _PROGRESS_EVERY_S:
      self._print()

  def unit_done(self) -> None:
    self.units_done += 1

  def elapsed(self) -> float:
    return time.monotonic() - self.start

  def finish(self) -> None:
    self._print(final=True)

  def _print(self, final: bool = False) -> None:
    self.last_print = now = time.monotonic()
    elapsed = max(now - self.start, 1e-9)
    share = min(self.bytes / self.total_bytes, 1.0)
    left = elapsed * (1 - share) / share if share > 0 else float('nan')
    left_text = 'done' if final else (f'left {_clock(left)}' if left == left else 'left ?')
    self.print_fn(
      f'prepare: {self.rows:,} rows  {self.rows / elapsed:,.0f} rows/s  {100 * share:.1f}% of the input  '
      f'units {self.units_done}/{self.num_units}  elapsed {_clock(elapsed)}  {left_text}'
    )


def _clock(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
