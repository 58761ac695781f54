"""The job's processes met directly, over one TCP connection between each pair: what every process offers at a call,
in process order (a shadow round's agreement and its sums: `sync.host_meeting`).

  links = peer_links.PeerLinks('shadow', process_id, num_processes, address, publish, lookup)
  vectors = links.meet(vector, stopped)      # every process's vector of this call, or None if stopped
  links.close()

The first call connects: each process listens on `address` (the one it reaches the coordinator from:
`network.local_address_towards`), publishes it through the coordination service (`publish`, `lookup`: the
key-value store), connects to every process below it and accepts every process above it. After that the service
carries nothing of a call. (Before, every vector went through it, set and read back as keys: the coordinator's
process copied each through gRPC, and at the default config's 8 replicas as 2 x 4 a round cost it about 15 ms of a
core, the trainers' cores, that no pace counted: `shadow_ma` ran at about 0.9 of `none` at a pace budgeted to 0.95.)

A call sends this process's vector to every peer from a helper thread (two processes sending at once would each
wait for the other to read, were their messages larger than the sockets' buffers) and reads every peer's, in
process order: a message is the call's number, its length and the bytes. Nothing waits without asking `stopped()`
every `POLL_S`: a peer that is late, gone (its connection closed) or unreachable keeps this process waiting until
`stopped()` (the run is failing: the peer watchdog finds the peer lost), as a collective would not let it.
"""

from collections.abc import Callable
import json
import socket
import struct
import threading
import time

import numpy as np

POLL_S = 0.05  # How often a waiting call asks whether it was stopped.
_HEADER = struct.Struct('<QQ')  # A message: the call's number, its length in bytes; then the bytes.
_HELLO = struct.Struct('<Q')  # A new connection's first message: the connecting process.


class PeerGone(Exception):
  """A peer's connection closed or failed."""


class PeerLinks:
  """Direct connections to every other process of the job (module docstring)."""

  def __init__(
    self,
    name: str,
    process_id: int,
    num_processes: int,
    address: str,
    publish: Callable[[str, str], None],
    lookup: Callable[[str, Callable[[], bool]], str | None],
  ):
    """`publish(key, value)` sets a key of the coordination service; `lookup(key, stopped)` waits for one (None if
    `stopped()` became true first). `name` keeps the keys of two sets of links apart."""
    self._name, self._me, self._num_processes, self._address = name, process_id, num_processes, address
    self._publish, self._lookup = publish, lookup
    self._peers: dict[int, socket.socket] | None = None
    self._calls = 0

  def meet(self, vector: np.ndarray, stopped: Callable[[], bool] = lambda: False) -> list[np.ndarray] | None:
    """Every process's `vector` (1-D, of one dtype and length on every process at a call) of this call, in process
    order; None if `stopped()` became true while a peer was awaited."""
    vector = np.ascontiguousarray(vector)
    if self._num_processes == 1:
      return [vector]
    if self._peers is None:
      self._peers = self._connect(stopped)
      if self._peers is None:
        return None
    data = memoryview(vector).cast('B')
    header = _HEADER.pack(self._calls, len(data))
    sent: list[BaseException] = []
    sender = threading.Thread(
      target=self._send_to_all, args=(header, data, sent, stopped), name='peer-links', daemon=True
    )
    sender.start()
    vectors = []
    for process in range(self._num_processes):
      if process == self._me:
        vectors.append(vector)
        continue
      got = self._receive(process, len(data), stopped)
      if got is None:
        return None
      vectors.append(np.frombuffer(got, vector.dtype))
    while sender.is_alive():
      if stopped():
        return None
      sender.join(POLL_S)
    if sent:  # A peer that sent its vector and then closed: gone all the same.
      return self._wait_until(stopped)
    self._calls += 1
    return vectors

  def close(self) -> None:
    for peer in (self._peers or {}).values():
      peer.close()
    self._peers = None

  def _key(self, process: int) -> str:
    return f'peer_links/{self._name}/{process}'

  def _connect(self, stopped: Callable[[], bool]) -> dict[int, socket.socket] | None:
    """Listens, publishes where, connects to the processes below this one and accepts those above."""
    listener = socket.create_server((self._address, 0), family=_family(self._address))
    listener.settimeout(POLL_S)
    peers = {}
    try:
      self._publish(self._key(self._me), json.dumps([self._address, listener.getsockname()[1]]))
      for process in range(self._me):
        where = self._lookup(self._key(process), stopped)
        if where is None:
          return None
        host, port = json.loads(where)
        try:
          peer = socket.create_connection((host, port))
          peer.sendall(_HELLO.pack(self._me))
        except OSError:  # Gone, or unreachable, since it published where it listens.
          return self._wait_until(stopped)
        peers[process] = peer
      while len(peers) < self._num_processes - 1:
        try:
          peer, _ = listener.accept()
        except TimeoutError:
          if stopped():
            return None
          continue
        peer.settimeout(None)
        (process,) = _HELLO.unpack(_read_exactly(peer, _HELLO.size))
        peers[process] = peer
    finally:
      listener.close()
    for peer in peers.values():
      peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      peer.settimeout(POLL_S)
    return peers

  def _send_to_all(self, header: bytes, data: memoryview, sent: list[BaseException], stopped) -> None:
    for peer in self._peers.values():
      try:
        _send_all(peer, header, stopped)
        _send_all(peer, data, stopped)
      except OSError as error:
        sent.append(error)
        return

  def _receive(self, process: int, size: int, stopped: Callable[[], bool]) -> bytearray | None:
    """Process `process`'s message of this call, or None if `stopped()` became true first (or the peer went)."""
    try:
      header = _read_exactly(self._peers[process], _HEADER.size, stopped)
      if header is None:
        return None
      call, length = _HEADER.unpack(header)
      if (call, length) != (self._calls, size):
        raise RuntimeError(
          f'process {process} sent call {call} of {length} bytes where call {self._calls} of {size} was due: the '
          'processes do not call in step.'
        )
      return _read_exactly(self._peers[process], size, stopped)
    except (PeerGone, OSError):
      return self._wait_until(stopped)

  @staticmethod
  def _wait_until(stopped: Callable[[], bool]) -> None:
    """A peer is gone: nothing more comes of this call; this process waits to be stopped (the peer watchdog finds
    the peer lost and the run fails), as it would for a peer that does not answer."""
    while not stopped():
      time.sleep(POLL_S)


def _family(address: str) -> socket.AddressFamily:
  return socket.AF_INET6 if ':' in address else socket.AF_INET


def _send_all(peer: socket.socket, data, stopped: Callable[[], bool]) -> None:
  """`socket.sendall` on a socket with a timeout: a full buffer (the peer reads later) is waited out, not an error,
  until `stopped()`."""
  view = memoryview(data).cast('B')
  while view and not stopped():
    try:
      view = view[peer.send(view) :]
    except TimeoutError:
      continue


def _read_exactly(peer: socket.socket, size: int, stopped: Callable[[], bool] = lambda: False) -> bytearray | None:
  """`size` bytes from `peer`, or None if `stopped()` became true first; PeerGone if the connection closed."""
  buffer = bytearray(size)
  view, got = memoryview(buffer), 0
  while got < size:
    try:
      count = peer.recv_into(view[got:])
    except TimeoutError:
      if stopped():
        return None
      continue
    if count == 0:
      raise PeerGone('the connection closed')
    got += count
  return buffer
