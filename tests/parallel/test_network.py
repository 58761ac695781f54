"""A process's bytes on the wire (parallel.network): the interface counters it reads, and when it reports none.

A host's real counters against a real transfer are checked in test_netns.py (inside an emulated host).
"""

import numpy as np
import pytest

from shadowsync_jax.parallel import network

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compr
    lo: {lo} 10 0 0 0 0 0 0 {lo} 10 0 0 0 0 0 0
  eth0: {rx} 20 0 0 0 0 0 0 {tx} 30 0 0 0 0 0 0
  ifb0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0     0
"""


def _net_dev(tmp_path, rx: int, tx: int, lo: int = 999, name: str = 'net_dev'):
  path = tmp_path / name
  path.write_text(NET_DEV.format(rx=rx, tx=tx, lo=lo))
  return str(path)


def test_interface_bytes_sums_every_interface_but_loopback(tmp_path):
  assert network.interface_bytes(_net_dev(tmp_path, rx=1234, tx=5678)) == (5678, 1234)
  only_loopback = tmp_path / 'lo_only'
  only_loopback.write_text(''.join(NET_DEV.splitlines(keepends=True)[:3]).format(lo=5))
  assert network.interface_bytes(str(only_loopback)) is None


def test_this_process_counters_can_be_read():
  counts = network.interface_bytes()
  assert counts is None or all(isinstance(c, int) and c >= 0 for c in counts)


def test_no_figure_in_one_process_or_over_loopback(tmp_path):
  path = _net_dev(tmp_path, rx=10, tx=20)
  assert network.TrafficCounter(None, path).bytes() == (None, None)
  assert network.local_address_towards('127.0.0.1:1234') == '127.0.0.1'
  assert network.TrafficCounter('127.0.0.1:1234', path).bytes() == (None, None)
  assert network.TrafficCounter(net_dev=path).bytes() == (None, None)  # This test runs in one process.


def test_a_job_over_a_network_counts_from_its_start(tmp_path, monkeypatch):
  monkeypatch.setattr(network, 'local_address_towards', lambda address: '10.77.0.2')
  path = _net_dev(tmp_path, rx=1_000, tx=2_000)
  traffic = network.TrafficCounter('10.77.0.1:4000', path)
  _net_dev(tmp_path, rx=1_500, tx=3_000_000_000)  # Rewrites the same file: past 2^31, as a long run gets.
  assert traffic.bytes() == (2_999_998_000, 500)


@pytest.mark.parametrize('count', [None, 0, 1, 2**31 - 1, 2**31, 5 * 10**12])
def test_counts_cross_a_32_bit_gather_whole(count):
  halves = network.to_halves(count)
  assert halves.dtype == np.int32
  assert network.from_halves(halves) == count


def test_per_process_in_one_process():
  assert network.per_process(42) == [42] and network.per_process(None) == [None]
