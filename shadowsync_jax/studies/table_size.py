"""Tables at their real size: memory, speed, save and restore of the same model across table sizes and placements.

  cells = table_size.default_cells(examples=300_000)
  rows = table_size.run(cells, root)          # two jobs a cell: train from scratch, then again (a restore)
  print(table_size.table(rows)); table_size.plot(rows, 'table_size.png')

The model is Criteo Kaggle's reference DLRM (`experiments/configs/criteo_kaggle.py`: bottom 13-512-256-64-16, top
367-512-256-1, SGD, batch 128 a replica) on the synthetic stream; only the tables change: Kaggle's cardinalities
capped at 300 rows (the default problem's tables), capped at 100k, Kaggle's own (33.8M rows, 2.2 GB) and
Terabyte's (MLPerf's 204M rows, 13 GB at width 16). A cell is a size, a placement (`sync.embedding_placement`;
sharded with either exchange), a replica count and how many processes hold them. Every cell runs
`experiments.train` (or `experiments.launch`) as a user does, under GNU time:

- the first job trains `examples` examples from scratch: examples/sec, the process's seconds from its start to
  its first step, its train state, its peak resident memory from outside, the blocking seconds of its final save;
- the second job, on the same workdir, finds the stream done: it restores the final checkpoint and evaluates,
  which times the restore and the peak memory of a restoring process.

A config whose state cannot fit is refused before anything is allocated; its row gives the `error:` line. The
bound docs/design.md §4 sets on a process's peak is 1.5 x its state + 2 GB.
"""

from collections.abc import Sequence
import pathlib
import re
import shutil
import statistics
from typing import Any, NamedTuple

from shadowsync_jax import config as config_lib
from shadowsync_jax.data.criteo import cardinalities
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import result_files

SIZES = {
  'default (300)': config_lib.CRITEO_SHAPED_CARDINALITIES,
  '100k': cardinalities.capped(cardinalities.KAGGLE, 100_000),
  'Kaggle': cardinalities.KAGGLE,
  'Terabyte': cardinalities.TERABYTE,
}
CONFIG = 'experiments/configs/criteo_kaggle.py'
TERABYTE_DIM16 = 'experiments/configs/criteo_terabyte.py:dim16'  # MLPerf's DLRM at width 16: its own model.
BOUND_MARGIN_BYTES = 2e9


class Cell(NamedTuple):
  size: str
  placement: str  # replicated, shared, sharded
  num_replicas: int = 1
  num_processes: int = 1
  batch_size: int = 128
  exchange: str = 'all_gather'
  algorithm: str = 'none'
  config: str = CONFIG  # Another config's model (its own batch size and algorithm: those above are not set).
  run: int = 0  # Repetitions of a cell are numbered, to pair them with another cell's.

  @property
  def label(self) -> str:
    placement = f'sharded ({self.exchange})' if self.placement == 'sharded' else self.placement
    where = f'{self.num_processes} x {self.num_replicas // self.num_processes}'
    if self.config != CONFIG:
      return f'{self.size}, {placement}, {where}, {pathlib.Path(self.config).name}'
    algorithm = '' if self.algorithm == 'none' else f', {self.algorithm}'
    run = f' (run {self.run + 1})' if self.run else ''
    return f'{self.size}, {placement}, {where}, batch {self.batch_size}{algorithm}{run}'


def default_cells(speed_runs: int = 3) -> list[Cell]:
  """The study's cells: the speed of real-size tables at one replica (batch 128 and 1024; Kaggle's and the
  100k-capped tables in turn, `speed_runs` times, paired), every placement at 8 replicas in one process where it
  fits, Terabyte's tables and Kaggle's sync algorithms across 2 processes x 4."""
  cells = [
    Cell(size, 'replicated', batch_size=batch, run=run)
    for batch in (128, 1024)
    for run in range(speed_runs)
    for size in ('100k', 'Kaggle')
  ]
  for size in ('default (300)', '100k', 'Kaggle'):
    cells += [Cell(size, placement, 8) for placement in ('replicated', 'shared')]
    cells += [Cell(size, 'sharded', 8, exchange=exchange) for exchange in ('all_gather', 'all_to_all')]
  cells += [Cell('Terabyte', 'replicated', 8, 2), Cell('Terabyte', 'sharded', 8, 2)]
  cells.append(Cell('Terabyte', 'sharded', 8, 2, config=TERABYTE_DIM16))
  cells += [Cell('Kaggle', 'sharded', 8, 2, algorithm=algorithm) for algorithm in ('none', 'shadow_ma', 'fr_ma')]
  return cells


def _args(cell: Cell, workdir: pathlib.Path, examples: int, eval_examples: int) -> list[str]:
  train = [
    f'--workdir={workdir}',
    f'--config={cell.config}',
    '--config.data.source=synthetic',
    f'--config.data.cardinalities={",".join(map(str, SIZES[cell.size]))}',
    f'--config.data.num_train_examples={examples}',
    f'--config.data.num_eval_examples={eval_examples}',
    f'--config.num_replicas={cell.num_replicas}',
    f'--config.sync.embedding_placement={cell.placement}',
    f'--config.sync.shard_exchange={cell.exchange}',
    '--config.train.progress_every_s=600',
  ]
  if cell.config == CONFIG:
    train += [f'--config.batch_size={cell.batch_size}', f'--config.sync.algorithm={cell.algorithm}']
  devices = cell.num_replicas // cell.num_processes
  if cell.num_processes == 1:
    return ['-m', 'experiments.train', f'--cpu_devices={devices}', *train]
  return ['-m', 'experiments.launch', f'--num_processes={cell.num_processes}', f'--cpu_devices={devices}', '--', *train]


def run_cell(cell: Cell, workdir: pathlib.Path, examples: int, eval_examples: int) -> dict[str, Any]:
  """The two jobs of `cell` (module docstring); a row of the study."""
  args = _args(cell, jobs.fresh(workdir), examples, eval_examples)
  row: dict[str, Any] = {'cell': cell.label, **cell._asdict()}
  trained = jobs.run(args, workdir)
  if trained.error is not None:
    return {**row, 'refused': trained.error, 'peak_rss_bytes': trained.peak_rss_bytes}
  summary = trained.summary
  checkpoints = summary.get('checkpoints') or {}
  restored = jobs.run(args, workdir)
  restore_checkpoints = restored.summary.get('checkpoints') or {}
  shutil.rmtree(workdir / 'checkpoints', ignore_errors=True)  # Up to 17 GB a cell: the disk would not hold them all.
  state = max(summary['state_bytes'])
  return {
    **row,
    'state_bytes': state,
    'state_bytes_per_process': summary['state_bytes'],
    'peak_rss_bytes': trained.peak_rss_bytes,
    'peak_rss_bytes_per_process': summary['peak_rss_bytes'],
    'bound_bytes': 1.5 * state + BOUND_MARGIN_BYTES,
    'examples_per_sec': summary['examples_per_sec'],
    'startup_s': summary['startup_s'],
    'save_blocking_s': checkpoints.get('save_blocking_s'),
    'saves_block': checkpoints.get('saves_block'),
    'restore_s': restore_checkpoints.get('restore_s'),
    'restore_peak_rss_bytes': restored.peak_rss_bytes,
    'eval_ne': summary['eval_ne'],
    'bayes_ne': summary['bayes_ne'],
    'sync_rounds': summary['sync_rounds'],
    'job_wall_s': trained.wall_s,
  }


def run(cells: Sequence[Cell], root: pathlib.Path, examples: int, eval_examples: int, log=print) -> list[dict]:
  rows = []
  for number, cell in enumerate(cells):
    rows.append(run_cell(cell, root / f'cell_{number}', examples, eval_examples))
    log(_line(rows[-1]))
  return rows


def _gb(num_bytes: float | None) -> str:
  return '' if num_bytes is None else f'{num_bytes / 1e9:.2f}'


def _line(row: dict[str, Any]) -> str:
  if 'refused' in row:
    return f'{row["cell"]}: refused: {row["refused"]}'
  return (
    f'{row["cell"]}: state {_gb(row["state_bytes"])} GB, peak {_gb(row["peak_rss_bytes"])} GB, '
    f'{row["examples_per_sec"]:,.0f} ex/s, first step after {row["startup_s"]:.1f} s'
  )


def speed_ratios(rows: Sequence[dict[str, Any]]) -> list[tuple[int, list[float]]]:
  """(batch, [Kaggle's examples/sec over the 100k-capped tables' of the same run number]) at one replica."""
  one = {(r['size'], r['batch_size'], r['run']): r for r in rows if r['num_replicas'] == 1 and 'refused' not in r}
  ratios: dict[int, list[float]] = {}
  for size, batch, run in sorted(one):
    if size == 'Kaggle' and ('100k', batch, run) in one:
      capped = one[('100k', batch, run)]['examples_per_sec']
      ratios.setdefault(batch, []).append(one[(size, batch, run)]['examples_per_sec'] / capped)
  return sorted(ratios.items())


def _seconds(value: float | None) -> str:
  """A time, or '-' where the run reported none (a run that wrote a study's rows must not be lost to one)."""
  return '-' if value is None else f'{value:.1f}'


def table(rows: Sequence[dict[str, Any]]) -> str:
  lines = [
    '| cell | state GB (a process) | peak RSS GB | bound GB | examples/sec | first step s | save s | restore s '
    '| restore peak GB | eval NE |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    if 'refused' in r:
      lines.append(f'| {r["cell"]} | refused: {r["refused"]} | | | | | | | | |')
      continue
    save = f'{r["save_blocking_s"]:.1f}' + ('' if r['saves_block'] else ' (async)') if r['save_blocking_s'] else ''
    lines.append(
      f'| {r["cell"]} | {_gb(r["state_bytes"])} | {_gb(r["peak_rss_bytes"])} | {_gb(r["bound_bytes"])} '
      f'| {r["examples_per_sec"]:,.0f} | {r["startup_s"]:.1f} | {save} '
      f'| {_seconds(r["restore_s"])} | {_gb(r["restore_peak_rss_bytes"])} | {r["eval_ne"]:.4f} |'
    )
  for batch, ratios in speed_ratios(rows):
    runs = ', '.join(f'{r:.2f}' for r in ratios)
    lines += [
      '',
      f'Kaggle over 100k-capped tables, one replica, batch {batch}: median {statistics.median(ratios):.2f} '
      f'(runs in turn: {runs})',
    ]
  return '\n'.join(lines)


def plot(rows: Sequence[dict[str, Any]], path: str | pathlib.Path) -> pathlib.Path:
  """Peak memory against state and the bound, and examples/sec, per cell that ran."""
  import matplotlib  # pylint: disable=g-import-not-at-top  (only the plot needs it)

  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top

  ran = [r for r in rows if 'refused' not in r]
  labels = [r['cell'] for r in ran]
  figure, (memory_axes, speed_axes) = pyplot.subplots(1, 2, figsize=(14, 0.35 * len(ran) + 2), sharey=True)
  y = range(len(ran))
  memory_axes.barh([i + 0.2 for i in y], [r['peak_rss_bytes'] / 1e9 for r in ran], 0.4, label='peak RSS')
  memory_axes.barh([i - 0.2 for i in y], [r['state_bytes'] / 1e9 for r in ran], 0.4, label='train state')
  memory_axes.scatter([r['bound_bytes'] / 1e9 for r in ran], list(y), marker='|', s=200, c='k', label='bound')
  memory_axes.set_xscale('log')
  memory_axes.set_xlabel('GB (a process; log scale)')
  memory_axes.legend(loc='lower right')
  speed_axes.barh(list(y), [r['examples_per_sec'] for r in ran], 0.6)
  speed_axes.set_xlabel('examples/sec')
  memory_axes.set_yticks(list(y), labels, fontsize=8)
  figure.tight_layout()
  path = pathlib.Path(path)
  figure.savefig(path, dpi=100)
  pyplot.close(figure)
  return path


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): Kaggle's tables in one process (peak, speed against 100k-row
  tables) and Terabyte's sharded."""
  rows = [r for r in result_files.rows(path) if r.get('state_bytes')]
  kaggle_one = [r for r in rows if r['size'] == 'Kaggle' and r['num_replicas'] == 1 and r['num_processes'] == 1]
  peaks = [r['peak_rss_bytes'] / 1e9 for r in kaggle_one]
  terabyte = [r for r in rows if r['size'] == 'Terabyte' and r['placement'] == 'sharded']
  tb_peaks = [r['peak_rss_bytes'] / 1e9 for r in terabyte]
  text = (result_files.REPO_ROOT / path).read_text()
  ratios = re.findall(r'batch (\d+): median (\d\.\d\d)', text)
  return (
    f"Criteo Kaggle's tables ({kaggle_one[0]['state_bytes'] / 1e9:.2f} GB of state) train in one process at a peak "
    f'of {min(peaks):.2f}-{max(peaks):.2f} GB, at '
    + ', '.join(f'{ratio} (batch {batch})' for batch, ratio in ratios)
    + " of the same model's speed with 100k-row tables (medians); Terabyte's sharded over 2 processes x 4 devices "
    f'at a peak of {min(tb_peaks):.2f}-{max(tb_peaks):.2f} GB a process'
  )
