"""How long the peer watchdog leaves a training loop to reach its boundary once a peer is lost (no process started:
the watchdog's bookkeeping alone)."""

import os
import pathlib
import subprocess
import sys

from shadowsync_jax.parallel import peer_watchdog


def _watchdog() -> peer_watchdog.PeerWatchdog:
  return peer_watchdog.PeerWatchdog(None, 0, 2, timeout_s=10.0, coordinator_address='127.0.0.1:1')


def test_before_its_first_block_a_loop_gets_the_short_grace_then_its_steps_set_it():
  low, high = peer_watchdog._STEP_BOUNDARY_GRACE_S  # pylint: disable=protected-access
  watchdog = _watchdog()
  assert watchdog.grace_s() == low  # Setup: nothing trained in this start, nothing newer than the disk to save.
  watchdog.reported(40, 'train')
  assert watchdog.grace_s() == high  # Training, no step time yet: the long grace.
  watchdog._reported_at -= 0.2  # pylint: disable=protected-access  (two steps took 0.2 s: 0.1 s a step)
  watchdog.reported(42, 'train')
  steps = peer_watchdog._STEP_BOUNDARY_GRACE_STEPS  # pylint: disable=protected-access
  assert abs(watchdog.grace_s() - min(high, max(low, steps * 0.1))) < 0.01


def test_where_nothing_is_saved_at_a_boundary_the_grace_is_the_short_one():
  """Full recovery keeps no live state: a survivor stuck in a collective with its dead peer (sharded tables) goes at
  once instead of waiting out the long grace (a restart at Kaggle size once took 11 s so)."""
  low, _ = peer_watchdog._STEP_BOUNDARY_GRACE_S  # pylint: disable=protected-access
  watchdog = _watchdog()
  watchdog.boundary_matters = False
  watchdog.reported(40, 'train')
  assert watchdog.grace_s() == low


def test_with_collective_blocks_the_grace_is_the_short_one_and_at_most_a_step():
  """A block whose steps need a dead peer ends only within the step the survivor was finishing: the grace is the
  short one and at most one step at the loop's fastest recent pace, never the rest of the block; without a pace yet,
  the short one."""
  low, high = peer_watchdog._STEP_BOUNDARY_GRACE_S  # pylint: disable=protected-access
  watchdog = _watchdog()
  watchdog.reported(40, 'train')
  watchdog.dispatched(8)
  watchdog.lose('told to stop (SIGTERM)')
  assert watchdog.grace_s() == low  # No step time yet.
  watchdog.dispatched(None)
  assert watchdog.grace_s() == high  # No collective block: the long grace, without a step time.
  watchdog._reported_at -= 0.2  # pylint: disable=protected-access  (0.1 s a step)
  watchdog.reported(42, 'train')
  watchdog._reported_at -= 1.0  # pylint: disable=protected-access  (a save between: 0.5 s a step)
  watchdog.reported(44, 'train')
  assert abs(watchdog._fast_step_s - 0.108) < 1e-4  # pylint: disable=protected-access  (it follows the fast ones)
  watchdog.dispatched(8)
  first_due = watchdog._block_due  # pylint: disable=protected-access
  watchdog.dispatched(8)  # Queued after the first.
  assert abs(watchdog._block_due - first_due - 8 * 0.108) < 0.01  # pylint: disable=protected-access
  watchdog._lost_at = watchdog._block_due - 0.8  # pylint: disable=protected-access  (lost 0.8 s before it is due)
  assert abs(watchdog.grace_s() - (0.108 + low)) < 1e-3  # One step, not the 0.8 s the blocks had left.
  watchdog._lost_at = watchdog._block_due - 0.05  # pylint: disable=protected-access  (lost in its last step)
  assert abs(watchdog.grace_s() - (0.05 + low)) < 1e-9
  watchdog._lost_at = watchdog._block_due + 5  # pylint: disable=protected-access  (lost long after it was due)
  assert watchdog.grace_s() == low


REPO = pathlib.Path(__file__).resolve().parents[2]
_FAIL_SCRIPT = """
import os, sys
from shadowsync_jax.parallel import distributed

class Watchdog:  # The watchdog's side of `fail`: a peer found lost (it ends the process) or none.
  process_id, timeout_s, loop_handles_loss = 0, 0.1, True
  def wait_for_a_lost_peer(self):
    if sys.argv[1] == 'peer_lost':
      os.write(2, b'watchdog: process 1 is gone\\n')
      os._exit(75)
  def report_failure(self, text):
    print('reported:', text, file=sys.stderr)

distributed._watchdog = Watchdog()
try:
  raise RuntimeError(sys.argv[2])
except RuntimeError as error:
  distributed.fail(error, explain=sys.argv[3] or None)
"""


def _fail(tmp_path, peer: str, message: str, explain: str = ''):
  script = tmp_path / 'fail.py'
  script.write_text(_FAIL_SCRIPT)
  return subprocess.run(
    [sys.executable, str(script), peer, message, explain],
    env={**os.environ, 'PYTHONPATH': str(REPO)},
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )


def test_a_collective_that_failed_because_a_peer_died_is_a_line_not_a_traceback(tmp_path):
  """A collective fails first when a peer is killed (CI saw a shadow round's, when rounds were collectives): the
  process names it in a line and waits for the watchdog, which names the peer; no traceback of this process's own."""
  result = _fail(tmp_path, 'peer_lost', 'Gloo all-reduce failed: Connection closed by peer [127.0.0.1]:18143')
  assert result.returncode == 75, result.stderr
  assert 'a collective failed (RuntimeError: Gloo all-reduce failed' in result.stderr, result.stderr
  assert 'process 1 is gone' in result.stderr and 'Traceback' not in result.stderr, result.stderr


def test_a_failure_no_peer_explains_is_this_processs_own_traceback_and_is_reported(tmp_path):
  result = _fail(tmp_path, 'no_peer_lost', 'Gloo all-reduce failed: Connection reset')
  assert result.returncode == 1, result.stderr
  assert result.stderr.index('a collective failed') < result.stderr.index('Traceback'), result.stderr
  assert 'reported: RuntimeError: Gloo all-reduce failed' in result.stderr, result.stderr
  own = _fail(tmp_path, 'no_peer_lost', 'a bug of this process')
  assert own.returncode == 1 and 'Traceback' in own.stderr and 'a collective failed' not in own.stderr, own.stderr
  explained = _fail(tmp_path, 'no_peer_lost', 'checkpoint gone', 'shadowsync: error: checkpoint gone')
  assert 'shadowsync: error: checkpoint gone' in explained.stderr and 'Traceback' not in explained.stderr
