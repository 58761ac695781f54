r"""How hard the default problem is: NE of the constant predictor, dense-only logistic regression, the DLRM, and
the Bayes floor, on the default config's eval set, all measured in one run.

  python -m benchmarks.default_quality [--config=experiments/configs/default.py] [--workdir=/tmp/quality]

Targets (issue 2): the DLRM within 3% (relative) of the floor; dense-only logistic regression at least 10% above it.
Logistic regression is fitted on the first `--lr_train_examples` examples of the same training stream.
"""

import json
import tempfile

from absl import app
from absl import flags
from ml_collections import config_flags

from shadowsync_jax import baselines
from shadowsync_jax import input_pipeline
from shadowsync_jax import train

flags.DEFINE_string('workdir', None, 'Where the DLRM run goes (default: a fresh temporary directory).')
flags.DEFINE_integer('lr_train_examples', 500_000, 'Training examples for the logistic-regression baseline.')
config_flags.DEFINE_config_file('config', 'experiments/configs/default.py', 'Experiment config file.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  config = FLAGS.config
  train_source, eval_source = input_pipeline.make_sources(config.data, config.seed)
  num_lr = min(FLAGS.lr_train_examples, config.data.num_train_examples)
  train_examples = train_source.read(0, num_lr)
  eval_examples = input_pipeline.eval_batch(eval_source, config.data.num_eval_examples)
  rows = {
      'constant base-rate predictor': baselines.constant_predictor_ne(train_examples, eval_examples),
      'logistic regression, dense features only': baselines.dense_logistic_regression_ne(train_examples,
                                                                                          eval_examples),
  }
  summary = train.train_and_evaluate(config, FLAGS.workdir or tempfile.mkdtemp(prefix='quality_'))
  rows['DLRM (experiments.train, default config)'] = summary['eval_ne']
  floor = summary['bayes_ne']
  rows['Bayes floor (true probabilities)'] = floor
  print("\n| predictor | eval NE | vs floor |\n|---|---|---|")
  for name, ne in rows.items():
    print(f'| {name} | {ne:.4f} | {100 * (ne / floor - 1):+.1f}% |')
  print(json.dumps({'rows': rows, 'dlrm_examples_per_sec': summary['examples_per_sec'],
                    'train_examples': summary['train_examples'], 'wall_time_s': summary['wall_time_s']}))


if __name__ == '__main__':
  app.run(main)
