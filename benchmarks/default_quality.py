r"""How hard the default problem is: NE of the constant predictor, dense-only logistic regression, the DLRM, and
the Bayes floor, on the default config's eval set, all measured in one run.

  python -m benchmarks.default_quality [--config=experiments/configs/default.py] [--seeds=0,1,2] \
      [--workdir=/tmp/quality] [--out=benchmarks/results/default_quality.md]

Each seed (its own stream, teacher and initial model) gives the whole table; the last column reads the distance to
the floor over the seeds. `--seeds=` (empty) runs the config's own seed alone.

Targets (issue 2): the DLRM within 3% (relative) of the floor; dense-only logistic regression at least 10% above it.
Logistic regression is fitted on the first `--lr_train_examples` examples of the same training stream.
"""

import statistics
import tempfile

from absl import flags
from absl import logging
import ml_collections

from shadowsync_jax import cli
from shadowsync_jax import config as config_lib
from shadowsync_jax import train
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.studies import baselines
from shadowsync_jax.studies import report

flags.DEFINE_string('workdir', None, 'Where the DLRM run goes (default: a fresh temporary directory).')
flags.DEFINE_list('seeds', ['0', '1', '2'], "Seeds to run; empty: the config's seed alone.")
flags.DEFINE_integer('lr_train_examples', 500_000, 'Training examples for the logistic-regression baseline.')
flags.DEFINE_string('out', 'benchmarks/results/default_quality.md', 'Where the table and raw figures go.')
cli.define_config_flag('experiments/configs/default.py', 'Experiment config file.')
FLAGS = flags.FLAGS


def _one_seed(config) -> tuple[dict[str, float], dict]:
  """Each predictor's eval NE on `config`'s stream, and the DLRM's summary."""
  train_source, eval_source = input_pipeline.make_sources(config.data, config.seed)
  num_lr = min(FLAGS.lr_train_examples, config.data.num_train_examples)
  train_examples = train_source.read(0, num_lr)
  eval_examples = input_pipeline.eval_batch(eval_source, config.data.num_eval_examples)
  rows = {
    'constant base-rate predictor': baselines.constant_predictor_ne(train_examples, eval_examples),
    'logistic regression, dense features only': baselines.dense_logistic_regression_ne(train_examples, eval_examples),
  }
  workdir = f'{FLAGS.workdir}/seed_{config.seed}' if FLAGS.workdir else tempfile.mkdtemp(prefix='quality_')
  summary = train.train_and_evaluate(config, workdir)
  rows['DLRM (experiments.train, default config)'] = summary['eval_ne']
  rows['Bayes floor (true probabilities)'] = summary['bayes_ne']
  return rows, summary


def table(per_seed: dict[int, dict[str, float]]) -> str:
  """A row a predictor: its eval NE and distance to the floor for each seed, then the distance's mean and range."""
  seeds = list(per_seed)
  head = ['predictor', *(f'seed {s}: eval NE, vs floor' for s in seeds)]
  if len(seeds) > 1:
    head.append('vs floor: mean (min to max)')
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for name in per_seed[seeds[0]]:
    gaps = [100 * (per_seed[s][name] / per_seed[s]['Bayes floor (true probabilities)'] - 1) for s in seeds]
    cells = [f'{per_seed[s][name]:.4f}, {gap:+.1f}%' for s, gap in zip(seeds, gaps)]
    if len(seeds) > 1:
      cells.append(f'{statistics.mean(gaps):+.2f}% ({min(gaps):+.1f}% to {max(gaps):+.1f}%)')
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def main(argv):
  del argv
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  base = config_lib.resolve(FLAGS.config)  # Data lengths of 0: the whole of the data.
  seeds = [int(seed) for seed in FLAGS.seeds] if FLAGS.seeds else [base.seed]
  per_seed, summaries = {}, {}
  for seed in seeds:
    config = ml_collections.ConfigDict(base.to_dict())
    config.seed = seed
    per_seed[seed], summaries[seed] = _one_seed(config)
  text = table(per_seed)
  print(text)
  speeds = ', '.join(f'{summaries[s]["examples_per_sec"]:,.0f} ({summaries[s]["wall_time_s"]:.0f} s)' for s in seeds)
  num_lr = min(FLAGS.lr_train_examples, base.data.num_train_examples)
  note = (
    f'Seeds {", ".join(map(str, seeds))} (each its own stream, teacher and initial model); '
    f'{summaries[seeds[0]]["train_examples"]:,} training examples, {base.data.num_eval_examples:,} held out; '
    f'logistic regression fitted on the first {num_lr:,}. The DLRM trained at {speeds} examples/sec '
    f'(seconds end to end), seed by seed.'
  )
  raw = {'eval_ne': per_seed, 'dlrm': summaries}
  out = report.write(FLAGS.out, 'How hard the default problem is', report.command_line(), text, raw, note=note)
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
