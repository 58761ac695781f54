r"""Starts a job of N processes on this machine (127.0.0.1), streams their output, and fails if any of them fails.

  python -m experiments.launch --num_processes=2 -- --workdir=/tmp/job --config.num_replicas=8 \
      --config.sync.algorithm=shadow_ma

Everything after `--` goes to every `python -m experiments.train` process (`shadowsync_jax.parallel.launcher`).
"""

import sys

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.parallel import launcher

flags.DEFINE_integer('num_processes', 2, 'Processes to start.')
flags.DEFINE_integer('cpu_devices', 4, 'Virtual CPU devices per process (the replicas one process can hold).')
flags.DEFINE_float('peer_timeout_s', 30.0, 'Passed to every process: how long a silent peer is waited for.')
flags.DEFINE_float('grace_s', 60.0, 'After a failure, how long the other processes get to stop on their own.')
flags.DEFINE_bool('pin_cpus', False, 'Pin each process to its own share of the cores.')
flags.DEFINE_string('module', 'experiments.train', 'The Python module every process runs.')
FLAGS = flags.FLAGS


def main(argv):
  sys.exit(
    launcher.launch(
      argv[1:],
      FLAGS.num_processes,
      FLAGS.cpu_devices,
      FLAGS.peer_timeout_s,
      FLAGS.grace_s,
      FLAGS.pin_cpus,
      FLAGS.module,
    )
  )


if __name__ == '__main__':
  cli.run(main)
