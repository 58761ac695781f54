r"""The GBA study: sync_sgd, async_sgd and gba with the same hyperparameters, without and with stragglers.

  python -m experiments.gba_study [--config=experiments/configs/gba.py[:tiny]] [--straggler_prob=0.1] \
      [--workdir=DIR] [--out=benchmarks/results/gba_study.md] [--config.gba.KEY=VALUE ...]

Prints a markdown table (eval NE and its difference to sync_sgd, AUC, emulated examples/sec and its ratio to
sync_sgd's, real examples/sec, wall time, staleness, decayed/dropped gradients and lost tokens) and writes it with
the raw summaries to --out. The expected result is in the config's docstring; the README's section GBA shows a run.
"""

import pathlib
import tempfile

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from shadowsync_jax import study_report

flags.DEFINE_float('straggler_prob', 0.1, 'gba.straggler_prob of the runs with stragglers (the others have 0).')
flags.DEFINE_string('workdir', None, 'Where the runs go (default: a new temp directory).')
flags.DEFINE_string('out', 'benchmarks/results/gba_study.md', 'Where the table and the raw summaries go.')
config_flags.DEFINE_config_file('config', 'experiments/configs/gba.py', 'The study\'s base config.',
                                lock_config=True)
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_num_cpu_devices', 8)
  from shadowsync_jax import gba_study  # pylint: disable=g-import-not-at-top  (after the device count is set)
  root = pathlib.Path(FLAGS.workdir or tempfile.mkdtemp(prefix='gba_study_'))
  rows = gba_study.run(FLAGS.config, root, straggler_probs=(0.0, FLAGS.straggler_prob))
  text = gba_study.table(rows)
  print(text)
  out = study_report.write(FLAGS.out, 'GBA study', study_report.command_line(), text, rows, root=root)
  print(f'-> {out}')


if __name__ == '__main__':
  app.run(main)
