r"""Emulated hosts: Linux network namespaces joined by veth links and a bridge, one process of a job in each.

  with netns.EmulatedHosts(2, profile='1gbit') as hosts:       # root and iproute2 (`unavailable_reason`)
    hosts.address(0)                                          # '10.77.0.1': host 0's address, never 127.0.0.1
    subprocess.Popen(hosts.command(1, [sys.executable, ...]))   # runs in host 1 (`ip netns exec` execs in place)
    hosts.set_link(1, '100mbit')                              # host 1's link, both ways; None: unshaped
    hosts.partition(1, seconds=3.0, after_s=10.0)             # host 1's link down for 3 s, 10 s from now
    hosts.counters(0)                                         # {'sent_bytes': ..., 'received_bytes': ...}
  # Leaving the block (normally, by an exception, SIGINT, SIGTERM or SIGHUP) removes every namespace and link.

  netns.cleanup_stale()                                       # the hosts of a holder that was SIGKILLed

Processes on 127.0.0.1 share one network stack with no bandwidth limit, which hides what synchronization costs in
a cluster (docs/design.md §10). Here every host has its own stack and address, and its link to the others is shaped:

  namespace {prefix}-br    the switch: bridge br0 with ports v0 .. v{N-1}
  namespace {prefix}-h{i}  host i: lo, and eth0 = 10.77.0.{i+1}/24, the peer of v{i}

Nothing is created in the root namespace, so two sets of hosts never clash (they may even use the same subnet), and
deleting the switch namespace removes every veth pair at once. A link's profile (`PROFILES`) is a tbf qdisc on both
of its ends: on the host's eth0 it shapes what the host sends, on the switch's v{i} what it receives. netem (delay,
loss) is not available on these machines; links are shaped by bandwidth and cut. A partition takes v{i} down on
the switch side, a cable pulled at the switch: packets are dropped silently, the host keeps its address and route,
nothing fails fast, and TCP retransmits until the link is back.

Teardown deletes the hosts and the switch, then SIGKILLs every process still in a host or holding one open: a
namespace deleted while a process runs in it lives on, unnamed, until that process exits, and `ip netns exec` opens
a host a moment before it enters it. The holder's prefix, `ss{pid}x{hex}`, is
locked (flock on LOCK_DIR/{prefix}.lock, released by the kernel when the holder dies), so `cleanup_stale`, which
every new set runs first, removes exactly the sets whose holder is gone.
"""

import atexit
from collections.abc import Sequence
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from typing import NamedTuple


class LinkProfile(NamedTuple):
  """A tbf qdisc's settings: `rate`, `burst` (at least 64 KB: veth sends GSO packets of up to 64 KB) and
  `latency` (the queue limit; a short one drops and makes TCP retransmit at low rates)."""

  rate: str
  burst: str
  latency: str


# Measured with iperf3 on these machines (one way and both ways): goodput within 1-4% of 95.6% of the rate (the
# rest is the headers of each frame). On a 2-core machine 10gbit is CPU-bound at about 8 Gbit/s, the same as no
# shaping at all.
PROFILES = {
  '10gbit': LinkProfile('10gbit', '2500k', '20ms'),
  '1gbit': LinkProfile('1gbit', '256k', '50ms'),
  '100mbit': LinkProfile('100mbit', '64k', '100ms'),
  '10mbit': LinkProfile('10mbit', '64k', '400ms'),
}
LOCK_DIR = '/run/shadowsync-netns'
NETNS_DIR = '/run/netns'  # Where `ip netns` names namespaces.
SUBNET = '10.77.0'  # Host i is SUBNET.{i+1}/24, seen only inside its set's namespaces.
MAX_HOSTS = 250
_NAME = re.compile(r'^(ss(\d+)x[0-9a-f]+)-(br|h\d+)$')
_PROBE = re.compile(r'^ssprobe(\d+)$')
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_KILL_ROUNDS = 250  # Scans for processes left in deleted hosts, 20 ms apart.


class Partition(NamedTuple):
  """`host`'s link goes down `after_s` seconds from the start, for `seconds`."""

  host: int
  after_s: float
  seconds: float

  @classmethod
  def parse(cls, text: str) -> 'Partition':
    """'HOST:AFTER_S:SECONDS', e.g. '1:10:3'."""
    try:
      host, after_s, seconds = text.split(':')
      partition = cls(int(host), float(after_s), float(seconds))
    except ValueError:
      raise ValueError(f'partition {text!r} is not HOST:AFTER_S:SECONDS (e.g. 1:10:3).') from None
    if partition.host < 0 or partition.after_s < 0 or partition.seconds <= 0:
      raise ValueError(f'partition {text!r}: HOST and AFTER_S must be >= 0 and SECONDS > 0.')
    return partition


def link_profiles(spec: str, num_hosts: int) -> list[str | None]:
  """The profile of each host's link from 'NAME' (every link) or 'NAME,NAME,...' (one per host); '' or 'none':
  unshaped. ValueError names a bad profile or count."""
  names = [None if name in ('', 'none') else name for name in spec.split(',')]
  if len(names) not in (1, num_hosts):
    raise ValueError(f'{len(names)} link profiles ({spec!r}) for {num_hosts} hosts: give one, or one per host.')
  for name in names:
    _check_profile(name)
  return names * num_hosts if len(names) == 1 else names


class HostsUnavailable(RuntimeError):
  """This machine cannot build emulated hosts (not root, no iproute2, no network namespaces); one line says why."""


def unavailable_reason(probe: bool = True) -> str | None:
  """Why emulated hosts cannot be built here, in one line, or None when they can. `probe`: also create and delete
  a namespace (root in a container may lack the capability)."""
  if os.geteuid() != 0:
    return f'emulated hosts need root (network namespaces, veth links, qdiscs); this process runs as uid {os.geteuid()}'
  missing = [tool for tool in ('ip', 'tc') if shutil.which(tool) is None]
  if missing:
    return f'emulated hosts need iproute2 ({" and ".join(missing)} not found): apt-get install iproute2'
  if probe:
    name = f'ssprobe{os.getpid()}'
    added = _ip('netns', 'add', name, check=False)
    _ip('netns', 'del', name, check=False)
    if added.returncode:
      return f'`ip netns add` fails here: {added.stderr.strip() or added.returncode}'
  return None


def list_namespaces() -> list[str]:
  """Every named network namespace (`ip netns list`)."""
  return [line.split()[0] for line in _ip('netns', 'list').stdout.splitlines() if line.strip()]


def cleanup_stale() -> list[str]:
  """Removes the hosts whose holder is gone (its lock is free), killing what still runs in them; returns their
  prefixes. Never touches a live set."""
  by_prefix: dict[str, list[str]] = {}
  for name in list_namespaces():
    match = _NAME.match(name)
    if match:
      by_prefix.setdefault(match.group(1), []).append(name)
    elif (probe := _PROBE.match(name)) and not os.path.exists(f'/proc/{probe.group(1)}'):
      _ip('netns', 'del', name, check=False)
  removed = []
  os.makedirs(LOCK_DIR, exist_ok=True)
  for prefix, names in sorted(by_prefix.items()):
    path = os.path.join(LOCK_DIR, f'{prefix}.lock')
    with open(path, 'a+') as lock:  # No lock file: its holder is gone too.
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        continue  # A live holder.
      _kill_and_delete(names)
      os.unlink(path)
    removed.append(prefix)
  return removed


def live_holders() -> dict[str, int]:
  """{prefix: holder pid} of the sets whose holder is alive (it holds the lock)."""
  holders = {}
  for name in list_namespaces():
    match = _NAME.match(name)
    if not match or match.group(1) in holders:
      continue
    path = os.path.join(LOCK_DIR, f'{match.group(1)}.lock')
    try:
      with open(path) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holders[match.group(1)] = int(match.group(2))
    except FileNotFoundError:
      pass
  return holders


class EmulatedHosts:
  """N hosts on this machine, each with its own network stack and address (module docstring)."""

  def __init__(self, num_hosts: int, profile: str | None | Sequence[str | None] = None):
    """`profile`: the link of every host (a name in PROFILES, or None: unshaped), or one per host."""
    if not 1 <= num_hosts <= MAX_HOSTS:
      raise ValueError(f'num_hosts={num_hosts} must be in [1, {MAX_HOSTS}].')
    profiles = [profile] * num_hosts if profile is None or isinstance(profile, str) else list(profile)
    if len(profiles) != num_hosts:
      raise ValueError(f'{len(profiles)} link profiles for {num_hosts} hosts: give one, or one per host.')
    for name in profiles:
      _check_profile(name)
    self.num_hosts, self.profiles = num_hosts, profiles
    self.prefix = f'ss{os.getpid()}x{secrets.token_hex(3)}'
    self._lock_file = None
    self._mutex = threading.Lock()  # Partition timers against teardown.
    self._timers: list[threading.Timer] = []
    self._old_handlers: dict[int, object] = {}
    self._closing = self._closed = False
    self._pending_signal = None

  def netns(self, host: int) -> str:
    """The network namespace of `host`."""
    return f'{self.prefix}-h{self._check_host(host)}'

  @property
  def switch(self) -> str:
    """The namespace of the bridge that joins the hosts."""
    return f'{self.prefix}-br'

  def address(self, host: int) -> str:
    return f'{SUBNET}.{self._check_host(host) + 1}'

  def command_prefix(self, host: int) -> list[str]:
    """What to put before a command to run it in `host`: the process it starts is the command itself (same pid)."""
    return ['ip', 'netns', 'exec', self.netns(host)]

  def command(self, host: int, argv: Sequence[str]) -> list[str]:
    return [*self.command_prefix(host), *argv]

  def __enter__(self) -> 'EmulatedHosts':
    return self.open()

  def __exit__(self, *exc_info) -> None:
    self.close()

  def open(self) -> 'EmulatedHosts':
    """Builds the hosts (after removing stale ones); tears down what it built if that fails."""
    reason = unavailable_reason(probe=False)
    if reason:
      raise HostsUnavailable(reason)
    self._install_signal_handlers()
    atexit.register(self.close)
    try:
      cleanup_stale()
      self._lock_file = open(os.path.join(LOCK_DIR, f'{self.prefix}.lock'), 'a+')
      fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
      self._build()
    except BaseException:
      self.close()
      raise
    return self

  def close(self) -> None:
    """Kills what runs in the hosts and removes them; idempotent. A signal that arrives meanwhile takes effect
    after it."""
    self._closing = True
    with self._mutex:
      for timer in self._timers:
        timer.cancel()
      self._timers = []
      _kill_and_delete([name for name in list_namespaces() if name.startswith(f'{self.prefix}-')])
      if self._lock_file is not None:
        os.unlink(self._lock_file.name)
        self._lock_file.close()  # Releases the flock.
        self._lock_file = None
    atexit.unregister(self.close)
    self._restore_signal_handlers()
    self._closed = True
    pending, self._pending_signal = self._pending_signal, None
    if pending is not None:
      signal.raise_signal(pending)  # To the handler that was there before.

  def set_link(self, host: int, profile: str | None) -> None:
    """Shapes `host`'s link, both ways, to a named profile; None removes the shaping."""
    _check_profile(profile)
    for namespace, device in ((self.netns(host), 'eth0'), (self.switch, f'v{host}')):
      if profile is None:
        _run(['tc', '-n', namespace, 'qdisc', 'del', 'dev', device, 'root'], check=False)
      else:
        rate, burst, latency = PROFILES[profile]
        tbf = ['tbf', 'rate', rate, 'burst', burst, 'latency', latency]
        _run(['tc', '-n', namespace, 'qdisc', 'replace', 'dev', device, 'root', *tbf])
    self.profiles[host] = profile

  def link_down(self, host: int) -> None:
    """Cuts `host` off from the others (its switch port goes dark; module docstring)."""
    _ip('-n', self.switch, 'link', 'set', f'v{self._check_host(host)}', 'down')

  def link_up(self, host: int) -> None:
    _ip('-n', self.switch, 'link', 'set', f'v{self._check_host(host)}', 'up')

  def link_is_up(self, host: int) -> bool:
    shown = json.loads(_ip('-j', '-n', self.switch, 'link', 'show', 'dev', f'v{self._check_host(host)}').stdout)
    return 'UP' in shown[0]['flags']

  def partition(self, host: int, seconds: float, after_s: float = 0.0) -> None:
    """Cuts `host`'s link for `seconds`, `after_s` seconds from now; returns at once (timer threads)."""
    self._check_host(host)
    if seconds <= 0 or after_s < 0:
      raise ValueError(f'a partition needs seconds > 0 and after_s >= 0, got {seconds} and {after_s}.')
    for delay_s, action in ((after_s, self.link_down), (after_s + seconds, self.link_up)):
      timer = threading.Timer(delay_s, self._unless_closed, (action, host))
      timer.daemon = True
      self._timers.append(timer)
      timer.start()

  def counters(self, host: int) -> dict[str, int]:
    """Bytes `host`'s eth0 sent and received so far (frames, headers included)."""
    shown = json.loads(_ip('-j', '-s', '-n', self.netns(host), 'link', 'show', 'dev', 'eth0').stdout)
    stats = shown[0]['stats64']
    return {'sent_bytes': stats['tx']['bytes'], 'received_bytes': stats['rx']['bytes']}

  def _build(self) -> None:
    switch = self.switch
    added = _ip('netns', 'add', switch, check=False)
    if added.returncode:
      raise HostsUnavailable(f'cannot create network namespaces: `ip netns add` says {added.stderr.strip()!r}')
    _ip('-n', switch, 'link', 'set', 'lo', 'up')
    _ip('-n', switch, 'link', 'add', 'br0', 'type', 'bridge')
    _ip('-n', switch, 'link', 'set', 'br0', 'up')
    for host in range(self.num_hosts):
      namespace = self.netns(host)
      _ip('netns', 'add', namespace)
      _ip('-n', namespace, 'link', 'set', 'lo', 'up')
      _ip('link', 'add', 'eth0', 'netns', namespace, 'type', 'veth', 'peer', 'name', f'v{host}', 'netns', switch)
      _ip('-n', switch, 'link', 'set', f'v{host}', 'master', 'br0')
      _ip('-n', switch, 'link', 'set', f'v{host}', 'up')
      _ip('-n', namespace, 'addr', 'add', f'{self.address(host)}/24', 'dev', 'eth0')
      _ip('-n', namespace, 'link', 'set', 'eth0', 'up')
      if self.profiles[host] is not None:
        self.set_link(host, self.profiles[host])

  def _unless_closed(self, action, host: int) -> None:
    with self._mutex:
      if not self._closing:
        action(host)

  def _check_host(self, host: int) -> int:
    if not 0 <= host < self.num_hosts:
      raise ValueError(f'host {host} is not one of the {self.num_hosts} hosts (0 .. {self.num_hosts - 1}).')
    return host

  def _install_signal_handlers(self) -> None:
    """SIGTERM and SIGHUP unwind like SIGINT (through `close`); while closing, a signal waits until it is done."""
    if threading.current_thread() is not threading.main_thread():
      return  # Python runs handlers in the main thread only; its owner tears down.
    for signum in _SIGNALS:
      self._old_handlers[signum] = signal.signal(signum, self._on_signal)

  def _restore_signal_handlers(self) -> None:
    for signum, handler in self._old_handlers.items():
      signal.signal(signum, handler)
    self._old_handlers = {}

  def _on_signal(self, signum: int, frame) -> None:
    if self._closing and not self._closed:
      self._pending_signal = signum
      return
    previous = self._old_handlers.get(signum)
    if callable(previous):
      previous(signum, frame)  # SIGINT's default raises KeyboardInterrupt.
    else:
      raise SystemExit(128 + signum)


def _check_profile(profile: str | None) -> None:
  if profile is not None and profile not in PROFILES:
    raise ValueError(f'unknown link profile {profile!r}; known: {", ".join(PROFILES)} (or none: unshaped).')


def _kill_and_delete(names: list[str]) -> None:
  """Deletes the namespaces (the hosts before the switch), then SIGKILLs every process still in one or holding one
  open: a process that was entering a host (`ip netns exec` opens it, then enters) is caught either way, and a
  namespace without processes goes away with its links."""
  inodes = {_inode(name) for name in names} - {None}
  for name in sorted(names, key=lambda n: n.endswith('-br')):
    _ip('netns', 'del', name, check=False)
  links, quiet_scans = {f'net:[{inode}]' for inode in inodes}, 0
  for _ in range(_KILL_ROUNDS):
    pids = _processes_holding(links)
    quiet_scans = 0 if pids else quiet_scans + 1
    if quiet_scans == 2:  # Twice in a row: none was between opening a host and entering it.
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    time.sleep(0.02)
  raise RuntimeError(f'processes in the emulated hosts {names} survive SIGKILL: {sorted(pids)}')


def _inode(name: str) -> int | None:
  try:
    return os.stat(os.path.join(NETNS_DIR, name)).st_ino  # The namespace's own inode (`net:[inode]`).
  except FileNotFoundError:
    return None


def _processes_holding(links: set[str]) -> set[int]:
  """Processes whose network namespace, or one of whose open files, is one of `links` ('net:[inode]')."""
  held = set()
  for entry in os.listdir('/proc'):
    if not entry.isdigit() or int(entry) == os.getpid():
      continue
    try:
      if os.readlink(f'/proc/{entry}/ns/net') in links:
        held.add(int(entry))
        continue
      for fd in os.listdir(f'/proc/{entry}/fd'):
        if os.readlink(f'/proc/{entry}/fd/{fd}') in links:
          held.add(int(entry))
          break
    except (FileNotFoundError, ProcessLookupError, PermissionError):
      continue  # Gone meanwhile, or a zombie.
  return held


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  return _run(['ip', *args], check=check)


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
  result = subprocess.run(argv, capture_output=True, text=True, check=False)
  if check and result.returncode:
    raise RuntimeError(f'`{" ".join(argv)}` failed ({result.returncode}): {result.stderr.strip()}')
  return result
