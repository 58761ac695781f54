r"""Trains a DLRM on R replicas and evaluates it: the framework's main binary.

  python -m experiments.train --workdir=/tmp/run [--config=experiments/configs/default.py] \
      [--config.num_replicas=8 --config.sync.algorithm=sync_sgd ...]

Rerunning with the same --workdir resumes from its newest checkpoint. Results: WORKDIR/summary.json,
WORKDIR/metrics.jsonl and TensorBoard events (`tensorboard --logdir=WORKDIR`).
"""

import json

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and summary.json.', required=True)
flags.DEFINE_integer('cpu_devices', 8, 'Virtual devices to create when running on CPU (each hosts one replica).')
config_flags.DEFINE_config_file('config', 'experiments/configs/default.py', 'Experiment config file.',
                                lock_config=True)
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO; keep the console to progress and results.
    logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  from shadowsync_jax import train  # pylint: disable=g-import-not-at-top  (after the device count is set)
  summary = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  print(json.dumps({k: v for k, v in summary.items() if k != 'config'}, indent=2))
  if summary.get('eval_ne') is not None:
    floor = summary['bayes_ne']
    vs_floor = f' (Bayes NE floor {floor:.4f}: {100 * (summary["eval_ne"] / floor - 1):+.1f}%)' if floor else ''
    print(f'eval NE {summary["eval_ne"]:.4f}{vs_floor}  AUC {summary["eval_auc"]:.4f}  '
          f'{summary["examples_per_sec"]:,.0f} examples/sec  -> {FLAGS.workdir}/summary.json')


if __name__ == '__main__':
  app.run(main)
