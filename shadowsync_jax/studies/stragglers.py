"""Stragglers across processes: does one slow process hold the others back?

  results = stragglers.run(root, ('none', 'shadow_ma', 'sync_sgd'), slowdown=2.0)   # repeats=3
  print(stragglers.table(results))

Each algorithm runs as a job of 2 processes (`experiments.launch`), one replica per process, without and at once
with a straggler (process 1 `slowdown` times slower: its own step time, calibrated before it is slowed, times
`slowdown`; `parallel.straggler`), on the default config: checkpoints on (every `train.checkpoint_every_s`,
each process at its own pace), every other setting at its default unless an argument says otherwise; the pairs
are repeated (`REPEATS`), each straggler run read against its own pair's run without. The tables: per algorithm,
the mean and range over the repeats of the fast process's examples/sec over its own without the straggler, the
straggler's over its own, the slowdown it achieved and the eval NE; then every run (per-process examples/sec, eval
NE and AUC, sync rounds and gap). Targets: under `none` and the shadow algorithms the fast process keeps at least
0.95 of its examples/sec, while under sync_sgd the job falls to the straggler's pace, about 1/slowdown of its own. An
algorithm written `ALGORITHM@PLACEMENT` also sets `sync.embedding_placement` (e.g. `shadow_ma@sharded`: the tables
sharded over the two processes, so every lookup is a collective of both).
"""

import pathlib
from typing import Any

from shadowsync_jax import config as config_lib
from shadowsync_jax.parallel import supervisor
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import result_files
from shadowsync_jax.studies import spread

REPEATS = 3  # Runs of each pair: one run a row could not tell a slow run from noise (one read 0.70 with no coupling).
TARGET = 0.95  # The headline's: the fast process's examples/sec beside a straggler, of its own.


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


Key = tuple[str, float, int]  # (algorithm, slowdown, repeat)


def run(
  root: pathlib.Path, algorithms: tuple[str, ...], slowdown: float, repeats: int = REPEATS, **job_settings: Any
) -> dict[Key, dict[str, Any]]:
  """Every algorithm without, then at once with the straggler (a pair meets the same load), `repeats` times over;
  {(algorithm, slowdown, repeat): summary}. `job_settings`: `run_job`'s num_train_examples, min_interval_s,
  pin_cpus."""
  results = {}
  for repeat in range(repeats):
    for algorithm in algorithms:
      for factor in (1.0, slowdown):
        print(f'--- {algorithm}, straggler slowdown {factor:g}, repeat {repeat + 1} of {repeats}', flush=True)
        workdir = root / f'{algorithm}_{factor:g}_{repeat}'
        results[(algorithm, factor, repeat)] = run_job(workdir, algorithm, factor, **job_settings)
  return results


def parse_key(key: str) -> Key:
  """A raw summary's key, 'ALGORITHM xSLOWDOWN #REPEAT' (written before repeats: no '#', repeat 0)."""
  head, _, repeat = key.partition(' #')
  algorithm, factor = head.rsplit(' x', 1)
  return algorithm, float(factor), int(repeat or 0)


def raw_key(key: Key) -> str:
  algorithm, factor, repeat = key
  return f'{algorithm} x{factor:g} #{repeat}'


def by_algorithm(results: dict[Key, dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """Per algorithm over its repeats (each straggler run read against its own repeat's run without): the mean and
  range of the fast process's examples/sec over its own without the straggler (`fast_kept`), of the slow one's over
  its own (`slow_kept`), of the straggler's achieved slowdown, and the eval NE without and with it."""
  slowdown = max(f for _, f, _ in results)
  algorithms: dict[str, dict[str, Any]] = {}
  for algorithm in dict.fromkeys(a for a, _, _ in results):
    repeats = sorted({r for a, f, r in results if a == algorithm and f == slowdown and (a, 1.0, r) in results})
    pairs = [(results[(algorithm, 1.0, r)], results[(algorithm, slowdown, r)]) for r in repeats]
    figures = {
      'fast_kept': [w['examples_per_sec_per_process'][0] / o['examples_per_sec_per_process'][0] for o, w in pairs],
      'slow_kept': [w['examples_per_sec_per_process'][1] / o['examples_per_sec_per_process'][1] for o, w in pairs],
      'achieved_slowdown': [w.get('straggler_achieved_slowdown') for _, w in pairs],
      'eval_ne_without': [o['eval_ne'] for o, _ in pairs],
      'eval_ne_with': [w['eval_ne'] for _, w in pairs],
      'sync_rounds_with': [w['sync_rounds'] for _, w in pairs],
    }
    algorithms[algorithm] = {'repeats': len(pairs), 'slowdown': slowdown, **spread.mean_and_range(figures)}
  return algorithms


def table(results: dict[Key, dict[str, Any]]) -> str:
  """Two markdown tables: each algorithm over its repeats (mean and range), then every run."""
  lines = [
    '| algorithm | repeats | **p0 (fast) vs. no straggler** | p1 (straggler) vs. no straggler | straggler achieved '
    '| eval NE without | eval NE with | sync rounds with |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for algorithm, m in by_algorithm(results).items():
    lines.append(
      f'| {algorithm} | {m["repeats"]} | **{spread.span(m, "fast_kept", "{:.2f}")}** | '
      f'{spread.span(m, "slow_kept", "{:.2f}")} | {spread.span(m, "achieved_slowdown", "{:.2f}x")} | '
      f'{spread.span(m, "eval_ne_without", "{:.4f}")} | {spread.span(m, "eval_ne_with", "{:.4f}")} | '
      f'{spread.span(m, "sync_rounds_with", "{:.0f}")} |'
    )
  lines += [
    '',
    '| algorithm | repeat | straggler | p0 (fast) ex/s | p1 ex/s | p0 vs. no straggler | eval NE | eval AUC | '
    'sync rounds | mean sync gap |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for (algorithm, slowdown, repeat), summary in results.items():
    fast, slow = summary['examples_per_sec_per_process']  # `algorithm` may say its placement: ALGORITHM@PLACEMENT.
    baseline = results[(algorithm, 1.0, repeat)]['examples_per_sec_per_process'][0]
    gap = summary['mean_sync_gap']
    lines.append(
      f'| {algorithm} | {repeat + 1} | {f"p1 {slowdown:g}x slower" if slowdown > 1 else "none"} | {fast:,.0f} | '
      f'{slow:,.0f} | {fast / baseline:.2f} | {summary["eval_ne"]:.4f} | {summary["eval_auc"]:.4f} | '
      f'{summary["sync_rounds"]} | {"-" if gap is None else f"{gap:.1f}"} |'
    )
  return '\n'.join(lines)


def note(slowdown: float, pin_cpus: bool) -> str:
  """The settings sentence of the result file."""
  calibration = config_lib.base_config().straggler
  return (
    f"2 processes x 1 replica (on the launcher's default {supervisor.DEFAULT_CPU_DEVICES} CPU devices), "
    f'process 1 {slowdown:g}x slower in the second run of each pair (its own step time, its mean over '
    f'{calibration.calibration_steps} steps after {calibration.warmup_steps} of warm-up, times the slowdown); '
    'each pair of runs repeated, the table over the repeats first; '
    f"pinned cores: {'yes' if pin_cpus else 'no'}; everything else at the default config's values "
    '(checkpoints on, each process at its own pace).'
  )


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): `sync_sgd`'s pace under the straggler, and how much of
  its own the fast process keeps under the others (mean and range over the repeats; its target: `TARGET`)."""
  results = {parse_key(key): summary for key, summary in result_files.rows(path).items()}
  algorithms = by_algorithm(results)
  any_m = next(iter(algorithms.values()))
  slowdown, repeats = f'{any_m["slowdown"]:g}', min(m['repeats'] for m in algorithms.values())
  sync = algorithms['sync_sgd']
  low, high = sync['fast_kept_range']
  free = {a: m for a, m in algorithms.items() if a != 'sync_sgd'}
  verdicts: dict[str, list[str]] = {}  # 'met' only where the lowest repeat clears the target.
  for algorithm, m in free.items():
    verdicts.setdefault(result_files.verdict(*m['fast_kept_range'], TARGET), []).append(f'`{algorithm}`')
  means = [m['fast_kept'] for m in free.values()]
  return (
    f'a {slowdown}x slower process (its own steps {slowdown}x as long) holds `sync_sgd` to {sync["fast_kept"]:.2f} '
    f'of its pace ({f"{low:.2f} to {high:.2f} over {repeats} repeats" if repeats > 1 else "one run"}); under '
    + ', '.join(f'`{a}`' for a in free)
    + f' the fast process keeps {min(means):.2f}-{max(means):.2f} of its own on average (target {TARGET:g}: '
    + '; '.join(f'{", ".join(names)}: {verdict}' for verdict, names in verdicts.items())
    + ')'
  )
