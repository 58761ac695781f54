"""The GBA study: sync_sgd, async_sgd and gba with the same hyperparameters, without and with stragglers.

  from experiments.configs import gba as gba_config
  rows = gba_study.run(gba_config.get_config(), root='/tmp/gba', straggler_probs=(0.0, 0.1))
  print(gba_study.table(rows))

Every run trains the same config but `sync.algorithm` and `gba.straggler_prob`. sync_sgd trains for real on R
replicas (train.py); its emulated time is read from the same seeded worker step times that order gba's and
async_sgd's arrivals (`gba.WorkerStepTimes`): each of its global steps waits for its slowest worker. So the three
face the same stragglers, and their emulated examples/sec compare; real examples/sec and wall time are this
machine's and say what the emulation cost. sync_sgd's training does not depend on the step times, so it is trained
once and its row repeated under each straggler setting with that setting's emulated time.
"""

import copy
import pathlib
from typing import Any

import ml_collections

from shadowsync_jax import gba
from shadowsync_jax import input_pipeline
from shadowsync_jax import train

ALGORITHMS = ('sync_sgd', 'async_sgd', 'gba')


def config_for(base: ml_collections.ConfigDict, algorithm: str, straggler_prob: float) -> ml_collections.ConfigDict:
  config = copy.deepcopy(base)
  config.sync.algorithm = algorithm
  config.gba.straggler_prob = straggler_prob
  return config


def run(base: ml_collections.ConfigDict, root: str | pathlib.Path, straggler_probs: tuple[float, ...] = (0.0, 0.1),
        algorithms: tuple[str, ...] = ALGORITHMS) -> list[dict[str, Any]]:
  """Trains every (straggler_prob, algorithm) in `root/p<prob>/<algorithm>`; returns the summaries, each with the
  emulated figures (sync_sgd's computed from the step times) and its 'straggler_prob'."""
  rows, sync_sgd = [], None
  for prob in straggler_probs:
    for algorithm in algorithms:
      config = config_for(base, algorithm, prob)
      if algorithm == 'sync_sgd' and sync_sgd is not None:  # Trains the same model whatever the step times.
        summary = {**sync_sgd, 'config': config.to_dict()}
      else:
        workdir = pathlib.Path(root) / f'p{prob}' / algorithm
        if (workdir / 'summary.json').exists():  # It would resume at its end and train nothing.
          raise ValueError(f'{workdir} holds a finished run already; give the study a new workdir.')
        print(f'--- {algorithm}, straggler_prob={prob}', flush=True)
        summary = train.train_and_evaluate(config, workdir)
      if algorithm == 'sync_sgd':
        sync_sgd = summary = {**summary, **_sync_sgd_emulated(config)}
      rows.append({**summary, 'straggler_prob': prob})
  return rows


def _sync_sgd_emulated(config: ml_collections.ConfigDict) -> dict[str, float]:
  steps = input_pipeline.num_steps(config.data.num_train_examples, config.num_replicas, config.batch_size)
  seconds = gba.WorkerStepTimes.sample(config.gba, config.num_replicas, steps, config.seed).sync_time_s(0, steps)
  return {'emulated_time_s': seconds,
          'emulated_examples_per_sec': steps * config.num_replicas * config.batch_size / seconds}


def table(rows: list[dict[str, Any]]) -> str:
  """A markdown table, each row compared with sync_sgd at the same straggler setting."""
  lines = ['| stragglers | algorithm | eval NE | NE vs sync_sgd | AUC | emulated ex/s | vs sync_sgd | real ex/s | '
           'wall time | mean staleness | decayed / dropped / lost |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    sync = next(s for s in rows if s['sync_algorithm'] == 'sync_sgd' and s['straggler_prob'] == r['straggler_prob'])
    slowdown = r['config']['gba']['straggler_slowdown']
    stragglers = 'none' if r['straggler_prob'] == 0 else f'{r["straggler_prob"]:.0%} of steps {slowdown:g}x slower'
    staleness = '' if r.get('mean_staleness') is None else f'{r["mean_staleness"]:.2f} (max {r["max_staleness"]})'
    counts = ('' if r.get('decayed_gradients') is None
              else f'{r["decayed_gradients"]} / {r["dropped_gradients"]} / {r["lost_tokens"]}')
    real = '' if r['examples_per_sec'] is None else f'{r["examples_per_sec"]:,.0f}'
    lines.append(
        f'| {stragglers} | {r["sync_algorithm"]} | {r["eval_ne"]:.4f} | '
        f'{100 * (r["eval_ne"] / sync["eval_ne"] - 1):+.2f}% '
        f'| {r["eval_auc"]:.4f} | {r["emulated_examples_per_sec"]:,.0f} | '
        f'{r["emulated_examples_per_sec"] / sync["emulated_examples_per_sec"]:.2f}x | {real} | '
        f'{r["wall_time_s"]:.0f} s | {staleness} | {counts} |')
  first = rows[0]
  gba_config = first['config']['gba']
  floor = f'Bayes NE floor {first["bayes_ne"]:.4f}; ' if first.get('bayes_ne') else ''
  lines.append(f'\n{floor}{first["num_replicas"]} workers x batch {first["config"]["batch_size"]}, '
               f'{first["train_examples"]:,} training examples; step time {gba_config["step_time_s"]} s emulated, '
               f'jitter {gba_config["step_time_jitter"]}; gba staleness threshold {gba_config["staleness_threshold"]}, '
               f'decay {gba_config["staleness_decay"]}.')
  return '\n'.join(lines)
