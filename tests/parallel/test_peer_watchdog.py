"""How long the peer watchdog leaves a training loop to reach its boundary once a peer is lost (no process started:
the watchdog's bookkeeping alone)."""

from shadowsync_jax.parallel import distributed


def _watchdog() -> distributed._PeerWatchdog:  # pylint: disable=protected-access
  return distributed._PeerWatchdog(None, 0, 2, timeout_s=10.0, coordinator_address='127.0.0.1:1')  # pylint: disable=protected-access


def test_before_its_first_block_a_loop_gets_the_short_grace_then_its_steps_set_it():
  low, high = distributed._STEP_BOUNDARY_GRACE_S  # pylint: disable=protected-access
  watchdog = _watchdog()
  assert watchdog.grace_s() == low  # Setup: nothing trained in this start, nothing newer than the disk to save.
  watchdog.reported(40, 'train')
  assert watchdog.grace_s() == high  # Training, no step time yet: the long grace.
  watchdog._reported_at -= 0.2  # pylint: disable=protected-access  (two steps took 0.2 s: 0.1 s a step)
  watchdog.reported(42, 'train')
  steps = distributed._STEP_BOUNDARY_GRACE_STEPS  # pylint: disable=protected-access
  assert abs(watchdog.grace_s() - min(high, max(low, steps * 0.1))) < 0.01


def test_where_nothing_is_saved_at_a_boundary_the_grace_is_the_short_one():
  """Full recovery keeps no live state: a survivor stuck in a collective with its dead peer (sharded tables) goes at
  once instead of waiting out the long grace (a restart at Kaggle size once took 11 s so)."""
  low, _ = distributed._STEP_BOUNDARY_GRACE_S  # pylint: disable=protected-access
  watchdog = _watchdog()
  watchdog.boundary_matters = False
  watchdog.reported(40, 'train')
  assert watchdog.grace_s() == low


def test_with_collective_blocks_the_grace_is_the_short_one_and_at_most_a_step():
  """A block whose steps need a dead peer ends only within the step the survivor was finishing: the grace is the
  short one and at most one step at the loop's fastest recent pace, never the rest of the block; without a pace yet,
  the short one."""
  low, high = distributed._STEP_BOUNDARY_GRACE_S  # pylint: disable=protected-access
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
