"""A process's view of the job's network: the address it reaches the coordinator from, and the bytes it put on the wire.

  traffic = network.TrafficCounter()       # at the start of a run (after jax.distributed.initialize)
  ...
  sent, received = traffic.bytes()         # since then, or (None, None): the job's traffic does not leave loopback
  network.per_process(sent)                # [process 0's, process 1's, ...] on every process (a collective)

  network.interface_bytes()                # (sent, received) over this namespace's non-loopback interfaces, or None
  network.local_address_towards('10.77.0.1:1234')   # '10.77.0.2': the local address the kernel routes from

The bytes are the interface counters of the process's network namespace (`/proc/self/net/dev`, loopback left out):
frames with their headers, of every collective (gloo) and of the coordination service. On an emulated host
(`parallel.netns`) the namespace holds this process alone, so they are exactly its own. On a real host they count
everything the host sent. A job whose coordinator is reached over 127.0.0.1 (processes on one machine) talks over
loopback, shared by every process there: no figure then, nor in a one-process run.
"""

import ipaddress
import socket

import jax
from jax.experimental import multihost_utils
import numpy as np

from shadowsync_jax.parallel import private_apis
from shadowsync_jax.parallel import replicas

NET_DEV = '/proc/self/net/dev'  # This process's network namespace, also under `ip netns exec` or setns.
_LOW_BITS = 31  # JAX gathers 32-bit integers: a count goes as two halves.


def interface_bytes(net_dev: str = NET_DEV) -> tuple[int, int] | None:
  """(bytes sent, bytes received) summed over the non-loopback interfaces of `net_dev`; None when there is none."""
  with open(net_dev) as file:
    lines = file.read().splitlines()[2:]  # Two header lines.
  sent = received = 0
  found = False
  for line in lines:
    name, _, fields = line.partition(':')
    if name.strip() == 'lo' or not fields.strip():
      continue
    columns = fields.split()  # Received: bytes packets errs drop fifo frame compressed multicast; sent: bytes ...
    received += int(columns[0])
    sent += int(columns[8])
    found = True
  return (sent, received) if found else None


def local_address_towards(address: str) -> str:
  """The local address the kernel routes from to `address` ('host:port'; IPv6 as '[::1]:port'); sends nothing."""
  host, port = address.rsplit(':', 1)
  host = host.strip('[]')
  family = socket.AF_INET6 if ':' in host else socket.AF_INET
  with socket.socket(family, socket.SOCK_DGRAM) as sock:
    sock.connect((host, int(port)))  # UDP: only picks the route.
    return sock.getsockname()[0]


def coordinator_address() -> str | None:
  """The job's coordinator ('host:port'), or None in a one-process run."""
  if jax.process_count() == 1:
    return None
  return private_apis.coordinator_address()


class TrafficCounter:
  """Bytes this process's network namespace sent and received since the counter was made (module docstring)."""

  def __init__(self, coordinator: str | None = '', net_dev: str = NET_DEV):
    """`coordinator`: the job's coordinator address; '' = `coordinator_address()`; None: the job has no network."""
    coordinator = coordinator_address() if coordinator == '' else coordinator
    self._net_dev = net_dev
    self._start = None
    if coordinator is not None and not ipaddress.ip_address(local_address_towards(coordinator)).is_loopback:
      self._start = interface_bytes(net_dev)

  def bytes(self) -> tuple[int | None, int | None]:
    """(sent, received) since the counter was made, or (None, None) when there is no figure."""
    now = interface_bytes(self._net_dev) if self._start is not None else None
    if now is None:
      return None, None
    return now[0] - self._start[0], now[1] - self._start[1]


def per_process(count: int | None) -> list[int | None]:
  """[process 0's count, process 1's, ...] on every process; a collective (from the thread that may issue them)."""
  replicas.check_collective_thread('gathering byte counts')
  if jax.process_count() == 1:
    return [count]
  return [from_halves(halves) for halves in np.asarray(multihost_utils.process_allgather(to_halves(count)))]


def to_halves(count: int | None) -> np.ndarray:
  """`count` as two int32 (JAX gathers no 64-bit integers); None as [-1, -1]."""
  if count is None:
    return np.array([-1, -1], np.int32)
  return np.array([count >> _LOW_BITS, count & (2**_LOW_BITS - 1)], np.int32)


def from_halves(halves: np.ndarray) -> int | None:
  high, low = (int(x) for x in halves)
  return None if high < 0 else (high << _LOW_BITS) + low
