"""Scaling sweeps: replica counts x sync algorithms over one fixed training stream, as a CSV and plots.

  cells = sweep.grid(replicas=(1, 2, 4, 8), algorithms=('none', 'fr_ma', 'shadow_ma'))
  rows = sweep.run(cells, base_config, output_dir, train_fn=train.train_and_evaluate, num_devices=8)
  # output_dir/sweep.csv (one row per cell), output_dir/{eval_ne,examples_per_sec,sync_gap}.png,
  # output_dir/<algorithm>/R<replicas>/ the cell's workdir: `tensorboard --logdir=output_dir` compares them all.

Every cell trains on the same `data.num_train_examples`, so with R replicas each reads 1/R of the stream: adding
replicas buys throughput and costs quality, the trade the ShadowSync paper (Zheng et al. 2020, arXiv:2003.03477)
plots as model quality and throughput against the number of trainers. A finished cell is read back from its
`summary.json`, so rerunning an interrupted sweep with the same `output_dir` goes on where it stopped.
Nothing here imports jax: the caller passes the training function. The plots read rows (or `read_csv`) and draw on
matplotlib `Figure` objects, never pyplot, so they leave a notebook's backend alone.
"""

from collections.abc import Callable, Sequence
import csv
import dataclasses
import json
import pathlib
import time
from typing import Any

from matplotlib import figure
import ml_collections

from shadowsync_jax import config as config_lib
from shadowsync_jax.metrics import progress
from shadowsync_jax.metrics import writer as metric_writer
from shadowsync_jax.studies import provenance
from shadowsync_jax.studies import result_files

CSV_FILENAME = 'sweep.csv'
_COMMENT = '# '  # Lines above the header: the provenance of a finished sweep (`write_csv`).
CSV_COLUMNS = (
  'replicas',
  'algorithm',
  'eval_ne',
  'ne_vs_floor_pct',
  'eval_auc',
  'eval_logloss',
  'bayes_ne',
  'examples_per_sec',
  'examples_per_sec_vs_none',
  'sync_rounds',
  'mean_sync_gap',
  'max_sync_gap',
  'mean_round_latency_s',
  'replica_divergence',
  'train_examples',
  'wall_time_s',
  'workdir',
)
_INT_COLUMNS = ('replicas', 'sync_rounds', 'train_examples')
_TEXT_COLUMNS = ('algorithm', 'workdir')
PLOT_FILENAMES = ('eval_ne.png', 'examples_per_sec.png', 'sync_gap.png')

Row = dict[str, Any]
TrainFn = Callable[[ml_collections.ConfigDict, pathlib.Path], dict[str, Any]]


class SweepError(ValueError):
  """A grid that cannot run as asked (its message says what to change)."""


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid: `replicas` trainers synchronized by `algorithm`."""

  replicas: int
  algorithm: str

  @property
  def name(self) -> str:
    """The cell's workdir under the output dir, and its run name in TensorBoard."""
    return f'{self.algorithm}/R{self.replicas}'

  @property
  def label(self) -> str:
    return f'{self.algorithm} R={self.replicas}'


def grid(replicas: Sequence[int], algorithms: Sequence[str]) -> list[Cell]:
  """Every (replica count, algorithm) pair, by replica count, in the order given.

  One replica has nothing to synchronize, so R=1 is a single cell (`none`), drawn as the first point of every
  algorithm's curve.
  """
  replicas, algorithms = sorted(set(int(r) for r in replicas)), list(dict.fromkeys(algorithms))
  if not replicas or replicas[0] < 1:
    raise SweepError(f'replica counts must be positive; got {replicas}.')
  unknown = [a for a in algorithms if a not in config_lib.sync_algorithms()]
  if not algorithms or unknown:
    raise SweepError(
      f'unknown algorithms {unknown or algorithms}; choose from {", ".join(config_lib.sync_algorithms())}.'
    )
  return [Cell(r, a) for r in replicas for a in (['none'] if r == 1 else algorithms)]


def cell_config(base_config: ml_collections.ConfigDict, cell: Cell) -> ml_collections.ConfigDict:
  """`base_config` with the cell's replica count and algorithm; the training stream stays the same length."""
  config = base_config.copy_and_resolve_references()
  config.num_replicas = cell.replicas
  config.sync.algorithm = cell.algorithm
  return config


def run(
  cells: Sequence[Cell],
  base_config: ml_collections.ConfigDict,
  output_dir: str | pathlib.Path,
  train_fn: TrainFn,
  num_devices: int,
  plot_note: str = '',
  print_fn: Callable[[str], None] = print,
  clock: Callable[[], float] = time.monotonic,
  command: str | None = None,
) -> list[Row]:
  """Trains every cell (reading back cells finished by an earlier run), writes the CSV as it goes, then the plots.
  With the sweep's `command`, the finished CSV records its provenance (`studies.provenance`).

  Every cell's config is validated against `num_devices` before the first one trains, so a bad grid fails at
  once. `plot_note` goes under the throughput figure's title.
  """
  output_dir = pathlib.Path(output_dir)
  if base_config.train.stop_at_step:
    raise SweepError('train.stop_at_step must be 0 in a sweep: every cell runs its whole stream.')
  configs = [cell_config(base_config, cell) for cell in cells]
  for cell, config in zip(cells, configs):
    try:
      config_lib.validate(config, num_devices=num_devices)
    except config_lib.ConfigError as error:
      raise SweepError(f'cell {cell.label}: {error}') from error
  rows, trained_seconds, trained_cells, start = [], 0.0, 0, clock()
  for index, (cell, config) in enumerate(zip(cells, configs), 1):
    workdir = output_dir / cell.name
    position = f'cell {index}/{len(cells)}: {cell.label}'
    summary = _finished_summary(workdir, config, cell)
    if summary is not None:
      print_fn(f'{position}: finished earlier, read from {workdir}/summary.json')
    else:
      print_fn(
        f'{position} ({config.data.num_train_examples:,} examples, {cell.replicas} x batch '
        f'{config.batch_size}) -> {workdir}'
      )
      cell_start = clock()
      summary = train_fn(config, workdir)
      cell_seconds = clock() - cell_start
      trained_seconds, trained_cells = trained_seconds + cell_seconds, trained_cells + 1
      left = trained_seconds / trained_cells * (len(cells) - index)
      print_fn(
        f'{position} done in {progress.format_duration(cell_seconds)}: {_result_text(summary)}; sweep '
        f'elapsed {progress.format_duration(clock() - start)}, left about {progress.format_duration(left)}'
      )
    rows.append(row_from_summary(cell, summary, workdir))
    write_csv(rows, output_dir / CSV_FILENAME)
  if command is not None:
    write_csv(rows, output_dir / CSV_FILENAME, provenance.collect(command))
  plot_all(rows, output_dir, plot_note)
  return rows


def _finished_summary(workdir: pathlib.Path, config: ml_collections.ConfigDict, cell: Cell) -> dict[str, Any] | None:
  """The summary of a cell an earlier sweep finished with the same config; None when it has not finished."""
  path = workdir / 'summary.json'
  if not path.exists():
    return None
  summary = json.loads(path.read_text())
  expected = json.loads(json.dumps(config.to_dict(), default=metric_writer.jsonable))
  if summary.get('config') != expected:
    differing = sorted(_differing_keys(summary.get('config') or {}, expected))
    raise SweepError(
      f'cell {cell.label}: {path} was written by a run with a different config (differs in '
      f'{", ".join(differing[:5]) or "its layout"}); use another output dir or delete {workdir}.'
    )
  return summary


def _differing_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = '') -> list[str]:
  keys = []
  for key in set(old) | set(new):
    if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
      keys += _differing_keys(old[key], new[key], f'{prefix}{key}.')
    elif old.get(key) != new.get(key):
      keys.append(f'{prefix}{key}')
  return keys


def _result_text(summary: dict[str, Any]) -> str:
  if 'eval_ne' not in summary:
    raise SweepError(f'the run stopped before the end of its stream ({summary}); a sweep needs whole runs.')
  floor = summary.get('bayes_ne')
  vs_floor = f' ({100 * (summary["eval_ne"] / floor - 1):+.1f}% over the floor)' if floor else ''
  eps = summary.get('examples_per_sec')
  return f'eval NE {summary["eval_ne"]:.4f}{vs_floor}, ' + ('n/a ex/s' if eps is None else f'{eps:,.0f} ex/s')


def row_from_summary(cell: Cell, summary: dict[str, Any], workdir: str | pathlib.Path) -> Row:
  """The CSV row of one cell; `examples_per_sec_vs_none` is filled in by `write_csv` from the whole grid."""
  row = {column: summary.get(column) for column in CSV_COLUMNS}
  floor = summary.get('bayes_ne')
  row.update(
    replicas=cell.replicas,
    algorithm=cell.algorithm,
    workdir=str(workdir),
    ne_vs_floor_pct=100 * (summary['eval_ne'] / floor - 1) if floor else None,
  )
  return row


def with_ratio_to_none(rows: Sequence[Row]) -> list[Row]:
  """Rows with `examples_per_sec_vs_none`: examples/sec over `none`'s at the same replica count (docs/design.md §6)."""
  none_eps = {r['replicas']: r['examples_per_sec'] for r in rows if r['algorithm'] == 'none'}

  def ratio(row: Row) -> float | None:
    reference = none_eps.get(row['replicas'])
    return row['examples_per_sec'] / reference if row['examples_per_sec'] and reference else None

  return [{**r, 'examples_per_sec_vs_none': ratio(r)} for r in rows]


def write_csv(rows: Sequence[Row], path: str | pathlib.Path, record: dict[str, Any] | None = None) -> None:
  """One line per cell, columns `CSV_COLUMNS`; a missing value (no floor, no sync gap) is an empty field. With a
  provenance `record` (the finished sweep's), comment lines ('# ') above the header say where it came from."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with path.open('w', newline='', encoding='utf-8') as csv_file:
    if record is not None:
      for line in (f'`{record["command"]}`', provenance.line(record), provenance.comment(record)):
        csv_file.write(f'{_COMMENT}{line}\n')
    writer = csv.DictWriter(csv_file, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for row in with_ratio_to_none(rows):
      writer.writerow({column: '' if row.get(column) is None else row[column] for column in CSV_COLUMNS})


def read_csv(path: str | pathlib.Path) -> list[Row]:
  """The rows `write_csv` wrote, with numbers as numbers and empty fields as None."""

  def parse(column: str, text: str) -> Any:
    if column in _TEXT_COLUMNS:
      return text
    if text == '':
      return None
    return int(text) if column in _INT_COLUMNS else float(text)

  with pathlib.Path(path).open(newline='', encoding='utf-8') as csv_file:
    lines = (line for line in csv_file if not line.startswith(_COMMENT))
    return [{column: parse(column, text) for column, text in line.items()} for line in csv.DictReader(lines)]


# Plots. One colour per sync rule, solid for the foreground driver and dashed for the background (shadow) one.
_RULE_COLORS = {'none': 'tab:gray', 'sync_sgd': 'black', 'ma': 'tab:blue', 'ea': 'tab:orange', 'bmuf': 'tab:green'}


def _style(algorithm: str) -> dict[str, Any]:
  driver, _, rule = algorithm.partition('_')
  if driver in ('fr', 'shadow'):
    return {
      'color': _RULE_COLORS.get(rule),
      'linestyle': '--' if driver == 'shadow' else '-',
      'marker': 's' if driver == 'shadow' else 'o',
    }
  return {'color': _RULE_COLORS.get(algorithm), 'linestyle': ':', 'marker': '^'}


def _curves(rows: Sequence[Row], column: str) -> dict[str, tuple[list[int], list[float]]]:
  """Per algorithm, (replica counts, values) in replica order; the R=1 cell starts every curve."""
  single = [r for r in rows if r['replicas'] == 1 and r.get(column) is not None]
  curves = {}
  for algorithm in dict.fromkeys(r['algorithm'] for r in rows if r['replicas'] > 1):
    points = single + [
      r for r in rows if r['algorithm'] == algorithm and r['replicas'] > 1 and r.get(column) is not None
    ]
    points.sort(key=lambda r: r['replicas'])
    curves[algorithm] = ([r['replicas'] for r in points], [r[column] for r in points])
  if not curves and single:
    curves['none'] = ([1], [single[0][column]])
  return curves


def _replica_axis(ax, rows: Sequence[Row]) -> None:
  ticks = sorted({r['replicas'] for r in rows})
  ax.set_xscale('log', base=2)
  ax.set_xticks(ticks, [str(t) for t in ticks])
  ax.set_xlabel('replicas (trainers), total training data fixed')
  ax.grid(True, alpha=0.3)


def _training_text(rows: Sequence[Row]) -> str:
  examples = sorted({r['train_examples'] for r in rows if r.get('train_examples')})
  return f'{examples[0]:,} training examples in every cell' if len(examples) == 1 else 'training examples vary'


def plot_eval_ne(rows: Sequence[Row], path: str | pathlib.Path) -> figure.Figure:
  """Eval NE against replica count, one curve per algorithm, with the Bayes NE floor as a horizontal line."""
  fig = figure.Figure(figsize=(8, 5))
  ax = fig.subplots()
  for algorithm, (xs, ys) in _curves(rows, 'eval_ne').items():
    ax.plot(xs, ys, label=algorithm, **_style(algorithm))
  for floor in sorted({r['bayes_ne'] for r in rows if r.get('bayes_ne') is not None}):
    ax.axhline(floor, color='tab:red', linewidth=1.5, label=f'Bayes NE floor {floor:.4f}')
  _replica_axis(ax, rows)
  ax.set_ylabel('eval NE (lower is better)')
  ax.set_title(f'Model quality as trainers are added ({_training_text(rows)})', fontsize=10)
  ax.legend(fontsize=8, ncol=2)
  return _saved(fig, path)


def plot_examples_per_sec(rows: Sequence[Row], path: str | pathlib.Path, note: str = '') -> figure.Figure:
  """Examples/sec against replica count per algorithm, and its ratio to `none` at the same count; `note` goes
  under the title (say there when the replicas share cores, so the total cannot grow)."""
  rows = with_ratio_to_none(rows)
  fig = figure.Figure(figsize=(12, 5))
  absolute_ax, ratio_ax = fig.subplots(1, 2)
  for ax, column, label in (
    (absolute_ax, 'examples_per_sec', 'examples/sec, all replicas together'),
    (ratio_ax, 'examples_per_sec_vs_none', "examples/sec / none's at the same R"),
  ):
    for algorithm, (xs, ys) in _curves(rows, column).items():
      ax.plot(xs, ys, label=algorithm, **_style(algorithm))
    _replica_axis(ax, rows)
    ax.set_ylabel(label)
  absolute_ax.set_ylim(bottom=0)
  ratio_ax.axhline(1.0, color='tab:gray', linewidth=0.8)
  ratio_ax.legend(fontsize=8, ncol=2)
  fig.suptitle('Throughput as trainers are added' + (f'\n{note}' if note else ''), fontsize=10)
  return _saved(fig, path)


def plot_sync_gap(rows: Sequence[Row], path: str | pathlib.Path) -> figure.Figure:
  """Mean sync gap (bars) and max sync gap (ticks) of every algorithm but `none`, one bar per replica count > 1;
  a cell whose run merged no round says so where its bar would be."""
  synced = [r for r in rows if r['replicas'] > 1 and r['algorithm'] != 'none']
  algorithms = list(dict.fromkeys(r['algorithm'] for r in synced))
  replica_counts = sorted({r['replicas'] for r in synced})
  fig = figure.Figure(figsize=(max(6, 1.3 * len(algorithms) + 2), 5))
  ax = fig.subplots()
  width = 0.8 / max(len(replica_counts), 1)
  for offset, count in enumerate(replica_counts):
    bars = [
      (i + (offset - (len(replica_counts) - 1) / 2) * width, r)
      for i, a in enumerate(algorithms)
      for r in synced
      if r['algorithm'] == a and r['replicas'] == count
    ]
    with_gap = [(x, r) for x, r in bars if r.get('mean_sync_gap') is not None]
    ax.bar(
      [x for x, _ in with_gap], [r['mean_sync_gap'] for _, r in with_gap], width, label=f'R={count}', color=f'C{offset}'
    )
    if with_gap:
      ax.scatter(
        [x for x, _ in with_gap], [r['max_sync_gap'] for _, r in with_gap], marker='_', s=200, color='black', zorder=3
      )
    for x, _ in (xr for xr in bars if xr[1].get('mean_sync_gap') is None):
      ax.text(x, 0, 'no round', rotation=90, ha='center', va='bottom', fontsize=8, color=f'C{offset}')
  ax.set_xticks(range(len(algorithms)), algorithms, rotation=20, ha='right')
  ax.set_ylabel('training steps between merges')
  ax.set_title('Sync gap per algorithm: mean (bars), max (black ticks)', fontsize=10)
  ax.grid(True, axis='y', alpha=0.3)
  if replica_counts:
    ax.legend(fontsize=8)
  else:
    ax.text(0.5, 0.5, 'no cell with more than one replica', ha='center', transform=ax.transAxes)
  return _saved(fig, path)


def plot_all(rows: Sequence[Row], output_dir: str | pathlib.Path, note: str = '') -> list[pathlib.Path]:
  """The three figures (`PLOT_FILENAMES`) into `output_dir`; returns their paths."""
  paths = [pathlib.Path(output_dir) / name for name in PLOT_FILENAMES]
  plot_eval_ne(rows, paths[0])
  plot_examples_per_sec(rows, paths[1], note)
  plot_sync_gap(rows, paths[2])
  return paths


def _saved(fig: figure.Figure, path: str | pathlib.Path) -> figure.Figure:
  """Writes `fig` as a PNG at `path` and returns it (tests read the plotted data back from it)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return fig


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): `none`'s NE above the floor from 1 replica to the most,
  and the synced algorithms' at the most."""
  rows = read_csv(result_files.REPO_ROOT / path)
  top = max(r['replicas'] for r in rows)
  at = lambda algorithm, replicas: next(
    r['ne_vs_floor_pct'] for r in rows if r['algorithm'] == algorithm and r['replicas'] == replicas
  )
  synced = [r['ne_vs_floor_pct'] for r in rows if r['replicas'] == top and r['algorithm'] != 'none']
  return (
    f"with the data fixed, `none`'s NE goes from {at('none', 1):.1f}% above the floor at 1 replica to "
    f'{at("none", top):.1f}% at {top}; the synced algorithms stay at {min(synced):.1f}-{max(synced):.1f}% at {top}'
  )
