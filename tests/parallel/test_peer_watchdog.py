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


def test_a_loop_waiting_on_a_block_gets_the_time_the_block_should_take():
  """A block whose steps need a dead peer never ends: the grace is the block's own time at the loop's fastest
  recent pace, then the short one; without a pace yet, the short one. Out of the block, the steps' grace again."""
  low, high = distributed._STEP_BOUNDARY_GRACE_S  # pylint: disable=protected-access
  watchdog = _watchdog()
  watchdog.reported(40, 'train')
  watchdog.waiting_for(8)
  watchdog.lose('told to stop (SIGTERM)')
  assert watchdog.grace_s() == low  # No step time yet.
  watchdog.waiting_for(None)
  assert watchdog.grace_s() == high
  watchdog._reported_at -= 0.2  # pylint: disable=protected-access  (0.1 s a step)
  watchdog.reported(42, 'train')
  watchdog._reported_at -= 1.0  # pylint: disable=protected-access  (a save between: 0.5 s a step)
  watchdog.reported(44, 'train')
  watchdog.waiting_for(8)
  watchdog._lost_at = watchdog._block_due - 0.8  # pylint: disable=protected-access  (lost 0.8 s before it is due)
  assert abs(watchdog.grace_s() - (0.8 + low)) < 0.01
  assert abs(watchdog._block_due - watchdog._lost_at - 0.8) < 1e-9  # pylint: disable=protected-access
  watchdog._lost_at = watchdog._block_due + 5  # pylint: disable=protected-access  (lost long after it was due)
  assert watchdog.grace_s() == low
  watchdog.waiting_for(None)
  steps = distributed._STEP_BOUNDARY_GRACE_STEPS  # pylint: disable=protected-access
  assert watchdog.grace_s() == min(high, max(low, steps * watchdog._step_s))  # pylint: disable=protected-access
