r"""How hard the default problem is: NE of the constant predictor, dense-only logistic regression, the DLRM, and
the Bayes floor, on the default config's eval set, all measured in one run.

  python -m benchmarks.default_quality [--config=experiments/configs/default.py] [--workdir=/tmp/quality] \
      [--out=benchmarks/results/default_quality.md]

Targets (issue 2): the DLRM within 3% (relative) of the floor; dense-only logistic regression at least 10% above it.
Logistic regression is fitted on the first `--lr_train_examples` examples of the same training stream.
"""

import tempfile

from absl import flags
from absl import logging

from shadowsync_jax import cli
from shadowsync_jax import train
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.studies import baselines
from shadowsync_jax.studies import report

flags.DEFINE_string('workdir', None, 'Where the DLRM run goes (default: a fresh temporary directory).')
flags.DEFINE_integer('lr_train_examples', 500_000, 'Training examples for the logistic-regression baseline.')
flags.DEFINE_string('out', 'benchmarks/results/default_quality.md', 'Where the table and raw figures go.')
cli.define_config_flag('experiments/configs/default.py', 'Experiment config file.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  config = FLAGS.config
  train_source, eval_source = input_pipeline.make_sources(config.data, config.seed)
  num_lr = min(FLAGS.lr_train_examples, config.data.num_train_examples)
  train_examples = train_source.read(0, num_lr)
  eval_examples = input_pipeline.eval_batch(eval_source, config.data.num_eval_examples)
  rows = {
    'constant base-rate predictor': baselines.constant_predictor_ne(train_examples, eval_examples),
    'logistic regression, dense features only': baselines.dense_logistic_regression_ne(train_examples, eval_examples),
  }
  summary = train.train_and_evaluate(config, FLAGS.workdir or tempfile.mkdtemp(prefix='quality_'))
  rows['DLRM (experiments.train, default config)'] = summary['eval_ne']
  floor = summary['bayes_ne']
  rows['Bayes floor (true probabilities)'] = floor
  lines = ['| predictor | eval NE | vs floor |', '|---|---|---|']
  lines += [f'| {name} | {ne:.4f} | {100 * (ne / floor - 1):+.1f}% |' for name, ne in rows.items()]
  table = '\n'.join(lines)
  print(table)
  note = (
    f'Seed {config.seed}; {summary["train_examples"]:,} training examples, {config.data.num_eval_examples:,} held out; '
    f'logistic regression fitted on the first {num_lr:,}. The DLRM trained at {summary["examples_per_sec"]:,.0f} '
    f'examples/sec ({summary["wall_time_s"]:.0f} s end to end).'
  )
  raw = {'eval_ne': rows, 'dlrm': summary}
  out = report.write(FLAGS.out, 'How hard the default problem is', report.command_line(), table, raw, note=note)
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
