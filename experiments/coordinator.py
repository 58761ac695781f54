r"""JAX's coordination service of a job in a process of its own (`shadowsync_jax.parallel.coordinator`).

  python -m experiments.coordinator --port=12345 --num_processes=4

Then start every training process with `--coordinator_address=THIS_HOST:12345 --nostart_coordinator`: any of them,
process 0 included, may then die without taking the others down (BUILD.md). Prints `ready` once it serves; stops
on SIGTERM or Ctrl-C.
"""

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.parallel import coordinator

flags.DEFINE_integer('port', None, 'Port to serve on, on every address of this host.', required=True)
flags.DEFINE_integer('num_processes', None, 'Processes in the job.', required=True)
flags.DEFINE_integer('heartbeat_timeout_s', 100, 'A process silent this long is dead to the service.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  coordinator.serve(FLAGS.port, FLAGS.num_processes, FLAGS.heartbeat_timeout_s)


if __name__ == '__main__':
  cli.run(main)
