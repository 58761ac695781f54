r"""The ShadowSync study: every sync algorithm on the same data, R replicas, total training data fixed, one run.

  python -m benchmarks.sync_study [--repeats=3] [--num_replicas=8] [--batch_size=256] \
      [--num_train_examples=2000000] [--min_interval_s=auto|SECONDS] [--out=benchmarks/results/sync_study.md]

On the default config (batch 256 per replica, the whole embedded stream of 2M examples) but 8 replicas. Runs
`none`, `sync_sgd`, the three foreground algorithms (every `--every_k_steps`), the three shadow algorithms, and then
each foreground algorithm again with k equal to its shadow counterpart's measured mean sync gap, as the ShadowSync
paper compares them. The shadow rounds keep the default pace, `sync.min_interval_s='auto'` (paced to
cost at most `sync.max_overhead` of the trainers' throughput), unless `--min_interval_s` sets one. With
`--repeats=N` the whole grid runs N times in turn and examples/sec is the best of the N (external load only ever
slows a run down). Prints a markdown table (eval NE, AUC, examples/sec and its ratio to `none`, rounds, mean sync
gap, the shadow rounds' pace) and writes it, with every setting changed from the defaults and the raw summaries as
JSON, to `--out`.
"""

import pathlib
import tempfile

from absl import flags
from absl import logging
import jax

from shadowsync_jax import cli
from shadowsync_jax import config as config_lib
from shadowsync_jax.studies import report as study_report

flags.DEFINE_integer('num_replicas', 8, 'Replicas (virtual CPU devices on a CPU machine).')
flags.DEFINE_integer(
  'num_train_examples', None, 'Length of the one-pass training stream, for every run; unset: the default (all of it).'
)
flags.DEFINE_integer('batch_size', None, 'Examples per replica per step; unset: the default (256).')
flags.DEFINE_integer('every_k_steps', 10, 'k of the foreground algorithms in their first runs.')
flags.DEFINE_string('min_interval_s', None, "sync.min_interval_s: seconds, or 'auto'; unset: the default ('auto').")
flags.DEFINE_string('what', 'all', "What a round syncs: 'all' or 'dense'.")
flags.DEFINE_string('embedding_placement', 'replicated', "'replicated' or 'shared'.")
flags.DEFINE_string('out', 'benchmarks/results/sync_study.md', 'Where the table and raw summaries go.')
flags.DEFINE_bool('tiny', False, 'The tiny config (seconds per run), for a smoke test.')
flags.DEFINE_integer(
  'repeats',
  1,
  'Runs of the whole grid, interleaved; examples/sec is the best of them (on a '
  'shared machine the best run is the least disturbed one), NE and the rest from the first.',
)
FLAGS = flags.FLAGS

ALGORITHMS = ('none', 'sync_sgd', 'fr_ma', 'fr_ea', 'fr_bmuf', 'shadow_ma', 'shadow_ea', 'shadow_bmuf')


def _config(algorithm: str, every_k_steps: int):
  from experiments.configs import default  # pylint: disable=g-import-not-at-top  (after the device count is set)

  config = default.get_config('tiny' if FLAGS.tiny else '')
  config.num_replicas = FLAGS.num_replicas
  if FLAGS.batch_size is not None:
    config.batch_size = FLAGS.batch_size
  if FLAGS.num_train_examples is not None and not FLAGS.tiny:
    config.data.num_train_examples = FLAGS.num_train_examples
  config.sync.algorithm = algorithm
  config.sync.every_k_steps = every_k_steps
  if FLAGS.min_interval_s is not None:
    config.sync.min_interval_s = config_lib.min_interval_from_text(FLAGS.min_interval_s)
  config.sync.what = FLAGS.what
  config.sync.embedding_placement = FLAGS.embedding_placement
  config.train.progress_every_s = 30.0
  return config


def _changed_settings() -> str:
  """Every key the study sets away from the default config, as key=value; those that vary per row, named."""
  from experiments.configs import default  # pylint: disable=g-import-not-at-top

  base = config_lib.flat_keys(default.get_config('tiny' if FLAGS.tiny else ''))
  per_row = ('sync.algorithm', 'sync.every_k_steps')
  config = config_lib.flat_keys(_config('none', FLAGS.every_k_steps))
  changed = [f'{k}={v}' for k, v in config.items() if k not in per_row and base[k] != v]
  return ', '.join(
    changed + [f'sync.every_k_steps={FLAGS.every_k_steps} then the shadow gap', 'sync.algorithm per row']
  )


def _run(label: str, algorithm: str, every_k_steps: int, root: pathlib.Path) -> dict:
  from shadowsync_jax import train  # pylint: disable=g-import-not-at-top

  print(f'--- {label}', flush=True)
  summary = train.train_and_evaluate(_config(algorithm, every_k_steps), root / label)
  summary['label'] = label
  return summary


def _table(rows: list[dict]) -> str:
  none_eps = next(r['examples_per_sec'] for r in rows if r['label'] == 'none')
  sync_ne = next(r['eval_ne'] for r in rows if r['label'] == 'sync_sgd')
  floor = rows[0]['bayes_ne']
  lines = [
    '| run | eval NE | NE vs sync_sgd | AUC | examples/sec | vs none | rounds | mean sync gap | pace (s) |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    gap = '' if r['mean_sync_gap'] is None else f'{r["mean_sync_gap"]:.1f}'
    pace = '' if r.get('sync_interval_s') is None else f'{r["sync_interval_s"]:.2f}'
    lines.append(
      f'| {r["label"]} | {r["eval_ne"]:.4f} | {100 * (r["eval_ne"] / sync_ne - 1):+.2f}% | '
      f'{r["eval_auc"]:.4f} | {r["examples_per_sec"]:,.0f} | {r["examples_per_sec"] / none_eps:.2f} | '
      f'{r["sync_rounds"]} | {gap} | {pace} |'
    )
  lines.append(f'\nBayes NE floor: {floor:.4f}' if floor else '')
  return '\n'.join(lines)


def main(argv):
  del argv
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_num_cpu_devices', max(FLAGS.num_replicas, 1))
  root = pathlib.Path(tempfile.mkdtemp(prefix='sync_study_'))
  rows = [_run(a, a, FLAGS.every_k_steps, root / 'r0') for a in ALGORITHMS]
  gap_runs = []
  for name in ('ma', 'ea', 'bmuf'):
    shadow = next(r for r in rows if r['label'] == f'shadow_{name}')
    k = max(1, round(shadow['mean_sync_gap'] or FLAGS.every_k_steps))
    gap_runs.append((f'fr_{name} (k={k}, the shadow gap)', f'fr_{name}', k))
  rows += [_run(label, algorithm, k, root / 'r0') for label, algorithm, k in gap_runs]
  runs = [(a, a, FLAGS.every_k_steps) for a in ALGORITHMS] + gap_runs
  for repeat in range(1, FLAGS.repeats):
    for row, (label, algorithm, k) in zip(rows, runs):
      again = _run(label, algorithm, k, root / f'r{repeat}')
      row['examples_per_sec'] = max(row['examples_per_sec'], again['examples_per_sec'])
  table = _table(rows)
  print(table)
  variant = 'tiny' if FLAGS.tiny else 'default'
  setup = (
    f'The {variant} config but {_changed_settings()}; best examples/sec of '
    f'{FLAGS.repeats} runs, {rows[0]["train_examples"]:,} training examples in all (whole global steps). Pace: '
    'the interval between round starts the shadow rounds ended on.'
  )
  out = study_report.write(FLAGS.out, 'Sync study', study_report.command_line(), table, rows, note=setup)
  print(f'written to {out}')


if __name__ == '__main__':
  cli.run(main)
