r"""The GBA study: sync_sgd, async_sgd and gba with the same hyperparameters, without and with stragglers.

  python -m benchmarks.gba_study [--config=experiments/configs/gba.py[:tiny]] [--straggler_prob=0.1] \
      [--tune_learning_rates=0.025,0.05,0.1,0.2] [--seeds=0,1,2] [--workdir=DIR] \
      [--out=benchmarks/results/gba_study.md] [--config.gba.KEY=VALUE ...]

With --tune_learning_rates, sync_sgd first trains at each rate (the MLP's and the tables' alike) and the study
runs at the one of the best eval NE (the GBA paper's protocol: hyperparameters tuned for synchronous training, then
kept); without it, at the config's rates. With several --seeds (each a different teacher, initialization and data
stream) the study runs once per seed (the rates tuned on the first) and a table of the means follows. Prints
markdown tables (eval NE and its difference to sync_sgd, AUC, emulated examples/sec and its ratio to sync_sgd's,
real examples/sec, wall time, staleness, decayed/dropped gradients and lost tokens) and writes them with the raw
summaries to --out. The expected result is in the config's docstring; docs/studies/gba.md shows a run.
"""

import pathlib
import tempfile

from absl import app
from absl import flags
from absl import logging
import jax

from shadowsync_jax import cli
from shadowsync_jax.studies import report as study_report

flags.DEFINE_float('straggler_prob', 0.1, 'gba.straggler_prob of the runs with stragglers (the others have 0).')
flags.DEFINE_list(
  'tune_learning_rates',
  [],
  "Learning rates to train sync_sgd at first; the study runs at the best (default: the config's).",
)
flags.DEFINE_list('seeds', ['0'], "config.seed of the study's runs; several: one study per seed, then their means.")
flags.DEFINE_string('workdir', None, 'Where the runs go (default: a new temp directory).')
flags.DEFINE_string('out', 'benchmarks/results/gba_study.md', 'Where the table and the raw summaries go.')
cli.define_config_flag('experiments/configs/gba.py', "The study's base config.")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_num_cpu_devices', 8)
  from shadowsync_jax.studies import gba as gba_study  # pylint: disable=g-import-not-at-top  (after the device count is set)

  root = pathlib.Path(FLAGS.workdir or tempfile.mkdtemp(prefix='gba_study_'))
  seeds = [int(seed) for seed in FLAGS.seeds]
  config, sync_sgd, parts = gba_study.with_seed(FLAGS.config, seeds[0]), None, []
  if FLAGS.tune_learning_rates:
    rates = [float(rate) for rate in FLAGS.tune_learning_rates]
    best, summaries = gba_study.tune_learning_rate(config, root / 'tuning', rates)
    config, sync_sgd = gba_study.with_learning_rate(config, best), summaries[best]
    parts.append(f"sync_sgd's learning rate (seed {seeds[0]}):\n\n{gba_study.learning_rate_table(summaries)}")
  rows_by_seed = {}
  for seed in seeds:
    rows_by_seed[seed] = gba_study.run(
      gba_study.with_seed(config, seed),
      root / f'seed{seed}',
      straggler_probs=(0.0, FLAGS.straggler_prob),
      sync_sgd=sync_sgd if seed == seeds[0] else None,
    )
    parts.append(
      f'Seed {seed}, learning rate {config.optimizer.mlp_learning_rate:g}:\n\n{gba_study.table(rows_by_seed[seed])}'
    )
  if len(seeds) > 1:
    parts.append(f'Means over seeds {", ".join(map(str, seeds))}:\n\n{gba_study.mean_table(rows_by_seed)}')
  text = '\n\n'.join(parts)
  print(text)
  all_rows = [{**row, 'seed': seed} for seed, rows in rows_by_seed.items() for row in rows]
  out = study_report.write(FLAGS.out, 'GBA study', study_report.command_line(), text, all_rows, root=root)
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
