"""The CPR study on real failures: a job of processes killed on one seeded schedule under each recovery mode.

  rows = real_failures.run(root, modes=('full', 'partial', 'cpr_mfu', 'cpr'), kill_mtbf_s=20.0, kill_seed=0)
  print(real_failures.table(rows))

Every run is `experiments.launch` on the default problem (one replica per process, `--pin_cpus`: each process on a
core of its own, like separate hosts) with `--max_restarts` and the same `--kill_mtbf_s`/`--kill_seed`: the
launcher SIGKILLs a random process at exponential wall-clock times, the job comes back, each process restores
what its mode says (`recovery.real`). A run without failures and without recovery (`recovery.mode='none'`) is the
reference: its wall time the failure-free time, its eval NE the quality to keep. `recovery.mtbf_steps`, the MTBF
the modes plan their checkpoints for, is set to the kill schedule's mean in the reference's steps.

The overhead of a run is its wall time over the reference's, less one; it is split, from the job's history
(`parallel.history`), into what each failure cost the job: detection (from the kill to the end of every process
of that start), restart (from there to every process training again, less the restore), restore (the slowest
process's), and lost work (steps trained again after a full recovery's rewind, at the reference's step time); the
rest is what the mode's checkpoints and everything else cost.
"""

import pathlib
import sys
from typing import Any

from shadowsync_jax.parallel import history
from shadowsync_jax.studies import jobs

LAUNCH_FLAGS = ('--num_processes=2', '--cpu_devices=1', '--pin_cpus')


def run_job(workdir: pathlib.Path, launch_flags: list[str], train_flags: list[str]) -> dict[str, Any]:
  """One `experiments.launch` job; returns its summary.json with the launcher's wall time."""
  job = jobs.launch(workdir, launch_flags, train_flags)
  if job.error:
    raise RuntimeError(f'the job in {workdir} refused its config: {job.error}')
  return {**job.summary, 'job_wall_s': job.wall_s}


def costs(workdir: pathlib.Path, step_s: float) -> dict[str, float]:
  """The seconds the failures of a run cost the job, by kind (module docstring), from its history."""
  records = history.read(workdir)
  generations = {r['generation']: r for r in records if r.get('event') == 'generation'}
  starts = [r for r in records if r.get('event') == 'start']
  split = {'detection_s': 0.0, 'restart_s': 0.0, 'restore_s': 0.0, 'lost_work_s': 0.0}
  for failure in (r for r in records if r.get('event') == 'failure'):
    number = failure['generation']
    ended, after = generations[number]['ended'], generations.get(number + 1, {})
    restores = [s.get('restore_s', 0.0) for s in starts if s['generation'] == number + 1]
    restore = max(restores, default=0.0)
    split['detection_s'] += max(0.0, ended - failure['failed_at'])
    split['restore_s'] += restore
    if 'ready' in after:
      split['restart_s'] += max(0.0, after['ready'] - ended - restore)
    retrained = sum(s.get('retrained_steps', 0) for s in starts if s['generation'] == number + 1)
    split['lost_work_s'] += step_s * retrained / max(1, len([s for s in starts if s['generation'] == number + 1]))
  return split


def run(
  root: str | pathlib.Path,
  modes: tuple[str, ...] = ('full', 'partial', 'cpr_mfu', 'cpr'),
  kill_mtbf_s: float = 20.0,
  kill_seed: int = 0,
  max_restarts: int = 20,
  train_flags: tuple[str, ...] = (),
  out=sys.stdout,
) -> list[dict[str, Any]]:
  """The reference, then every mode on the same kill schedule; returns one row per run (the reference first)."""
  root = pathlib.Path(root)
  out.write('--- no failures, no recovery (the reference)\n')
  out.flush()
  reference = run_job(root / 'reference', list(LAUNCH_FLAGS), list(train_flags))
  steps_per_s = min(reference['examples_per_sec_per_process']) / reference['config']['batch_size']
  step_s = 1.0 / steps_per_s
  rows = [{**reference, 'label': 'no failures', 'overhead_pct': 0.0, **costs(root / 'reference', step_s)}]
  kills = [f'--max_restarts={max_restarts}', f'--kill_mtbf_s={kill_mtbf_s}', f'--kill_seed={kill_seed}']
  mtbf_steps = kill_mtbf_s * steps_per_s
  for mode in modes:
    out.write(f'--- {mode}\n')
    out.flush()
    flags = [*train_flags, f'--config.recovery.mode={mode}', f'--config.recovery.mtbf_steps={mtbf_steps:.1f}']
    summary = run_job(root / mode, [*LAUNCH_FLAGS, *kills], flags)
    overhead = 100 * (summary['job_wall_s'] / reference['job_wall_s'] - 1)
    rows.append({**summary, 'label': mode, 'overhead_pct': overhead, **costs(root / mode, step_s)})
  for row in rows:
    row['ne_vs_reference_pct'] = 100 * (row['eval_ne'] / reference['eval_ne'] - 1)
    row['step_s'] = step_s
  return rows


def table(rows: list[dict[str, Any]]) -> str:
  """The markdown table of a study (`run`'s rows)."""
  full = next((r for r in rows if r['label'] == 'full'), None)
  lines = [
    '| run | failures | restarts | wall s | **overhead** | vs full | detection s | restart s | restore s | '
    'lost work s | other s | PLS | eval NE | NE vs no failures | chose |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  reference_wall = rows[0]['job_wall_s']
  for r in rows:
    recovery = r.get('recovery') or {}
    parts = sum(r[k] for k in ('detection_s', 'restart_s', 'restore_s', 'lost_work_s'))
    other = r['job_wall_s'] - reference_wall - parts if r is not rows[0] else 0.0
    vs_full = f'{r["overhead_pct"] / full["overhead_pct"]:.2f}' if full and full['overhead_pct'] > 0 else ''
    chose = (recovery.get('cpr_choice') or {}).get('chosen', '')
    lines.append(
      f'| {r["label"]} | {r["num_failures"]} | {recovery.get("num_restarts", 0)} | {r["job_wall_s"]:.1f} | '
      f'**{r["overhead_pct"]:.1f}%** | {vs_full} | {r["detection_s"]:.1f} | {r["restart_s"]:.1f} | '
      f'{r["restore_s"]:.2f} | {r["lost_work_s"]:.1f} | {other:.1f} | {r.get("actual_pls") or 0:.4f} | '
      f'{r["eval_ne"]:.5f} | {r["ne_vs_reference_pct"]:+.3f}% | {chose} |'
    )
  return '\n'.join(lines)
