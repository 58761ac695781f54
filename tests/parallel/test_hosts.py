"""Jobs of 2 processes across emulated hosts (`experiments.launch --hosts=netns`): each process in a network
namespace of its own behind a shaped link, the coordinator at host 0's address.

A deterministic algorithm (sync SGD) must end with the model of the same run in one process, through a short
partition; a partition longer than the peer timeout must end in the clean failure path, within a bounded time,
with nothing left behind. Needs root and iproute2, as CI has; skipped otherwise, with the reason.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import train
from shadowsync_jax.parallel import exit_codes
from shadowsync_jax.parallel import netns

REPO = pathlib.Path(__file__).resolve().parents[2]
UNAVAILABLE = netns.unavailable_reason()
pytestmark = [
  pytest.mark.skipif(UNAVAILABLE is not None, reason=f'no emulated hosts here: {UNAVAILABLE}'),
  pytest.mark.xdist_group('jobs'),  # Jobs of real processes run one at a time (pytest.ini).
]
JOB_TIMEOUT_S = 300  # Only reached when something hangs.
SYNC_SGD = (
  '--config=experiments/configs/default.py:tiny',
  '--config.sync.algorithm=sync_sgd',
  '--config.num_replicas=2',
)


def _launch(workdir: pathlib.Path, *launcher_flags: str) -> tuple[int, str, float]:
  command = [
    sys.executable,
    '-m',
    'experiments.launch',
    '--num_processes=2',
    '--cpu_devices=1',
    '--hosts=netns',
    '--link_profile=100mbit',
    '--grace_s=10',
    *launcher_flags,
    '--',
    f'--workdir={workdir}',
    *SYNC_SGD,
    '--config.train.progress_every_s=100',
  ]
  started = time.monotonic()
  result = subprocess.run(
    command,
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': str(REPO)},
    capture_output=True,
    text=True,
    timeout=JOB_TIMEOUT_S,
    check=False,
  )
  return result.returncode, result.stdout + result.stderr, time.monotonic() - started


def _our_namespaces() -> set[str]:
  return {name for name in netns.list_namespaces() if name.startswith('ss')}


def test_a_job_across_two_hosts_rides_through_a_short_partition_and_equals_one_process(tmp_path):
  before = _our_namespaces()
  # 256 steps of about 30 ms on a 100 Mbit/s link: host 1 is cut off 1 s into training, for 2 s.
  code, output, _ = _launch(tmp_path / 'hosts', '--peer_timeout_s=20', '--partition=1:1:2')
  assert code == 0, output[-4000:]
  assert '[launch] host 1 cut off in 1 s for 2 s.' in output
  summary = json.loads((tmp_path / 'hosts' / 'summary.json').read_text())
  assert summary['num_processes'] == 2 and summary['train_steps'] == 256
  # Each host's own interface: both put the all-reduces on the wire, a few hundred KB a step.
  assert all(sent > 256 * 50_000 for sent in summary['net_bytes_sent']), summary['net_bytes_sent']
  assert all(received > 256 * 50_000 for received in summary['net_bytes_received']), summary['net_bytes_received']

  config = default.get_config('tiny')
  config.num_replicas, config.sync.algorithm = 2, 'sync_sgd'
  one_process = train.train_and_evaluate(config, tmp_path / 'one_process')
  np.testing.assert_allclose(summary['eval_ne'], one_process['eval_ne'], rtol=1e-5)
  np.testing.assert_allclose(summary['eval_auc'], one_process['eval_auc'], rtol=1e-5)
  assert _our_namespaces() <= before


def test_a_partition_longer_than_the_peer_timeout_ends_in_the_clean_failure_path(tmp_path):
  before = _our_namespaces()
  code, output, seconds = _launch(tmp_path, '--peer_timeout_s=5', '--partition=1:1:600')
  assert code == exit_codes.PEER_LOST, output[-4000:]
  assert 'cut off' in output and '[launch] FAILED: the job failed 1 time' in output, output[-4000:]
  assert seconds < 120, f'{seconds:.0f} s: the failure path took too long'  # Start ~15 s, cut at +1 s, timeout 5 s.
  assert _our_namespaces() <= before
