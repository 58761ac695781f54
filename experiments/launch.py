r"""Runs a job of N processes on this machine, restarts it when a process dies, and fails if it cannot finish.

  python -m experiments.launch --num_processes=2 [--max_restarts=3] -- --workdir=/tmp/job \
      --config.num_replicas=8 --config.sync.algorithm=shadow_ma [--config.recovery.mode=partial]

Everything after `--` goes to every `python -m experiments.train` process (`shadowsync_jax.parallel.launcher`).
With `--max_restarts=N` the job comes back after a process is killed, crashes or hangs past `--peer_timeout_s`,
up to N times (`shadowsync_jax.parallel.supervisor`); what each process restores is `recovery.mode`'s choice.
Failures on purpose: `--kill_at=PROCESS@STEP[,...]` (each once, in the order listed; tests) and `--kill_mtbf_s=S
--kill_seed=K` (a random process SIGKILLed at exponential times of mean S seconds; studies). With restarts left,
the next start waits ready (`--warm_standby`, the default: imported, its coordinator serving) from the moment every
process trains, so a restart costs what a start costs after its imports: 1.3-1.8 s from a death to training again
on the default problem here (docs/studies/real_failures.md), against 4-5 s started cold.

Across emulated hosts (root and iproute2; `shadowsync_jax.parallel.netns`, `experiments.hosts`):

  python -m experiments.launch --num_processes=2 --hosts=netns --link_profile=100mbit \
      [--partition=HOST:AFTER_S:SECONDS] -- --workdir=/tmp/job --config.sync.algorithm=shadow_ma

runs process i in its own network namespace (host i, 10.77.0.{i+1}) behind a link shaped to the profile (10gbit,
1gbit, 100mbit, 10mbit, none; or one per host, comma-separated), the coordinator in host 0; a partition cuts a
host's link for SECONDS, AFTER_S after every process trains. The hosts are removed when the launcher ends.
"""

import contextlib
import sys

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import netns
from shadowsync_jax.parallel import supervisor

flags.DEFINE_integer('num_processes', 2, 'Processes to start.')
flags.DEFINE_integer(
  'cpu_devices', supervisor.DEFAULT_CPU_DEVICES, 'Virtual CPU devices per process (the replicas one process can hold).'
)
flags.DEFINE_float('peer_timeout_s', 30.0, 'Passed to every process: how long a silent or stalled peer is waited for.')
flags.DEFINE_float('grace_s', 60.0, 'After a failure, how long the other processes get to stop on their own.')
flags.DEFINE_bool('pin_cpus', False, 'Pin each process to its own share of the cores.')
flags.DEFINE_integer('max_restarts', 0, 'How many times the job is started again after a failure.')
flags.DEFINE_string('kill_at', '', 'PROCESS@STEP[,...]: SIGKILL that process at that step (once each, in order).')
flags.DEFINE_float('kill_mtbf_s', 0.0, 'SIGKILL a random process at exponential times of this mean (0: never).')
flags.DEFINE_integer('kill_seed', 0, 'Seed of the random kills (which process, when).')
flags.DEFINE_string('module', 'experiments.train', 'The Python module every process runs.')
flags.DEFINE_bool(
  'warm_standby',
  True,
  'Start the next start of the job ahead (imported, waiting) once every process trains, so a restart skips the '
  "imports and the coordinator's start (the module must take --standby).",
)
flags.DEFINE_enum('hosts', 'local', ['local', 'netns'], 'local: every process on 127.0.0.1; netns: emulated hosts.')
flags.DEFINE_string('link_profile', 'none', "With --hosts=netns: every host's link ('100mbit'), or one per host.")
flags.DEFINE_multi_string('partition', [], 'With --hosts=netns: HOST:AFTER_S:SECONDS, a link cut (repeatable).')
FLAGS = flags.FLAGS


def main(argv):
  try:
    schedule = fault_injection.KillSchedule.parse(
      FLAGS.kill_at, FLAGS.kill_mtbf_s, FLAGS.kill_seed, FLAGS.num_processes
    )
  except ValueError as error:
    cli.exit_with_usage_error(str(error))
  if FLAGS.max_restarts < 0:
    cli.exit_with_usage_error(f'--max_restarts={FLAGS.max_restarts} must be >= 0.')
  try:
    hosts, partitions = _emulated_hosts()
    with hosts or contextlib.nullcontext():
      code = supervisor.supervise(
        argv[1:],
        FLAGS.num_processes,
        FLAGS.cpu_devices,
        FLAGS.peer_timeout_s,
        FLAGS.grace_s,
        FLAGS.pin_cpus,
        FLAGS.max_restarts,
        schedule,
        FLAGS.module,
        hosts=hosts,
        partitions=partitions,
        warm_standby=FLAGS.warm_standby,
      )
  except (ValueError, netns.HostsUnavailable) as error:
    cli.exit_with_usage_error(str(error))
  sys.exit(code)


def _emulated_hosts() -> tuple[netns.EmulatedHosts | None, tuple[netns.Partition, ...]]:
  """The hosts and partitions the flags ask for (not built yet); ValueError names a bad flag."""
  if FLAGS.hosts == 'local':
    if FLAGS.partition or FLAGS.link_profile != 'none':
      raise ValueError('--link_profile and --partition need --hosts=netns.')
    return None, ()
  partitions = tuple(netns.Partition.parse(text) for text in FLAGS.partition)
  for partition in partitions:
    if partition.host >= FLAGS.num_processes:
      raise ValueError(f'--partition={partition.host}:...: there are hosts 0 to {FLAGS.num_processes - 1}.')
  profiles = netns.link_profiles(FLAGS.link_profile, FLAGS.num_processes)
  return netns.EmulatedHosts(FLAGS.num_processes, profiles), partitions


if __name__ == '__main__':
  cli.run(main)
