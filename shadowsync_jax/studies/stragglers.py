"""Stragglers across processes: does one slow process hold the others back?

  results = stragglers.run(root, ('none', 'shadow_ma', 'sync_sgd'), slowdown=2.0)
  print(stragglers.table(results))

Each algorithm runs as a job of 2 processes (`experiments.launch`), one replica per process, without and with a
straggler (process 1 `slowdown` times slower: its own step time, calibrated before it is slowed, times `slowdown`;
`parallel.straggler`), on the default config: checkpoints on (every `train.checkpoint_every_steps`, each process
at its own pace), every other setting at its default unless an argument says otherwise. The table: per-process
examples/sec, the fast process's examples/sec relative to the same algorithm without the straggler, eval NE and
AUC, sync rounds and gap. Targets: under `none` and the shadow algorithms the fast process keeps at least 0.9 of
its examples/sec, while under sync_sgd the job falls to the straggler's pace, about 1/slowdown of its own. An
algorithm written `ALGORITHM@PLACEMENT` also sets `sync.embedding_placement` (e.g. `shadow_ma@sharded`: the tables
sharded over the two processes, so every lookup is a collective of both).
"""

import pathlib
from typing import Any

from shadowsync_jax.parallel import supervisor
from shadowsync_jax.studies import jobs


def run_job(
  workdir: pathlib.Path,
  algorithm: str,
  slowdown: float,
  num_train_examples: int | None = None,
  min_interval_s: str | None = None,
  pin_cpus: bool = False,
) -> dict[str, Any]:
  """One 2-process job (`ALGORITHM[@PLACEMENT]`, process 1 `slowdown` times slower); its summary.json."""
  algorithm, _, placement = algorithm.partition('@')
  train_flags = [f'--config.sync.algorithm={algorithm}', '--config.train.progress_every_s=30']
  if placement:
    train_flags.append(f'--config.sync.embedding_placement={placement}')
  if num_train_examples:
    train_flags.append(f'--config.data.num_train_examples={num_train_examples}')
  if min_interval_s is not None:
    train_flags.append(f'--config.sync.min_interval_s={min_interval_s}')
  if slowdown > 1:
    train_flags += ['--config.straggler.process=1', f'--config.straggler.slowdown={slowdown}']
  launch_flags = ['--num_processes=2', '--peer_timeout_s=60', '--grace_s=30', *(['--pin_cpus'] if pin_cpus else [])]
  job = jobs.launch(workdir, launch_flags, train_flags)
  if job.error:
    raise RuntimeError(f'{algorithm} (slowdown {slowdown:g}) refused its config: {job.error}')
  return job.summary


def run(
  root: pathlib.Path, algorithms: tuple[str, ...], slowdown: float, **job_settings: Any
) -> dict[tuple[str, float], dict[str, Any]]:
  """Every algorithm without, then with the straggler; {(algorithm, slowdown): summary}. `job_settings`: `run_job`'s
  num_train_examples, min_interval_s, pin_cpus."""
  results = {}
  for algorithm in algorithms:
    for factor in (1.0, slowdown):
      print(f'--- {algorithm}, straggler slowdown {factor:g}', flush=True)
      results[(algorithm, factor)] = run_job(root / f'{algorithm}_{factor:g}', algorithm, factor, **job_settings)
  return results


def table(results: dict[tuple[str, float], dict[str, Any]]) -> str:
  lines = [
    '| algorithm | straggler | p0 (fast) ex/s | p1 ex/s | p0 vs. no straggler | eval NE | eval AUC | '
    'sync rounds | mean sync gap |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for (algorithm, slowdown), summary in results.items():
    fast, slow = summary['examples_per_sec_per_process']  # `algorithm` may say its placement: ALGORITHM@PLACEMENT.
    baseline = results[(algorithm, 1.0)]['examples_per_sec_per_process'][0]
    gap = summary['mean_sync_gap']
    lines.append(
      f'| {algorithm} | {f"p1 {slowdown:g}x slower" if slowdown > 1 else "none"} | {fast:,.0f} | '
      f'{slow:,.0f} | {fast / baseline:.2f} | {summary["eval_ne"]:.4f} | {summary["eval_auc"]:.4f} | '
      f'{summary["sync_rounds"]} | {"-" if gap is None else f"{gap:.1f}"} |'
    )
  return '\n'.join(lines)


def note(slowdown: float, pin_cpus: bool) -> str:
  """The settings sentence of the result file."""
  return (
    f"2 processes x 1 replica (on the launcher's default {supervisor.DEFAULT_CPU_DEVICES} CPU devices), "
    f'process 1 {slowdown:g}x slower in the second run of each algorithm (its own step time, calibrated over its '
    'first steps, times the slowdown); '
    f"pinned cores: {'yes' if pin_cpus else 'no'}; everything else at the default config's values "
    '(checkpoints on, each process at its own pace).'
  )
