"""The CPR study on real failures: a job of processes killed on seeded schedules under each recovery mode.

  rows = real_failures.run(root, SIZES['default'], modes=('full', 'partial', 'cpr_mfu', 'cpr'), kill_mtbf_s=20.0,
                           kill_seeds=(0, 1, 2))
  print(real_failures.table(rows)); real_failures.by_mode(rows)   # per run; per mode over the seeds (JSON)

Every run is `experiments.launch` with `--max_restarts` and the same `--kill_mtbf_s`/`--kill_seed` for every mode:
the launcher SIGKILLs a random process at exponential wall-clock times, the job comes back (a warm standby of the
next start waits ready), each process restores what its mode says (`recovery.real`). A size (`SIZES`) is the job:
`default`, the default problem on 2 processes x 1 replica each pinned to a core (like two hosts); `kaggle`, Criteo
Kaggle's real cardinalities (synthetic data), tables sharded over 2 processes x 4 devices, so a death loses real
table shards. A run without failures and without recovery (`recovery.mode='none'`) is the reference: its wall
time the failure-free time, its eval NE the quality to keep. `recovery.mtbf_steps`, the MTBF the modes plan their
checkpoints for, is the kill schedule's mean in the reference's steps.

The study splits each run's overhead as CPR does (`recovery.overhead`, from the job's whole history once it ended,
at the reference's step time): checkpoint-related (blocking saves; the steps' slowdown at pace, charged to
recovery's boundary work on the training thread, background writes, priority saves' threads and live copies by the
CPU each took on the processes' cores, at most that; restores; work trained again) and restarts (from each death to
every process training again, restores left out; the warm-ups back to pace; the warm standbys' CPU); steps slowed
beyond all that stand apart (`slower_s`), as do the first start's start-up and the last one's end beyond the
reference's (`edges_s`: `overhead.edges`, noise where nothing differs). It gives each as a share of the
reference's own steps time (`checkpoint_overhead_pct`, `restart_overhead_pct`): one denominator for every mode and
seed; the wall-clock overhead against the reference is beside them, and what of it no part explains
(`unexplained_s`).

A run that ended leaves its summary, history and metrics; its saved state (checkpoints, live states, priority
rows: `SAVED_STATE`) is deleted, since at Kaggle size a run leaves 9-16 GB of it and three seeds of three modes
filled this machine's disk (every later run then crashed). A job that failed keeps everything, to be read.
"""

import dataclasses
import json
import pathlib
import shutil
import sys
from typing import Any

from shadowsync_jax.parallel import history
from shadowsync_jax.recovery import overhead
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import result_files
from shadowsync_jax.studies import spread


@dataclasses.dataclass(frozen=True)
class Size:
  """A study's job: the launcher's flags and the training flags every run shares."""

  name: str
  launch_flags: tuple[str, ...]
  train_flags: tuple[str, ...]
  description: str
  # Mean seconds between kills: each run meets about three or more failures (the reference trains 1.5-2.5 minutes).
  kill_mtbf_s: float


SIZES = {
  'default': Size(
    'default',
    ('--num_processes=2', '--cpu_devices=1', '--pin_cpus'),
    (),
    '2 processes x 1 replica, default problem, each process pinned to one core',
    20.0,
  ),
  'kaggle': Size(
    'kaggle',
    ('--num_processes=2', '--cpu_devices=4', '--pin_cpus'),
    (
      '--config=experiments/configs/criteo_kaggle.py',
      '--config.data.source=synthetic',
      '--config.num_replicas=8',
      '--config.sync.embedding_placement=sharded',
      '--config.data.num_train_examples=2500000',
      '--config.data.num_eval_examples=65536',
    ),
    "Criteo Kaggle's cardinalities (synthetic data), tables sharded over 2 processes x 4 devices, each process "
    'pinned to one core',
    60.0,  # Full recovery's checkpoint-related overhead then 5-10% (CPR's regime); 45 s measured 10.5-15.9%.
  ),
}


DEFAULT_MODES = {
  'default': ('full', 'partial', 'cpr_mfu', 'cpr_ssu', 'cpr'),
  'kaggle': ('full', 'full:whole', 'partial', 'cpr_mfu', 'cpr_ssu', 'cpr'),
}
SAVED_STATE = ('checkpoints', 'live', 'priority_rows')  # What a run that ended no longer needs.
ROW_FILE = 'study_row.json'  # A run's row, written when it ended: a study stopped can go on (`run(reuse=True)`).


WHOLE = ':whole'  # A mode's suffix: its checkpoints whole (`recovery.incremental=false`), at the same kill times.
# The headline's: cpr_mfu/ssu's share of full recovery's checkpoint-related overhead, a run's mean restart (s), a
# run's NE against the reference's (%).
# Issue 65's: checkpoint-related overhead over incremental full recovery's (partial, the CPR variants) and over
# whole-checkpoint full recovery's; wall overhead over full recovery's; a restart; the NE.
TARGET = {
  'partial_vs_full': 0.6,
  'cpr_vs_full': 0.8,
  'vs_whole': 0.2,
  'partial_wall_vs_full': 1.0,
  'cpr_wall_vs_full': 1.1,
  'restart_s': 2.0,
  'ne_pct': 0.1,
}
_CPR_VARIANTS = ('cpr_mfu', 'cpr_ssu')


def mode_flags(mode: str) -> list[str]:
  """The training flags of a study mode: `recovery.mode`, and `MODE:whole` incremental checkpoints off."""
  recovery_mode = mode.removesuffix(WHOLE)
  return [f'--config.recovery.mode={recovery_mode}'] + (
    ['--config.recovery.incremental=false'] if mode != recovery_mode else []
  )


def checkpoint_writes(workdir: pathlib.Path, wall_s: float) -> dict[str, Any]:
  """What a job's checkpoints wrote over all its starts (its history's saves): per process, the saves of each kind
  (whole, baseline, differential), the mean share of its embedding rows a checkpoint wrote, and MB written a second
  of the job's wall time."""
  saves = [r for r in history.read(workdir) if r.get('event') == 'save' and r.get('kind') == 'checkpoint']
  processes = sorted({r['process'] for r in saves})
  per_process = {p: [r for r in saves if r['process'] == p and r.get('rows_held')] for p in processes}
  kinds = ('whole', 'baseline', 'differential')
  return {
    'checkpoint_writes': {
      str(p): {k: sum(r['written'] == k for r in rs) for k in kinds} for p, rs in per_process.items()
    },
    'rows_written_share': [
      sum(r['rows_written'] / r['rows_held'] for r in rs) / len(rs) if rs else None for rs in per_process.values()
    ],
    'mb_written_per_s': [sum(r['bytes_written'] or 0 for r in rs) / 1e6 / wall_s for rs in per_process.values()],
  }


def run_job(
  workdir: pathlib.Path, launch_flags: list[str], train_flags: list[str], reuse: bool = False
) -> dict[str, Any]:
  """One `experiments.launch` job; returns its summary.json with the launcher's wall time and what its checkpoints
  wrote (`checkpoint_writes`), and deletes its saved state (`SAVED_STATE`). The row is kept in `workdir/ROW_FILE`:
  with `reuse`, a run that has one is read, not run again; a run without one starts in an emptied `workdir`."""
  if reuse and (workdir / ROW_FILE).exists():
    return json.loads((workdir / ROW_FILE).read_text())
  jobs.fresh(workdir)  # A run cut short left checkpoints: its job would resume from them.
  job = jobs.launch(workdir, launch_flags, train_flags)
  if job.error:
    raise RuntimeError(f'the job in {workdir} refused its config: {job.error}')
  for name in SAVED_STATE:
    shutil.rmtree(workdir / name, ignore_errors=True)
  row = {
    **job.summary,
    'job_wall_s': job.wall_s,
    'job_peak_rss_bytes': job.peak_rss_bytes,
    **checkpoint_writes(workdir, job.wall_s),
  }
  (workdir / ROW_FILE).write_text(json.dumps(row))
  return row


def run(
  root: str | pathlib.Path,
  size: Size,
  modes: tuple[str, ...] = ('full', 'partial', 'cpr_mfu', 'cpr_ssu', 'cpr'),
  kill_mtbf_s: float = 20.0,
  kill_seeds: tuple[int, ...] = (0, 1, 2),
  max_restarts: int = 30,
  train_flags: tuple[str, ...] = (),
  out=sys.stdout,
  reuse: bool = False,
) -> list[dict[str, Any]]:
  """The reference, then every mode on each seed's kill schedule; one row per run (the reference first). With
  `reuse`, the runs that ended in `root` before (a study stopped, or run with fewer seeds) are read, not run again."""
  root = pathlib.Path(root)
  flags = [*size.train_flags, *train_flags]
  out.write('--- no failures, no recovery (the reference)\n')
  out.flush()
  reference = run_job(root / 'reference', list(size.launch_flags), flags, reuse)
  steps_per_s = reference['train_steps'] / steps_time(reference)
  rows = [{**reference, 'label': 'no failures', 'mode': 'none', 'kill_seed': None, 'overhead_pct': 0.0}]
  mtbf_steps = kill_mtbf_s * steps_per_s
  for seed in kill_seeds:
    kills = [f'--max_restarts={max_restarts}', f'--kill_mtbf_s={kill_mtbf_s}', f'--kill_seed={seed}']
    for mode in modes:
      out.write(f'--- {mode}, kill seed {seed}\n')
      out.flush()
      job_flags = [*flags, *mode_flags(mode), f'--config.recovery.mtbf_steps={mtbf_steps:.1f}']
      workdir = root / f'{mode.replace(":", "_")}_seed{seed}'
      summary = run_job(workdir, [*size.launch_flags, *kills], job_flags, reuse)
      wall_pct = 100 * (summary['job_wall_s'] / reference['job_wall_s'] - 1)
      rows.append(
        {**summary, 'label': f'{mode}, seed {seed}', 'mode': mode, 'kill_seed': seed, 'overhead_pct': wall_pct}
      )
  reference_steps_s = steps_time(reference)
  reference_edges = overhead.edges(history.read(root / 'reference'))
  for row in rows[1:]:  # The job's whole history, its last start's launcher record too (the summary's lacks it).
    workdir = root / f'{row["mode"].replace(":", "_")}_seed{row["kill_seed"]}'
    records = history.read(workdir)
    row['overhead_s'] = overhead.split(records, reference_steps_s / reference['train_steps'])
    row_edges = overhead.edges(records)
    if row_edges is not None and reference_edges is not None:  # Its start-up and end beyond the reference's.
      row['overhead_s']['edges_s'] = sum(row_edges[k] - reference_edges[k] for k in ('startup_s', 'end_s'))
  for row in rows:
    row['ne_vs_reference_pct'] = 100 * (row['eval_ne'] / reference['eval_ne'] - 1)
    row['mtbf_steps'] = mtbf_steps
    split = overhead_split(row)
    for kind in ('checkpoint', 'restart'):
      seconds = split.get(f'{kind}_s')
      row[f'{kind}_overhead_pct'] = None if seconds is None else 100 * seconds / reference_steps_s
  return rows


def vs_full(
  row: dict[str, Any], rows: list[dict[str, Any]], full_mode: str = 'full', wall: bool = False
) -> float | None:
  """A run's checkpoint-related overhead (`wall`: its wall overhead) over that of `full_mode` ('full': incremental
  checkpoints; 'full:whole') on the same kill seed (None: no such run, or its overhead is not above zero: a full
  run that met no failure can end no slower than the reference, -0.3% once, and a ratio over it read -8.7)."""
  full = next((r for r in rows if r['mode'] == full_mode and r['kill_seed'] == row['kill_seed']), None)
  figure = (lambda r: r['overhead_pct']) if wall else (lambda r: share(r, 'checkpoint'))
  if full is None or figure(full) is None or figure(full) <= 0 or figure(row) is None:
    return None
  return figure(row) / figure(full)


def share(row: dict[str, Any], kind: str) -> float | None:
  """A run's checkpoint-related or restart overhead (`kind`), % of the reference's steps time; in a result file
  written before the study gave that, the summary's own share (of the pace of the run's last start)."""
  return row.get(f'{kind}_overhead_pct', row.get(f'recovery_{kind}_overhead_pct'))


def steps_time(summary: dict[str, Any]) -> float:
  """The reference's seconds of training steps: its steps at its slowest process's pace."""
  return (
    summary['train_steps']
    * summary['config']['num_replicas']
    * summary['config']['batch_size']
    / (summary['examples_per_sec'])
  )


def overhead_split(row: dict[str, Any]) -> dict[str, float]:
  """A run's overhead by part (`recovery.overhead.split`): the study's, from the job's whole history at the
  reference's step time; in a result file written before the study gave that, the summary's; {} for none."""
  return row.get('overhead_s') or (row.get('recovery') or {}).get('overhead_s') or {}


def unexplained_s(row: dict[str, Any], reference: dict[str, Any]) -> float | None:
  """Seconds of a run's wall time over the reference's that no counted part explains: the wall overhead less its
  checkpoint-related and restart parts, its steps slowed by nothing recovery ran, and its start-up and end beyond
  the reference's (None where the run has no split)."""
  split = overhead_split(row)
  if 'checkpoint_s' not in split or 'restart_s' not in split:
    return None
  counted = split['checkpoint_s'] + split['restart_s'] + split.get('slower_s', 0.0) + split.get('edges_s', 0.0)
  return row['job_wall_s'] - reference['job_wall_s'] - counted


def unexplained_share(row: dict[str, Any], reference: dict[str, Any]) -> float | None:
  """`unexplained_s` over the run's wall overhead in seconds (None: no split, or no overhead)."""
  seconds, over = unexplained_s(row, reference), row['job_wall_s'] - reference['job_wall_s']
  return None if seconds is None or over <= 0 else seconds / over


def restart_seconds(row: dict[str, Any]) -> list[float]:
  """Seconds of each restart of a run (its summary's split over its failures)."""
  split = overhead_split(row)
  return [split['restart_s'] / row['num_failures']] if row['num_failures'] and 'restart_s' in split else []


def by_mode(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """Per mode over its kill seeds: the mean and range of the checkpoint-related overhead (% of the steps' time, and
  over full recovery's on the same seed), the restart overhead, the wall-clock overhead, and the eval NE (and its
  difference to the reference's)."""
  reference, runs = rows[0], rows[1:]

  def figures(mode_runs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {
      'checkpoint_overhead_pct': [share(r, 'checkpoint') for r in mode_runs],
      'checkpoint_overhead_vs_full': [vs_full(r, rows) for r in mode_runs],
      'checkpoint_overhead_vs_whole': [vs_full(r, rows, f'full{WHOLE}') for r in mode_runs],
      'wall_overhead_vs_full': [vs_full(r, rows, wall=True) for r in mode_runs],
      'restart_overhead_pct': [share(r, 'restart') for r in mode_runs],
      'wall_overhead_pct': [r['overhead_pct'] for r in mode_runs],
      'unexplained_share': [unexplained_share(r, reference) for r in mode_runs],
      'eval_ne': [r['eval_ne'] for r in mode_runs],
      'ne_vs_reference_pct': [r['ne_vs_reference_pct'] for r in mode_runs],
      'failures': [r['num_failures'] for r in mode_runs],
      'seconds_per_restart': [s for r in mode_runs for s in restart_seconds(r)],
      # Per process of every run: the share of its rows a checkpoint wrote, and MB written a second.
      'rows_written_share': [x for r in mode_runs for x in r.get('rows_written_share', [])],
      'mb_written_per_s': [x for r in mode_runs for x in r.get('mb_written_per_s', [])],
    }

  modes = spread.by_group(runs, lambda r: r['mode'], figures)
  for mode, mode_figures in modes.items():
    seeds = [r['kill_seed'] for r in runs if r['mode'] == mode]
    modes[mode] = {'kill_seeds': seeds, **mode_figures, 'reference_eval_ne': reference['eval_ne']}
  return modes


def table(rows: list[dict[str, Any]]) -> str:
  """Two markdown tables: each mode over its seeds (mean, range), then every run."""
  modes = by_mode(rows)
  lines = [
    '| mode | seeds | failures | **checkpoint-related overhead** | vs full (same seed) | restart overhead | '
    's a restart | wall overhead | of it unexplained | NE vs no failures | rows a checkpoint writes | '
    'MB written /s a process |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for mode, m in modes.items():
    vs_full_span = spread.span(m, 'checkpoint_overhead_vs_full', '{:.2f}')
    per_restart = spread.span(m, 'seconds_per_restart', '{:.2f}')
    lines.append(
      f'| {mode} | {len(m["kill_seeds"])} | {m["failures"]:.1f} | '
      f'**{spread.span(m, "checkpoint_overhead_pct", "{:.2f}%")}** | '
      f'{vs_full_span} | {spread.span(m, "restart_overhead_pct", "{:.1f}%")} | {per_restart} | '
      f'{spread.span(m, "wall_overhead_pct", "{:.1f}%")} | {spread.span(m, "unexplained_share", "{:.0%}")} | '
      f'{spread.span(m, "ne_vs_reference_pct", "{:+.3f}%")} | '
      f'{spread.span(m, "rows_written_share", "{:.1%}")} | {spread.span(m, "mb_written_per_s", "{:.1f}")} |'
    )
  lines += [
    '',
    '| run | failures | restarts | wall s | wall overhead | saves s | boundary work s | writes s | priority s | '
    'live copies s | other slower steps s | restores s | work again s | restarts s | warm-ups s | standbys s | '
    'start-up and end s | unexplained s | checkpoint-related | vs full | restarts | PLS | eval NE | '
    'NE vs no failures | chose |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    recovery = r.get('recovery') or {}
    split = overhead_split(r)
    chose = (recovery.get('cpr_choice') or {}).get('chosen', '')
    pct = lambda kind, r=r: f'{share(r, kind):.2f}%' if share(r, kind) is not None else ''
    seconds = lambda key, split=split: f'{split[key]:.2f}' if key in split else ''
    of_full = vs_full(r, rows) if r is not rows[0] else None
    of_full = f'{of_full:.2f}' if of_full is not None else ''
    lines.append(
      f'| {r["label"]} | {r["num_failures"]} | {recovery.get("num_restarts", 0)} | {r["job_wall_s"]:.1f} | '
      f'{r["overhead_pct"]:.1f}% | {seconds("save_s")} | {seconds("boundary_s")} | {seconds("write_s")} | '
      f'{seconds("priority_s")} | '
      f'{seconds("live_s")} | {seconds("slower_s")} | {seconds("restore_s")} | {seconds("retrained_s")} | '
      f'{seconds("restarts_only_s" if "restarts_only_s" in split else "restart_s")} | {seconds("warmup_s")} | '
      f'{seconds("standby_s")} | {seconds("edges_s")} | '
      f'{_seconds(unexplained_s(r, rows[0]) if r is not rows[0] else None)} | '
      f'{pct("checkpoint")} | {of_full} | '
      f'{pct("restart")} | '
      f'{r.get("actual_pls") or 0:.4f} | {r["eval_ne"]:.5f} | {r["ne_vs_reference_pct"]:+.3f}% | {chose} |'
    )
  return '\n'.join(lines)


def _seconds(value: float | None) -> str:
  return '' if value is None else f'{value:.2f}'


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): full recovery's checkpoint-related overhead, each mode's
  share of it and of whole-checkpoint full recovery's, each mode's wall overhead over full's (same seed), the
  restarts, the NE (its targets: `TARGET`)."""
  rows = result_files.rows(path)
  modes, runs = by_mode(rows), rows[1:]
  full = modes['full']
  partial_modes = [mode for mode in modes if mode not in ('full', f'full{WHOLE}')]

  def read(key: str, names: tuple[str, ...], target: float) -> str:
    """The verdict of the modes `names` (those run) against `target`, each run's figure of `key`."""
    ranges = [modes[m][f'{key}_range'] for m in names if m in modes and modes[m][key] is not None]
    if not ranges:
      return 'not run'
    low, high = min(r[0] for r in ranges), max(r[1] for r in ranges)
    return result_files.verdict(low, high, target, higher_is_better=False)

  whole = ''
  if f'full{WHOLE}' in modes:
    vs_whole = ', '.join(f'`{m}` {modes[m]["checkpoint_overhead_vs_whole"]:.2f}' for m in ('full', *partial_modes))
    whole = (
      f' ({modes[f"full{WHOLE}"]["checkpoint_overhead_pct"]:.2f}% with whole checkpoints at the same kill times, of '
      f'which {vs_whole}; target {TARGET["vs_whole"]:g} for the partial modes: '
      f'{read("checkpoint_overhead_vs_whole", ("partial", *_CPR_VARIANTS), TARGET["vs_whole"])})'
    )
  restarts = [s for r in runs for s in restart_seconds(r)]  # A run's mean restart, run by run.
  ne = [abs(r['ne_vs_reference_pct']) for r in runs]
  seeds = len(full['kill_seeds'])
  shares = ', '.join(f'`{m}` {modes[m]["checkpoint_overhead_vs_full"]:.2f}' for m in partial_modes)
  walls = ', '.join(f'`{m}` {modes[m]["wall_overhead_vs_full"]:.2f}' for m in partial_modes)
  return (
    f"killed processes, {seeds} kill seed{'s' if seeds != 1 else ''}: full recovery's checkpoint-related overhead "
    f"{full['checkpoint_overhead_pct']:.2f}% of the steps' time{whole}; {shares} of it on the same seed (targets "
    f'`partial` {TARGET["partial_vs_full"]:g}: '
    f'{read("checkpoint_overhead_vs_full", ("partial",), TARGET["partial_vs_full"])}, `cpr_mfu`/`cpr_ssu` '
    f'{TARGET["cpr_vs_full"]:g}: {read("checkpoint_overhead_vs_full", _CPR_VARIANTS, TARGET["cpr_vs_full"])}); '
    f'wall overhead {full["wall_overhead_pct"]:.1f}% under full recovery, {walls} of it (targets `partial` '
    f'{TARGET["partial_wall_vs_full"]:g}: '
    f'{read("wall_overhead_vs_full", ("partial",), TARGET["partial_wall_vs_full"])}, `cpr_mfu`/`cpr_ssu` '
    f'{TARGET["cpr_wall_vs_full"]:g}: {read("wall_overhead_vs_full", _CPR_VARIANTS, TARGET["cpr_wall_vs_full"])}); '
    f'a restart {min(restarts):.2f}-{max(restarts):.2f} s (target {TARGET["restart_s"]:g} s on average a run: '
    f'{result_files.runs_verdict(restarts, TARGET["restart_s"])})'
    f"; NE within {max(ne):.3f}% of the failure-free run's (target {TARGET['ne_pct']:g}% a run: "
    f'{result_files.runs_verdict(ne, TARGET["ne_pct"])})'
  )


def kaggle_headline(path: str) -> str:
  """`headline` of a result file at Kaggle size (`SIZES['kaggle']`), which says so."""
  return 'at Criteo Kaggle size: ' + headline(path)
