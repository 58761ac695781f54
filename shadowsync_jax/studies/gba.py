"""The GBA study: sync_sgd, async_sgd and gba with the same hyperparameters, without and with stragglers.

  from experiments.configs import gba as gba_config
  from shadowsync_jax.studies import gba as gba_study
  best_lr, lr_rows = gba_study.tune_learning_rate(gba_config.get_config(), '/tmp/gba/lr', (0.05, 0.1, 0.2))
  rows = gba_study.run(gba_study.with_learning_rate(gba_config.get_config(), best_lr), root='/tmp/gba',
                       straggler_probs=(0.0, 0.1), sync_sgd=lr_rows[best_lr])
  print(gba_study.learning_rate_table(lr_rows), gba_study.table(rows))

Every run trains the same config but `sync.algorithm` and `gba.straggler_prob`. sync_sgd trains for real on R
replicas (train.py); its emulated time is read from the same seeded worker step times that order gba's and
async_sgd's arrivals (`step_times.WorkerStepTimes`): each of its global steps waits for its slowest worker. So the three
face the same stragglers, and their emulated examples/sec compare; real examples/sec and wall time are this
machine's and say what the emulation cost. sync_sgd's training does not depend on the step times, so it is trained
once and its row repeated under each straggler setting with that setting's emulated time.

The hyperparameters are the synchronous run's, as in the GBA paper: `tune_learning_rate` picks the learning rate
(the MLP's and the tables' alike) with sync_sgd's best eval NE, and the three then train with it, untouched.
"""

from collections.abc import Sequence
import copy
import pathlib
import statistics
from typing import Any

import ml_collections

from shadowsync_jax import train
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.gba import step_times
from shadowsync_jax.studies import result_files

ALGORITHMS = ('sync_sgd', 'async_sgd', 'gba')


def config_for(base: ml_collections.ConfigDict, algorithm: str, straggler_prob: float) -> ml_collections.ConfigDict:
  config = copy.deepcopy(base)
  config.sync.algorithm = algorithm
  config.gba.straggler_prob = straggler_prob
  return config


def with_learning_rate(base: ml_collections.ConfigDict, learning_rate: float) -> ml_collections.ConfigDict:
  """`base` with the MLP's and the embedding tables' learning rates both set to `learning_rate`."""
  config = copy.deepcopy(base)
  config.optimizer.mlp_learning_rate = config.optimizer.embedding_learning_rate = learning_rate
  return config


def with_seed(base: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
  """`base` with `seed` (the synthetic teacher, the initialization, the data stream, the emulated step times)."""
  config = copy.deepcopy(base)
  config.seed = seed
  return config


def tune_learning_rate(
  base: ml_collections.ConfigDict, root: str | pathlib.Path, learning_rates: Sequence[float]
) -> tuple[float, dict[float, dict[str, Any]]]:
  """Trains sync_sgd (no stragglers) at each learning rate in `root/lr<rate>`; returns the rate of the lowest eval
  NE and the summaries by rate. The choice is made on the eval set the study reports on: a tuned baseline, not a
  held-out estimate."""
  if not learning_rates:
    raise ValueError('tune_learning_rate needs at least one learning rate.')
  summaries = {}
  for rate in learning_rates:
    print(f'--- sync_sgd, learning rate {rate:g}', flush=True)
    summaries[rate] = train.train_and_evaluate(
      config_for(with_learning_rate(base, rate), 'sync_sgd', 0.0), _new_workdir(pathlib.Path(root) / f'lr{rate:g}')
    )
  return _lowest_ne(summaries), summaries


def _lowest_ne(summaries: dict[float, dict[str, Any]]) -> float:
  return min(summaries, key=lambda rate: summaries[rate]['eval_ne'])


def learning_rate_table(summaries: dict[float, dict[str, Any]]) -> str:
  """A markdown table of `tune_learning_rate`'s runs, the chosen one marked."""
  best = _lowest_ne(summaries)
  lines = ['| learning rate | sync_sgd eval NE | AUC | |', '|---|---|---|---|']
  lines += [
    f'| {rate:g} | {s["eval_ne"]:.4f} | {s["eval_auc"]:.4f} | {"chosen" if rate == best else ""} |'
    for rate, s in summaries.items()
  ]
  return '\n'.join(lines)


def run(
  base: ml_collections.ConfigDict,
  root: str | pathlib.Path,
  straggler_probs: tuple[float, ...] = (0.0, 0.1),
  algorithms: tuple[str, ...] = ALGORITHMS,
  sync_sgd: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
  """Trains every (straggler_prob, algorithm) in `root/p<prob>/<algorithm>`; returns the summaries, each with the
  emulated figures (sync_sgd's computed from the step times) and its 'straggler_prob'. `sync_sgd`: the summary of
  a sync_sgd run of `base` made already (by `tune_learning_rate`), used instead of training it again."""
  rows = []
  for prob in straggler_probs:
    for algorithm in algorithms:
      config = config_for(base, algorithm, prob)
      if algorithm == 'sync_sgd' and sync_sgd is not None:  # Trains the same model whatever the step times.
        summary = {**sync_sgd, 'config': config.to_dict()}
      else:
        print(f'--- {algorithm}, straggler_prob={prob}', flush=True)
        summary = train.train_and_evaluate(config, _new_workdir(pathlib.Path(root) / f'p{prob}' / algorithm))
      if algorithm == 'sync_sgd':
        sync_sgd = summary = {**summary, **_sync_sgd_emulated(config)}
      rows.append({**summary, 'straggler_prob': prob})
  return rows


def _new_workdir(workdir: pathlib.Path) -> pathlib.Path:
  if (workdir / 'summary.json').exists():  # It would resume at its end and train nothing.
    raise ValueError(f'{workdir} holds a finished run already; give the study a new workdir.')
  return workdir


def _sync_sgd_emulated(config: ml_collections.ConfigDict) -> dict[str, float]:
  steps = input_pipeline.num_steps(config.data.num_train_examples, config.num_replicas, config.batch_size)
  seconds = step_times.WorkerStepTimes.sample(config.gba, config.num_replicas, steps, config.seed).sync_time_s(0, steps)
  return {
    'emulated_time_s': seconds,
    'emulated_examples_per_sec': steps * config.num_replicas * config.batch_size / seconds,
  }


def _sync_sgd_row(rows: list[dict[str, Any]], straggler_prob: float) -> dict[str, Any]:
  return next(r for r in rows if r['sync_algorithm'] == 'sync_sgd' and r['straggler_prob'] == straggler_prob)


def _stragglers(row: dict[str, Any]) -> str:
  """The straggler setting of a row, as the tables name it."""
  if row['straggler_prob'] == 0:
    return 'none'
  return f'{row["straggler_prob"]:.0%} of steps {row["config"]["gba"]["straggler_slowdown"]:g}x slower'


def table(rows: list[dict[str, Any]]) -> str:
  """A markdown table, each row compared with sync_sgd at the same straggler setting."""
  lines = [
    '| stragglers | algorithm | eval NE | NE vs sync_sgd | AUC | emulated ex/s | vs sync_sgd | real ex/s | '
    'wall time | mean staleness | decayed / dropped / lost |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    sync = _sync_sgd_row(rows, r['straggler_prob'])
    stragglers = _stragglers(r)
    staleness = '' if r.get('mean_staleness') is None else f'{r["mean_staleness"]:.2f} (max {r["max_staleness"]})'
    counts = (
      ''
      if r.get('decayed_gradients') is None
      else f'{r["decayed_gradients"]} / {r["dropped_gradients"]} / {r["lost_tokens"]}'
    )
    real = '' if r['examples_per_sec'] is None else f'{r["examples_per_sec"]:,.0f}'
    lines.append(
      f'| {stragglers} | {r["sync_algorithm"]} | {r["eval_ne"]:.4f} | '
      f'{100 * (r["eval_ne"] / sync["eval_ne"] - 1):+.2f}% '
      f'| {r["eval_auc"]:.4f} | {r["emulated_examples_per_sec"]:,.0f} | '
      f'{r["emulated_examples_per_sec"] / sync["emulated_examples_per_sec"]:.2f}x | {real} | '
      f'{r["wall_time_s"]:.0f} s | {staleness} | {counts} |'
    )
  first = rows[0]
  gba_config = first['config']['gba']
  floor = f'Bayes NE floor {first["bayes_ne"]:.4f}; ' if first.get('bayes_ne') else ''
  lines.append(
    f'\n{floor}{first["num_replicas"]} workers x batch {first["config"]["batch_size"]}, '
    f'{first["train_examples"]:,} training examples; step time {gba_config["step_time_s"]} s emulated, '
    f'jitter {gba_config["step_time_jitter"]}; gba staleness threshold {gba_config["staleness_threshold"]}, '
    f'decay {gba_config["staleness_decay"]}.'
  )
  return '\n'.join(lines)


def mean_table(rows_by_seed: dict[int, list[dict[str, Any]]]) -> str:
  """A markdown table of the means over seeds (each seed's `run` rows): per (stragglers, algorithm), eval NE and its
  difference to sync_sgd at the same seed, AUC, and the emulated speed-up over sync_sgd, each with the per-seed
  figures, so a mean that one seed carries shows."""
  seeds = list(rows_by_seed)
  lines = [
    f'| stragglers | algorithm | mean eval NE | NE vs sync_sgd: mean (seeds {", ".join(map(str, seeds))}) | '
    'mean AUC (per seed) | emulated vs sync_sgd |',
    '|---|---|---|---|---|---|',
  ]
  first = rows_by_seed[seeds[0]]
  for position, r in enumerate(first):
    same_cell = [rows_by_seed[seed][position] for seed in seeds]
    syncs = [_sync_sgd_row(rows_by_seed[seed], r['straggler_prob']) for seed in seeds]
    ne_vs_sync = [100 * (row['eval_ne'] / sync['eval_ne'] - 1) for row, sync in zip(same_cell, syncs)]
    aucs = [row['eval_auc'] for row in same_cell]
    speedups = [
      row['emulated_examples_per_sec'] / sync['emulated_examples_per_sec'] for row, sync in zip(same_cell, syncs)
    ]
    lines.append(
      f'| {_stragglers(r)} | {r["sync_algorithm"]} | {sum(row["eval_ne"] for row in same_cell) / len(seeds):.4f} | '
      f'{sum(ne_vs_sync) / len(seeds):+.2f}% ({", ".join(f"{x:+.2f}%" for x in ne_vs_sync)}) | '
      f'{sum(aucs) / len(seeds):.4f} ({", ".join(f"{x:.4f}" for x in aucs)}) | '
      f'{sum(speedups) / len(seeds):.2f}x |'
    )
  return '\n'.join(lines)


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): `gba`'s NE against `sync_sgd`'s with the same
  hyperparameters, without and with stragglers, and its emulated speed under them."""
  rows = result_files.rows(path)
  slow_prob = max(r['straggler_prob'] for r in rows)
  seeds = sorted({r['seed'] for r in rows})
  pick = lambda algorithm, prob: {
    r['seed']: r for r in rows if r['sync_algorithm'] == algorithm and r['straggler_prob'] == prob
  }
  gaps, speed = [], []
  for prob in (0.0, slow_prob):
    sync, gba = pick('sync_sgd', prob), pick('gba', prob)
    gaps += [100 * (gba[s]['eval_ne'] / sync[s]['eval_ne'] - 1) for s in seeds]
    if prob:
      speed = [gba[s]['emulated_examples_per_sec'] / sync[s]['emulated_examples_per_sec'] for s in seeds]
  return (
    f"over {len(seeds)} seeds `gba`'s NE is within {max(abs(g) for g in gaps):.2f}% of `sync_sgd`'s with the same "
    f'hyperparameters, without and with stragglers, and runs {statistics.fmean(speed):.2f}x its emulated speed '
    'under stragglers'
  )
