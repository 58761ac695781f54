"""Direct links between a job's processes (`parallel.peer_links`), the processes played by threads of one test."""

import json
import socket
import threading
import time

import numpy as np
import pytest

from shadowsync_jax.parallel import peer_links


class _Store:
  """The coordination service's key-value store, as far as the links use it."""

  def __init__(self):
    self._values, self._changed = {}, threading.Condition()

  def publish(self, key: str, value: str) -> None:
    with self._changed:
      assert key not in self._values, key
      self._values[key] = value
      self._changed.notify_all()

  def lookup(self, key: str, stopped) -> str | None:
    with self._changed:
      while key not in self._values:
        if stopped():
          return None
        self._changed.wait(0.05)
      return self._values[key]


def _links(num_processes: int, store: _Store | None = None) -> list[peer_links.PeerLinks]:
  store = store or _Store()
  return [
    peer_links.PeerLinks('test', p, num_processes, '127.0.0.1', store.publish, store.lookup)
    for p in range(num_processes)
  ]


def _in_threads(calls) -> list:
  """Runs each of `calls` in a thread of its own (one a process), returns what each returned."""
  results = [None] * len(calls)

  def run(i):
    results[i] = calls[i]()

  threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=60)
    assert not thread.is_alive()
  return results


def test_every_process_gets_every_vector_in_process_order_at_every_call():
  # 3 processes; vectors of 4 MB (larger than a socket's buffers: both ends send at once), then a small one of
  # another dtype (the round's agreement), several calls in a row.
  links = _links(3)
  sizes_and_types = [(1 << 20, np.float32), (2, np.float64), (1 << 20, np.float32), (7, np.float32)]

  def process(p):
    got = []
    for call, (size, dtype) in enumerate(sizes_and_types):
      got.append(links[p].meet(np.full(size, 10 * call + p, dtype)))
    links[p].close()
    return got

  results = _in_threads([lambda p=p: process(p) for p in range(3)])
  for got in results:
    for call, ((size, dtype), vectors) in enumerate(zip(sizes_and_types, got)):
      assert [v.dtype for v in vectors] == [dtype] * 3
      assert [v.shape for v in vectors] == [(size,)] * 3
      assert [float(v[0]) for v in vectors] == [10 * call + p for p in range(3)]
      assert all(np.all(v == v[0]) for v in vectors)


def test_one_process_meets_itself_with_no_connection():
  (alone,) = _links(1)
  vector = np.arange(5, dtype=np.float32)
  assert [v.tolist() for v in alone.meet(vector)] == [vector.tolist()]


def test_a_wait_for_a_peer_that_never_comes_ends_when_stopped():
  links = _links(2)
  stop = threading.Event()
  threading.Timer(0.3, stop.set).start()
  started = time.monotonic()
  assert links[0].meet(np.ones(3, np.float32), stop.is_set) is None
  assert time.monotonic() - started < 5


def test_a_peer_gone_mid_call_leaves_the_other_waiting_until_stopped():
  links = _links(2)
  _in_threads([lambda: links[0].meet(np.ones(3, np.float32)), lambda: links[1].meet(np.ones(3, np.float32))])
  links[1].close()  # Gone: its connection closed.
  stop = threading.Event()
  threading.Timer(0.3, stop.set).start()
  assert links[0].meet(np.ones(3, np.float32), stop.is_set) is None
  assert stop.is_set()


def test_processes_out_of_step_are_an_error_not_a_wrong_mean():
  links = _links(2)
  stop = threading.Event()

  def process(p):
    try:
      return links[p].meet(np.ones(3 + p, np.float32), stop.is_set)  # Lengths that differ: calls out of step.
    except RuntimeError as error:
      stop.set()
      return str(error)

  results = _in_threads([lambda p=p: process(p) for p in range(2)])
  assert any(isinstance(r, str) and 'do not call in step' in r for r in results), results


@pytest.mark.parametrize('num_processes', [2, 4])
def test_the_links_connect_whichever_process_comes_first(num_processes):
  links = _links(num_processes)

  def process(p):
    time.sleep(0.1 * (num_processes - p))  # The last process first: it waits for the others' addresses.
    return links[p].meet(np.array([p], np.float32))

  results = _in_threads([lambda p=p: process(p) for p in range(num_processes)])
  assert all([float(v[0]) for v in got] == list(range(num_processes)) for got in results)


def test_a_peer_that_published_and_went_leaves_the_other_waiting_until_stopped():
  store = _Store()
  gone = socket.create_server(('127.0.0.1', 0))
  store.publish('peer_links/test/0', json.dumps(['127.0.0.1', gone.getsockname()[1]]))
  gone.close()  # Process 0 listened, published, and died: its port refuses.
  links = _links(2, store)
  stop = threading.Event()
  threading.Timer(0.3, stop.set).start()
  assert links[1].meet(np.ones(3, np.float32), stop.is_set) is None
  assert stop.is_set()
