"""The pace of shadow rounds (`pacing.GapPacer`): a round's measured device time over the budget, in seconds and in
steps of the measured step time; and which block a boundary's interval times (`pacing.BlockClock`)."""

import math

import pytest

from shadowsync_jax.sync import pacing

STEP_S = 0.010


def _timed(pacer: pacing.GapPacer, steps: int, step_s: float = STEP_S) -> None:
  for _ in range(steps):
    pacer.observe_steps(step_s, 1)


def test_the_interval_is_the_cost_of_a_round_over_the_budget():
  pacer = pacing.GapPacer(max_overhead=0.05)
  assert pacer.interval_s() == 0.0 and pacer.gap_steps() == 1  # Nothing measured: rounds as soon as they can.
  pacer.observe_round_cost(0.004)
  assert pacer.interval_s() == pytest.approx(0.08)
  assert pacer.gap_steps() == 1  # No step time yet.
  _timed(pacer, pacing.MIN_STEPS_MEASURED)
  assert pacer.step_time_s() == pytest.approx(STEP_S)
  assert pacer.gap_steps() == 8  # 80 ms of 10 ms steps.
  stats = pacer.stats()
  assert stats['sync_round_cost_s'] == 0.004 and stats['sync_overhead_estimate'] == pytest.approx(0.05)
  assert pacing.GapPacer(max_overhead=0.10, fixed_interval_s=None).interval_s() == 0.0
  looser = pacing.GapPacer(max_overhead=0.10)
  looser.observe_round_cost(0.004)
  assert looser.interval_s() == pytest.approx(0.04)  # Twice the budget: rounds twice as often.


def test_the_gap_rounds_up_so_the_budget_holds():
  pacer = pacing.GapPacer(max_overhead=0.05)
  pacer.observe_round_cost(0.0041)
  _timed(pacer, 10)
  assert pacer.gap_steps() == math.ceil(0.0041 / 0.05 / STEP_S) == 9
  assert pacer.stats()['sync_overhead_estimate'] <= 0.05


def test_a_rounds_host_work_counts_with_its_device_time():
  """Across processes a round's sums are met on the host, by a thread on the training process's cores: its CPU
  seconds are a cost of the round as its programs' device time is."""
  pacer = pacing.GapPacer(max_overhead=0.05)
  pacer.observe_host_cost(0.001)
  assert pacer.interval_s() == 0.0 and pacer.round_cost_s() is None  # No device time timed yet.
  pacer.observe_round_cost(0.004)
  assert pacer.round_cost_s() == pytest.approx(0.005) and pacer.interval_s() == pytest.approx(0.1)
  stats = pacer.stats()
  assert stats['sync_round_cost_s'] == pytest.approx(0.005) and stats['sync_round_host_s'] == 0.001


def test_a_fixed_interval_is_kept_and_still_measured():
  pacer = pacing.GapPacer(max_overhead=0.05, fixed_interval_s=0.2)
  pacer.observe_round_cost(0.5)
  _timed(pacer, 10)
  assert pacer.interval_s() == 0.2 and pacer.gap_steps() == 20
  assert pacer.stats()['sync_round_cost_s'] == 0.5
  assert pacing.GapPacer(max_overhead=0.05, fixed_interval_s=0.0).gap_steps() == 1  # As fast as they go.


def test_the_step_time_follows_the_machine():
  """Older step times fade after `memory_s` of training: a machine that got twice as slow is read as such soon
  after, not averaged with its past for good."""
  pacer = pacing.GapPacer(max_overhead=0.05, memory_s=1.0)
  _timed(pacer, 200)  # 2 s at 10 ms.
  _timed(pacer, 300, step_s=2 * STEP_S)  # 6 s at 20 ms.
  assert pacer.step_time_s() == pytest.approx(2 * STEP_S, rel=0.01)


@pytest.mark.parametrize(
  'kwargs, message',
  [
    ({'max_overhead': 0.0}, 'max_overhead'),
    ({'max_overhead': 1.0}, 'max_overhead'),
    ({'max_overhead': 0.05, 'fixed_interval_s': -1.0}, 'fixed_interval_s'),
    ({'max_overhead': 0.05, 'memory_s': 0.0}, 'memory_s'),
  ],
)
def test_bad_settings_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    pacing.GapPacer(**kwargs)


def test_the_block_clock_times_the_block_in_flight_not_the_one_just_dispatched():
  """The loop keeps one block in flight: the time from one boundary to the next is the block dispatched before the
  first of them. Blocks of 16 and 1 steps at 10 ms a step, each timed as the block just dispatched, read steps of
  160 ms and 0.6 ms; timed as the block in flight, every step reads 10 ms."""
  pacer = pacing.GapPacer(max_overhead=0.05)
  clock = pacing.BlockClock(pacer)
  sizes = [1, 16, 1, 16, 1, 16, 1]
  now = 0.0
  for previous, steps in zip([None] + sizes, sizes):
    now += (previous or 0) * STEP_S  # The wait at this boundary ends with the block before this one.
    clock.boundary(now, steps)
  assert pacer.step_time_s() == pytest.approx(STEP_S)


def test_a_block_waited_for_at_its_own_boundary_is_timed_as_itself():
  """A straggler waits for each block to stretch it (as do 'auto''s probes and the compiling block): then no block
  is in flight, and the interval up to its boundary holds that block (with the one in flight before it, if any)."""
  pacer = pacing.GapPacer(max_overhead=0.05)
  clock = pacing.BlockClock(pacer)
  now = 0.0
  clock.boundary(now, 1, waited=True)  # The compiling block: nothing before it.
  for steps in (16, 1, 16, 1):  # Each waited for: its interval is its own time.
    now += steps * STEP_S
    clock.boundary(now, steps, waited=True)
  assert pacer.step_time_s() == pytest.approx(STEP_S)
  now += 0.0001  # Then one kept in flight: the next interval (the loop's wait for nothing) times no block,
  clock.boundary(now, 8)
  now += 8 * STEP_S  # and the one after it times that block.
  clock.boundary(now, 8)
  assert pacer.step_time_s() == pytest.approx(STEP_S, rel=1e-3)


def test_a_pause_or_the_loops_own_work_is_left_out():
  """'auto' compiles the programs of the K it chose after its last probe, and the loop's saves and writes fill
  some intervals: neither is a step's time."""
  pacer = pacing.GapPacer(max_overhead=0.05)
  clock = pacing.BlockClock(pacer)
  clock.boundary(0.0, 4, waited=True)
  clock.boundary(4 * STEP_S + 1.5, 4, waited=True, paused_s=1.5)  # A 1.5 s compile in it.
  clock.boundary(8 * STEP_S + 1.5, 4, waited=True)
  clock.skip()
  clock.boundary(100.0, 4)  # A save filled this one: left out.
  clock.boundary(100.0 + 4 * STEP_S, 4)
  assert pacer.step_time_s() == pytest.approx(STEP_S)
