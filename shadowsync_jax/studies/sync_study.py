r"""The ShadowSync study: every sync algorithm on the same data, R replicas, total training data fixed, per seed.

  from experiments.configs import default
  settings = sync_study.Settings(num_replicas=8, seeds=(0, 1, 2))
  rows = sync_study.run(default.get_config(), settings, root='/tmp/sync_study')
  print(sync_study.table(rows))

On the default config (batch 256 per replica, the whole embedded stream of 2M examples) but 8 replicas. Runs
`none`, `sync_sgd`, the three foreground algorithms (every `settings.every_k_steps`), the three shadow algorithms,
and then each foreground algorithm again with k equal to its shadow counterpart's measured mean sync gap, as the
ShadowSync paper compares them. The grid runs once per seed of `settings.seeds` (`config.seed`: the stream, the
teacher and the initial model); NE is compared within a seed and the table gives the mean and the range over the
seeds. The shadow rounds keep the default pace, `sync.min_interval_s='auto'` (paced to
cost at most `sync.max_overhead` of the trainers' throughput), unless `settings.min_interval_s` sets one; every
run's K is 'auto''s (in one process the shadow rounds are fused into its blocks: `sync.scheduled`), unless
`settings.steps_per_dispatch` sets one for every run. With
`settings.repeats=N` each seed's grid runs N times in turn and examples/sec is the best of the N (external load
only ever slows a run down). `table` is a markdown table (eval NE, AUC, examples/sec and its ratio to `none`, rounds,
mean sync gap, the shadow rounds' pace); `note` names every setting changed from the defaults
(`benchmarks.sync_study` writes both, with the raw summaries as JSON, to its `--out`).
"""

import copy
import pathlib
import statistics
from typing import Any, NamedTuple

import ml_collections

from shadowsync_jax import config as config_lib
from shadowsync_jax import train
from shadowsync_jax.studies import result_files

ALGORITHMS = ('none', 'sync_sgd', 'fr_ma', 'fr_ea', 'fr_bmuf', 'shadow_ma', 'shadow_ea', 'shadow_bmuf')
_PER_ROW = ('sync.algorithm', 'sync.every_k_steps')
TARGET = 0.5  # The headline's: a shadow algorithm's NE within this % of sync_sgd's on every seed.


class Settings(NamedTuple):
  """What the study sets on its base config; None: the base config's value."""

  num_replicas: int = 8
  every_k_steps: int = 10  # k of the foreground algorithms in their first runs.
  batch_size: int | None = None  # Examples per replica per step.
  num_train_examples: int | None = None  # Length of the one-pass training stream, for every run.
  min_interval_s: str | None = None  # sync.min_interval_s as text: seconds, or 'auto'.
  what: str = 'all'  # What a round syncs: 'all' or 'dense'.
  embedding_placement: str = 'replicated'
  steps_per_dispatch: int | str | None = None  # train.steps_per_dispatch of every run (None: 'auto').
  repeats: int = 1  # Runs of the whole grid; examples/sec is the best of them, the rest from the first.
  seeds: tuple[int, ...] = (0, 1, 2)  # config.seed of each grid.


def config_for(
  base: ml_collections.ConfigDict, settings: Settings, algorithm: str, every_k_steps: int
) -> ml_collections.ConfigDict:
  """`base` with `settings`, `sync.algorithm = algorithm` and `sync.every_k_steps = every_k_steps` (a copy)."""
  config = copy.deepcopy(base)
  config.num_replicas = settings.num_replicas
  if settings.batch_size is not None:
    config.batch_size = settings.batch_size
  if settings.num_train_examples is not None:
    config.data.num_train_examples = settings.num_train_examples
  config.sync.algorithm = algorithm
  config.sync.every_k_steps = every_k_steps
  if settings.min_interval_s is not None:
    config.sync.min_interval_s = config_lib.min_interval_from_text(settings.min_interval_s)
  config.sync.what = settings.what
  config.sync.embedding_placement = settings.embedding_placement
  if settings.steps_per_dispatch is not None:
    config.train.steps_per_dispatch = settings.steps_per_dispatch
  config.train.progress_every_s = 30.0
  return config


def changed_settings(base: ml_collections.ConfigDict, settings: Settings) -> str:
  """Every key the study sets away from `base`, as key=value; those that vary per row, named."""
  flat_base = config_lib.flat_keys(base)
  config = config_lib.flat_keys(config_for(base, settings, 'none', settings.every_k_steps))
  changed = [f'{k}={v}' for k, v in config.items() if k not in _PER_ROW and flat_base[k] != v]
  return ', '.join(
    changed + [f'sync.every_k_steps={settings.every_k_steps} then the shadow gap', 'sync.algorithm per row']
  )


def _run(
  base: ml_collections.ConfigDict,
  settings: Settings,
  label: str,
  algorithm: str,
  every_k_steps: int,
  root: pathlib.Path,
) -> dict[str, Any]:
  print(f'--- {label}', flush=True)
  summary = train.train_and_evaluate(config_for(base, settings, algorithm, every_k_steps), root / label)
  summary['label'] = label
  return summary


def run(base: ml_collections.ConfigDict, settings: Settings, root: str | pathlib.Path) -> list[dict[str, Any]]:
  """The grid of every seed (`root/seed<s>`); the summaries, each with its 'label' and 'seed'."""
  rows = []
  for seed in settings.seeds:
    seeded = copy.deepcopy(base)
    seeded.seed = seed
    rows += [{**row, 'seed': seed} for row in _run_seed(seeded, settings, pathlib.Path(root) / f'seed{seed}')]
  return rows


def _run_seed(base: ml_collections.ConfigDict, settings: Settings, root: pathlib.Path) -> list[dict[str, Any]]:
  """The grid, `settings.repeats` times (repeat r in `root/r<r>`); the first repeat's summaries, each with its
  'label', and examples/sec the best of the repeats."""
  k = settings.every_k_steps
  rows = [_run(base, settings, a, a, k, root / 'r0') for a in ALGORITHMS]
  gap_runs = []
  for name in ('ma', 'ea', 'bmuf'):
    shadow = next(r for r in rows if r['label'] == f'shadow_{name}')
    gap = max(1, round(shadow['mean_sync_gap'] or k))
    gap_runs.append((f'fr_{name} at the shadow gap', f'fr_{name}', gap))
  rows += [_run(base, settings, label, algorithm, gap, root / 'r0') for label, algorithm, gap in gap_runs]
  runs = [(a, a, k) for a in ALGORITHMS] + gap_runs
  for repeat in range(1, settings.repeats):
    for row, (label, algorithm, every_k_steps) in zip(rows, runs):
      again = _run(base, settings, label, algorithm, every_k_steps, root / f'r{repeat}')
      row['examples_per_sec'] = max(row['examples_per_sec'], again['examples_per_sec'])
  return rows


def table(rows: list[dict[str, Any]]) -> str:
  """A row a run (label): eval NE against sync_sgd's of the same seed (mean, and the range over the seeds), AUC,
  examples/sec (and against none's), the steps a dispatch (K) of its seeds, rounds, mean sync gap, merge lag (steps
  from a shadow round's snapshot to its merge), pace (means over the seeds); the Bayes NE floors below."""
  seeds = sorted({r['seed'] for r in rows})
  by = {(r['label'], r['seed']): r for r in rows}
  mean = lambda values: sum(values) / len(values)
  lines = [
    '| run | eval NE (mean) | NE vs sync_sgd: mean (min to max) | AUC (mean) | examples/sec (mean) | vs none | '
    'K | rounds (mean) | mean sync gap | merge lag | pace (s) |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for label in dict.fromkeys(r['label'] for r in rows):
    runs = [by[(label, s)] for s in seeds]
    gaps = [100 * (by[(label, s)]['eval_ne'] / by[('sync_sgd', s)]['eval_ne'] - 1) for s in seeds]
    speed = [by[(label, s)]['examples_per_sec'] / by[('none', s)]['examples_per_sec'] for s in seeds]
    sync_gaps = [r['mean_sync_gap'] for r in runs if r['mean_sync_gap'] is not None]
    lags = [r['mean_merge_lag_steps'] for r in runs if r.get('mean_merge_lag_steps') is not None]
    paces = [r['sync_interval_s'] for r in runs if r.get('sync_interval_s') is not None]
    spread = f' ({min(gaps):+.2f}% to {max(gaps):+.2f}%)' if len(seeds) > 1 else ''
    lines.append(
      f'| {label} | {mean([r["eval_ne"] for r in runs]):.4f} | {mean(gaps):+.2f}%{spread} | '
      f'{mean([r["eval_auc"] for r in runs]):.4f} | {mean([r["examples_per_sec"] for r in runs]):,.0f} | '
      f'{mean(speed):.2f} | {", ".join(str(k) for k in sorted({r.get("steps_per_dispatch") or 0 for r in runs}))} | '
      f'{mean([r["sync_rounds"] for r in runs]):.0f} | '
      f'{f"{mean(sync_gaps):.1f}" if sync_gaps else ""} | {f"{mean(lags):.1f}" if lags else ""} | '
      f'{f"{mean(paces):.2f}" if paces else ""} |'
    )
  floors = ', '.join(f'{by[("none", s)]["bayes_ne"]:.4f} (seed {s})' for s in seeds if by[('none', s)]['bayes_ne'])
  if floors:
    lines.append(f'\nBayes NE floor: {floors}')
  return '\n'.join(lines)


def note(variant: str, base: ml_collections.ConfigDict, settings: Settings, rows: list[dict[str, Any]]) -> str:
  """The setup under the table: the `variant` config ('default', 'tiny': `base`) and what the study changed."""
  return (
    f'The {variant} config but {changed_settings(base, settings)}; seeds {", ".join(map(str, settings.seeds))} '
    f'(each its own stream, teacher and initial model; NE compared within a seed); best examples/sec of '
    f'{settings.repeats} run(s) a seed, then the mean over the seeds; {rows[0]["train_examples"]:,} training '
    'examples in all (whole global steps). Pace: the interval between round starts the shadow rounds ended on.'
  )


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): the shadow algorithms' NE against `sync_sgd`'s, seed by
  seed, against `TARGET`."""
  rows = result_files.rows(path)
  seeds = sorted({row.get('seed', 0) for row in rows})
  ne = {(row['label'], row.get('seed', 0)): row['eval_ne'] for row in rows}
  gaps = {
    name: [100 * (ne[(name, s)] / ne[('sync_sgd', s)] - 1) for s in seeds]
    for name in ('shadow_ma', 'shadow_ea', 'shadow_bmuf')
  }
  worst = max(abs(g) for values in gaps.values() for g in values)
  each = ', '.join(
    f'{n.removeprefix("shadow_")} {result_files.pct(statistics.fmean(g))}'
    + (f' ({min(g):+.2f}% to {max(g):+.2f}%)' if len(seeds) > 1 else '')
    for n, g in gaps.items()
  )
  met = [n.removeprefix('shadow_') for n, g in gaps.items() if max(abs(x) for x in g) <= TARGET]
  return (
    f"on the default config with 8 replicas, at the default pace, the shadow algorithms' NE is within {worst:.2f}% "
    f"of `sync_sgd`'s in every run ({each}; "
    + (f'means over {len(seeds)} seeds' if len(seeds) > 1 else 'one seed')
    + f'); target {TARGET:g}% on every seed: met by {", ".join(met) if met else "none"}'
  )
