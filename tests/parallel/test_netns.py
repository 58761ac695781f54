"""Emulated hosts (parallel.netns): two hosts reach each other at their own addresses, a link is shaped to its profile
and cut and restored, and nothing is left behind however the holder of the hosts ends.

The processes in the hosts are small Python programs (`_PEER`: sockets only, no JAX). Nothing sleeps to pass:
tests wait on a process's output or a link's state, with deadlines. Needs root and iproute2, as CI has; skipped
otherwise, with the reason.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from shadowsync_jax.parallel import netns

REPO = pathlib.Path(__file__).resolve().parents[2]
UNAVAILABLE = netns.unavailable_reason()
needs_hosts = pytest.mark.skipif(UNAVAILABLE is not None, reason=f'no emulated hosts here: {UNAVAILABLE}')
pytestmark = pytest.mark.xdist_group('jobs')  # Jobs of real processes run one at a time (pytest.ini).
PORT = 5000  # Every host has a network stack of its own: any port is free there.
DEADLINE_S = 20.0  # Only reached when something is broken.

# What runs in a host: `echo`: serves echoes (a thread per connection); `ask HOST MSG [TIMEOUT]`: prints its own
# address and the echo (or 'timeout'); `hold HOST`: connects, then echoes each stdin line through the server;
# `sink`: prints the bytes of one connection and how long they took (first byte to end); `send HOST NBYTES`.
_PEER = r"""
import socket, sys, threading, time
mode, args = sys.argv[1], sys.argv[2:]
def serve():
  server = socket.create_server(('', PORT))
  print('listening', flush=True)
  return server
def echo(connection):
  while data := connection.recv(65536):
    connection.sendall(data)
if mode == 'echo':
  server = serve()
  while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
elif mode == 'ask':
  try:
    with socket.create_connection((args[0], PORT), timeout=float(args[2]) if len(args) > 2 else 5) as sock:
      sock.sendall(args[1].encode())
      print(sock.getsockname()[0], sock.recv(100).decode(), flush=True)
  except (TimeoutError, socket.timeout):
    print('timeout', flush=True)
elif mode == 'hold':
  sock = socket.create_connection((args[0], PORT), timeout=60)
  print('connected', flush=True)
  for line in sys.stdin:
    sock.sendall(line.encode())
    print(sock.recv(100).decode().strip(), flush=True)
elif mode == 'sink':
  server = serve()
  connection, _ = server.accept()
  total, first = 0, None
  while data := connection.recv(1 << 20):
    first = first or time.perf_counter()
    total += len(data)
  print(total, time.perf_counter() - first, flush=True)
elif mode == 'send':
  with socket.create_connection((args[0], PORT)) as sock:
    sock.sendall(b'x' * int(args[1]))
""".replace('PORT', str(PORT))


@pytest.fixture
def hosts():
  if UNAVAILABLE is not None:
    pytest.skip(f'no emulated hosts here: {UNAVAILABLE}')
  with netns.EmulatedHosts(2) as built:
    yield built
  assert not _left_of(built.prefix)


def _left_of(prefix: str) -> list[str]:
  return [name for name in netns.list_namespaces() if name.startswith(f'{prefix}-')]


def _start(hosts, host: int, *args: str) -> subprocess.Popen:
  """A `_PEER` in `host`; a server has said 'listening' when this returns."""
  process = subprocess.Popen(
    hosts.command(host, [sys.executable, '-c', _PEER, *args]),
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
  )
  if args[0] in ('echo', 'sink', 'hold'):
    assert _line(process) in ('listening', 'connected')
  return process


def _line(process: subprocess.Popen) -> str:
  """The next line of `process`'s output (fails the test rather than hang: the hosts' teardown kills it)."""
  line = process.stdout.readline()
  assert line, f'the process ended (exit {process.wait()}) without printing'
  return line.strip()


def _ask(hosts, host: int, *args: str) -> str:
  return subprocess.run(
    hosts.command(host, [sys.executable, '-c', _PEER, 'ask', *args]),
    capture_output=True,
    text=True,
    check=True,
    timeout=DEADLINE_S,
  ).stdout.strip()


def _wait_until(condition, what: str) -> float:
  deadline = time.monotonic() + DEADLINE_S
  while not condition():
    assert time.monotonic() < deadline, f'{what} did not happen within {DEADLINE_S} s'
    time.sleep(0.01)
  return time.monotonic()


def test_two_hosts_reach_each_other_at_their_own_addresses(hosts):
  for server, client in ((1, 0), (0, 1)):
    _start(hosts, server, 'echo')
    assert _ask(hosts, client, hosts.address(server), f'hello from {client}') == (
      f'{hosts.address(client)} hello from {client}'
    )
  assert hosts.address(0) == '10.77.0.1' and hosts.address(1) == '10.77.0.2'


def _goodput_mbit(hosts, sender: int, receiver: int, num_bytes: int) -> float:
  sink = _start(hosts, receiver, 'sink')
  subprocess.run(
    hosts.command(sender, [sys.executable, '-c', _PEER, 'send', hosts.address(receiver), str(num_bytes)]),
    check=True,
    timeout=DEADLINE_S,
  )
  received, seconds = _line(sink).split()
  assert int(received) == num_bytes
  return num_bytes * 8 / float(seconds) / 1e6


def test_a_shaped_link_carries_its_profile_both_ways_and_no_more(hosts):
  """100mbit on host 0's link: what it sends and what it receives come at about 95 Mbit/s of payload (the rest is
  headers), never above the rate; unshaped, the same transfer is several times faster."""
  hosts.set_link(0, '100mbit')
  sent = _goodput_mbit(hosts, sender=0, receiver=1, num_bytes=3_000_000)
  received = _goodput_mbit(hosts, sender=1, receiver=0, num_bytes=3_000_000)
  for goodput in (sent, received):
    assert 50 < goodput < 102, (sent, received)  # 102: the 64 KB burst comes at once.
  hosts.set_link(0, None)
  assert _goodput_mbit(hosts, sender=0, receiver=1, num_bytes=3_000_000) > 300


def test_a_partition_drops_everything_then_the_link_comes_back(hosts):
  """While host 1's link is down nothing reaches it (no error either: a connect times out); an open connection
  rides through, its data delivered once the link is back; the timer restores the link after the given time."""
  _start(hosts, 1, 'echo')
  held = _start(hosts, 0, 'hold', hosts.address(1))
  cut_s = 3.0
  started = time.monotonic()
  hosts.partition(1, seconds=cut_s)
  _wait_until(lambda: not hosts.link_is_up(1), 'the cut')
  held.stdin.write('sent during the cut\n')
  held.stdin.flush()
  assert _ask(hosts, 0, hosts.address(1), 'probe', '0.5') == 'timeout'
  assert hosts.link_is_up(1) is False, 'the link came back before the probe ended: the test proves nothing'
  restored = _wait_until(lambda: hosts.link_is_up(1), 'the restore')
  assert restored - started >= cut_s - 0.05
  assert _line(held) == 'sent during the cut'
  assert _ask(hosts, 0, hosts.address(1), 'after the cut') == f'{hosts.address(0)} after the cut'


def test_link_down_and_up_by_hand(hosts):
  _start(hosts, 1, 'echo')
  hosts.link_down(1)
  assert _ask(hosts, 0, hosts.address(1), 'probe', '0.3') == 'timeout'
  hosts.link_up(1)
  assert _ask(hosts, 0, hosts.address(1), 'probe') == f'{hosts.address(0)} probe'


def test_interface_counters_of_a_host_count_what_it_sent(hosts):
  """`parallel.network.interface_bytes` read inside host 0 (what summary.json reports) and the host's eth0 seen from
  outside (`counters`) both count a 1 MB transfer, with headers."""
  num_bytes = 1_000_000
  sink = _start(hosts, 1, 'sink')
  before = hosts.counters(0)
  reader = (
    'import subprocess, sys\n'
    'from shadowsync_jax.parallel import network\n'
    'before = network.interface_bytes()\n'
    f'subprocess.run([sys.executable, "-c", sys.argv[1], "send", "{hosts.address(1)}", "{num_bytes}"], check=True)\n'
    'after = network.interface_bytes()\n'
    'print(after[0] - before[0], after[1] - before[1])\n'
  )
  result = subprocess.run(
    hosts.command(0, [sys.executable, '-c', reader, _PEER]),
    cwd=REPO,
    capture_output=True,
    text=True,
    check=True,
    timeout=DEADLINE_S,
  )
  assert int(_line(sink).split()[0]) == num_bytes
  sent, received = map(int, result.stdout.split())
  assert num_bytes < sent < 1.1 * num_bytes and 0 < received < 0.1 * num_bytes, (sent, received)
  outside = hosts.counters(0)
  assert num_bytes < outside['sent_bytes'] - before['sent_bytes'] < 1.1 * num_bytes, (before, outside)


# A holder of 2 hosts with a `sleep` in each; it ends as its argument says (a signal comes from the test).
_HOLDER = r"""
import subprocess, sys, time
from shadowsync_jax.parallel import netns
with netns.EmulatedHosts(2, profile='100mbit') as hosts:
  sleeps = [subprocess.Popen(hosts.command(i, ['sleep', '1000'])) for i in range(2)]
  print(hosts.prefix, *[p.pid for p in sleeps], flush=True)
  if sys.argv[1] == 'exception':
    raise RuntimeError('the holder failed')
  if sys.argv[1] == 'wait':
    time.sleep(1000)
"""


def _default_signals() -> None:
  """The holder's signals at their defaults, whoever started the tests: a shell starts a background job with SIGINT
  ignored, and a Python started so installs no KeyboardInterrupt handler."""
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_DFL)


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as stat:
      return stat.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


@needs_hosts
@pytest.mark.parametrize(
  'end, signum, exit_code',
  [
    ('normal', None, 0),
    ('exception', None, 1),
    ('wait', signal.SIGINT, -signal.SIGINT),
    ('wait', signal.SIGTERM, 128 + signal.SIGTERM),
    ('wait', signal.SIGHUP, 128 + signal.SIGHUP),
  ],
  ids=['normal exit', 'exception', 'SIGINT', 'SIGTERM', 'SIGHUP'],
)
def test_nothing_is_left_however_the_holder_ends(end, signum, exit_code):
  holder = subprocess.Popen(
    [sys.executable, '-c', _HOLDER, end],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    preexec_fn=_default_signals,
  )
  prefix, *pids = holder.stdout.readline().split()
  assert len(pids) == 2, holder.communicate()
  if signum is not None:
    holder.send_signal(signum)
  assert holder.wait(timeout=DEADLINE_S) == exit_code, holder.stderr.read()
  assert not _left_of(prefix)
  assert not [pid for pid in pids if _alive(int(pid))]
  assert not os.path.exists(os.path.join(netns.LOCK_DIR, f'{prefix}.lock'))


@needs_hosts
def test_the_hosts_of_a_killed_holder_are_removed_by_the_next_one():
  holder = subprocess.Popen([sys.executable, '-c', _HOLDER, 'wait'], cwd=REPO, stdout=subprocess.PIPE, text=True)
  prefix, *pids = holder.stdout.readline().split()
  try:
    assert prefix in netns.live_holders()
    assert prefix not in netns.cleanup_stale(), 'removed the hosts of a live holder'
    assert len(_left_of(prefix)) == 3
  finally:
    holder.kill()
    holder.wait(timeout=DEADLINE_S)
  assert len(_left_of(prefix)) == 3 and all(_alive(int(pid)) for pid in pids)  # SIGKILL: no teardown ran.
  with netns.EmulatedHosts(1) as other:  # A new set runs cleanup_stale first.
    assert not _left_of(prefix) and len(_left_of(other.prefix)) == 2
  assert not [pid for pid in pids if _alive(int(pid))]


@needs_hosts
def test_the_hosts_tool_runs_a_command_in_every_host():
  result = subprocess.run(
    [sys.executable, '-m', 'experiments.hosts', 'run', '--num_hosts=3', '--profile=1gbit', '--']
    + ['sh', '-c', 'echo host {host} at {address}, host 0 at {address0}; exit {host}'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=DEADLINE_S * 3,
  )
  lines = sorted(line for line in result.stdout.splitlines() if line.startswith('[h') and ']' in line[:5])
  assert lines == [f'[h{i}] host {i} at 10.77.0.{i + 1}, host 0 at 10.77.0.1' for i in range(3)], result
  assert result.returncode == 1, result  # The first failure's code: host 1's.
  prefix = result.stdout.split()[3].rsplit('-', 1)[0]  # '[hosts] 3 hosts PREFIX-h0 .. -h2'
  assert prefix.startswith('ss') and not _left_of(prefix)


def test_without_root_or_iproute2_one_line_says_why(monkeypatch):
  monkeypatch.setattr(os, 'geteuid', lambda: 1000)
  assert 'need root' in netns.unavailable_reason()
  with pytest.raises(netns.HostsUnavailable, match='need root'):
    netns.EmulatedHosts(2).open()
  monkeypatch.setattr(os, 'geteuid', lambda: 0)
  monkeypatch.setattr(netns.shutil, 'which', lambda tool: None if tool == 'tc' else f'/usr/sbin/{tool}')
  assert netns.unavailable_reason() == 'emulated hosts need iproute2 (tc not found): apt-get install iproute2'


def test_profiles_and_partitions_from_their_command_line_form():
  assert netns.link_profiles('1gbit', 3) == ['1gbit'] * 3
  assert netns.link_profiles('1gbit,none,10mbit', 3) == ['1gbit', None, '10mbit']
  assert netns.link_profiles('none', 2) == [None, None]
  with pytest.raises(ValueError, match="unknown link profile '2gbit'"):
    netns.link_profiles('2gbit', 2)
  with pytest.raises(ValueError, match='2 link profiles'):
    netns.link_profiles('1gbit,1gbit', 3)
  assert netns.Partition.parse('1:10:3.5') == netns.Partition(host=1, after_s=10.0, seconds=3.5)
  for bad in ('1:10', 'a:1:1', '1:1:0'):
    with pytest.raises(ValueError, match='partition'):
      netns.Partition.parse(bad)
  with pytest.raises(ValueError, match='host 2 is not one of the 2 hosts'):
    netns.EmulatedHosts(2).partition(2, seconds=1.0)
