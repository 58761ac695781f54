r"""Emulated hosts from the command line: network namespaces with shaped links (shadowsync_jax.parallel.netns).

  python -m experiments.hosts run --num_hosts=2 [--profile=100mbit | --profile=1gbit,100mbit] \
      [--partition=HOST:AFTER_S:SECONDS ...] -- COMMAND ARGS...   # COMMAND in every host, then removes them
  python -m experiments.hosts up --num_hosts=2 [--profile=...] [--partition=...]   # holds them until Ctrl-C
  python -m experiments.hosts list                  # the sets of hosts on this machine and who holds them
  python -m experiments.hosts down [--all]          # removes sets whose holder is gone; --all: ends the live ones too

In COMMAND, `{host}` is the host's index, `{address}` its address and `{address0}` host 0's (the coordinator's in a
job). Output lines are prefixed `[h0]`, `[h1]`, ...; the exit status is that of the first host (by index) whose
command failed. Host i is 10.77.0.{i+1}; profiles: 10gbit, 1gbit, 100mbit, 10mbit, none (unshaped). The hosts are
removed, and what still runs in them killed, on exit, on an error, on Ctrl-C, SIGTERM and SIGHUP; after a SIGKILL,
by the next use or by `down`. Needs root and iproute2 (`apt-get install iproute2`).

For example, the bandwidth between two hosts on a 100 Mbit/s link (iperf3 installed):

  python -m experiments.hosts run --num_hosts=2 --profile=100mbit -- \
      sh -c 'if [ {host} = 0 ]; then iperf3 -s -1; else sleep 0.5; iperf3 -c {address0} -t 3; fi'
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.parallel import netns

flags.DEFINE_integer('num_hosts', 2, 'Hosts to build.')
flags.DEFINE_string('profile', 'none', "Link profile of every host ('1gbit'), or one per host ('1gbit,100mbit').")
flags.DEFINE_multi_string('partition', [], "HOST:AFTER_S:SECONDS: host's link down for SECONDS, AFTER_S from now.")
flags.DEFINE_bool('all', False, 'down: also end the holders that are alive (SIGTERM), then remove their hosts.')
FLAGS = flags.FLAGS

_COMMANDS = ('run', 'up', 'list', 'down')
_PR_SET_PDEATHSIG = 1
_DOWN_WAIT_S = 10.0


def main(argv):
  if len(argv) < 2 or argv[1] not in _COMMANDS:
    cli.exit_with_usage_error(f'say what to do: one of {", ".join(_COMMANDS)} (python -m experiments.hosts --help).')
  command, rest = argv[1], argv[2:]
  if command != 'run' and rest:
    cli.exit_with_usage_error(f'unexpected arguments after {command}: {rest}')
  if command == 'run' and not rest:
    cli.exit_with_usage_error('run: give the command to run in every host after --.')
  try:
    if command == 'list':
      return _list()
    if command == 'down':
      return _down()
    profiles = netns.link_profiles(FLAGS.profile, FLAGS.num_hosts)
    partitions = [netns.Partition.parse(text) for text in FLAGS.partition]
    with netns.EmulatedHosts(FLAGS.num_hosts, profiles) as hosts:
      for partition in partitions:
        hosts.partition(partition.host, partition.seconds, partition.after_s)
      _describe(hosts, partitions)
      if command == 'up':
        try:
          while True:
            signal.pause()
        finally:
          print('[hosts] removing the hosts', flush=True)
      sys.exit(_run_everywhere(hosts, rest))
  except (ValueError, netns.HostsUnavailable) as error:
    cli.exit_with_usage_error(str(error))


def _describe(hosts: netns.EmulatedHosts, partitions: list[netns.Partition]) -> None:
  print(f'[hosts] {hosts.num_hosts} hosts {hosts.prefix}-h0 .. -h{hosts.num_hosts - 1}', flush=True)
  for host in range(hosts.num_hosts):
    link = hosts.profiles[host] or 'unshaped'
    prefix = ' '.join(hosts.command_prefix(host))
    print(f'[hosts] host {host}: {hosts.address(host)}, link {link}; run in it: {prefix} COMMAND', flush=True)
  for partition in partitions:
    print(f'[hosts] host {partition.host} cut off at +{partition.after_s:g} s for {partition.seconds:g} s', flush=True)


def _run_everywhere(hosts: netns.EmulatedHosts, argv: list[str]) -> int:
  """`argv` in every host at once, output prefixed; the exit status of the first host whose command failed."""
  processes = []
  for host in range(hosts.num_hosts):
    fields = {'host': host, 'address': hosts.address(host), 'address0': hosts.address(0)}
    processes.append(
      subprocess.Popen(
        hosts.command(host, [arg.format(**fields) for arg in argv]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # Ctrl-C reaches this tool alone; tearing the hosts down kills the commands.
        preexec_fn=_die_with_parent,
      )
    )
  pumps = [threading.Thread(target=_pump, args=(f'[h{i}] ', p.stdout), daemon=True) for i, p in enumerate(processes)]
  for pump in pumps:
    pump.start()
  codes = [process.wait() for process in processes]
  for pump in pumps:
    pump.join()
  return next((code if code > 0 else 128 - code for code in codes if code), 0)


def _pump(prefix: str, stream) -> None:
  for line in stream:
    print(prefix + line, end='', flush=True)


def _die_with_parent() -> None:
  ctypes.CDLL('libc.so.6', use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _list() -> None:
  holders = netns.live_holders()
  names = netns.list_namespaces()
  for prefix, pid in sorted(holders.items()):
    hosts = [name for name in names if name.startswith(f'{prefix}-h')]
    print(f'{prefix}: {len(hosts)} hosts, held by process {pid}')
  stale = sorted({name.rsplit('-', 1)[0] for name in names if name.startswith('ss') and '-' in name} - set(holders))
  for prefix in stale:
    print(f'{prefix}: its holder is gone (python -m experiments.hosts down removes it)')
  if not holders and not stale:
    print('no emulated hosts')


def _down() -> None:
  if FLAGS.all:
    holders = netns.live_holders()
    for prefix, pid in holders.items():
      print(f'ending {prefix}, held by process {pid} (SIGTERM)')
      _terminate(pid)
    deadline = time.monotonic() + _DOWN_WAIT_S
    while set(holders) & set(netns.live_holders()) and time.monotonic() < deadline:
      time.sleep(0.1)
  for prefix in netns.cleanup_stale():
    print(f'removed {prefix}')
  for prefix, pid in netns.live_holders().items():
    print(f'{prefix} is still held by process {pid}' + ('' if FLAGS.all else ' (--all ends it)'))


def _terminate(pid: int) -> None:
  try:
    os.kill(pid, signal.SIGTERM)
  except ProcessLookupError:
    pass


if __name__ == '__main__':
  cli.run(main)
