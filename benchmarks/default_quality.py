r"""How hard the default problem is: NE of the constant predictor, dense-only logistic regression, the DLRM, and
the Bayes floor, on the default config's eval set, all measured in one run.

  python -m benchmarks.default_quality [--config=experiments/configs/default.py] [--seeds=0,1,2] \
      [--workdir=/tmp/quality] [--out=benchmarks/results/default_quality.md]

What it runs and measures, and the table it prints and writes to `--out`: `shadowsync_jax.studies.default_quality`
(`--seeds=`, empty, runs the config's own seed alone).
"""

from absl import flags
from absl import logging

from shadowsync_jax import cli
from shadowsync_jax import config as config_lib
from shadowsync_jax.studies import default_quality
from shadowsync_jax.studies import report

flags.DEFINE_string('workdir', None, 'Where the DLRM run goes (default: a fresh temporary directory).')
flags.DEFINE_list('seeds', ['0', '1', '2'], "Seeds to run; empty: the config's seed alone.")
flags.DEFINE_integer('lr_train_examples', 500_000, 'Training examples for the logistic-regression baseline.')
flags.DEFINE_string('out', 'benchmarks/results/default_quality.md', 'Where the table and raw figures go.')
cli.define_config_flag('experiments/configs/default.py', 'Experiment config file.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  base = config_lib.resolve(FLAGS.config)  # Data lengths of 0: the whole of the data.
  seeds = [int(seed) for seed in FLAGS.seeds] if FLAGS.seeds else [base.seed]
  per_seed, summaries = default_quality.run(base, seeds, FLAGS.lr_train_examples, FLAGS.workdir)
  text = default_quality.table(per_seed)
  print(text)
  note = default_quality.note(base, seeds, summaries, FLAGS.lr_train_examples)
  raw = {'eval_ne': per_seed, 'dlrm': summaries}
  out = report.write(FLAGS.out, 'How hard the default problem is', report.command_line(), text, raw, note=note)
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
