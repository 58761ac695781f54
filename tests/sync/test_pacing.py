"""Shadow rounds that pace themselves (sync.pacing): the interval from measured step times and round costs.

Fed with made-up measurements, no clock: a round's cost against the steps between rounds gives the interval
exactly; the interval grows when a round costs more or runs longer (a slower link); and in a simulated run, where
the pacer's interval decides when each round starts, the throughput lost stays within the budget and uses most of it.
"""

import pytest

from shadowsync_jax.sync import pacing

STEP_S = 0.010


def _round(pacer: pacing.Pacer, between_steps: int, in_round_steps: int, in_round_step_s: float, latency_s=0.02):
  for _ in range(between_steps):
    pacer.observe_step(STEP_S, in_round=False)
  for _ in range(in_round_steps):
    pacer.observe_step(in_round_step_s, in_round=True)
  pacer.observe_round(latency_s)


def test_the_first_round_is_a_warm_up_then_one_that_stopped_training_is_assumed():
  pacer = pacing.Pacer(max_overhead=0.05)
  assert pacer.interval_s() == 0.0
  # The first round (its programs' first run, the collectives' first connections) costs what later ones do not.
  _round(pacer, between_steps=10, in_round_steps=2, in_round_step_s=50 * STEP_S, latency_s=1.0)
  assert pacer.interval_s() == 0.0 and pacer.round_cost_s() is None
  assert pacer.stats()['step_time_in_round_s'] is None  # Left out of every estimate.
  _round(pacer, between_steps=0, in_round_steps=2, in_round_step_s=STEP_S, latency_s=0.03)
  assert pacer.round_cost_s() is None  # No step between rounds measured yet.
  assert pacer.interval_s() == pytest.approx(0.03 / 0.05)
  for _ in range(pacing.MIN_STEPS_MEASURED):  # Steps while the thread waits: the estimate takes over at once.
    pacer.observe_step(STEP_S, in_round=False)
  assert pacer.interval_s() < 0.03 / 0.05


def test_the_interval_is_the_cost_of_a_round_over_the_budget():
  pacer = pacing.Pacer(max_overhead=0.05)
  for _ in range(4):
    _round(pacer, between_steps=20, in_round_steps=5, in_round_step_s=0.014)
  cost_s = 5 * (0.014 - STEP_S)
  assert pacer.step_time_s() == pytest.approx(STEP_S)
  assert pacer.round_cost_s() == pytest.approx(cost_s)
  assert pacer.interval_s() == pytest.approx(cost_s / 0.05)
  stats = pacer.stats()
  assert stats['sync_interval_s'] == pytest.approx(0.4)
  assert stats['step_time_in_round_s'] == pytest.approx(0.014)
  assert stats['sync_overhead_estimate'] == pytest.approx(cost_s / (20 * STEP_S + 5 * 0.014))
  assert pacing.Pacer(0.10).interval_s() == 0.0
  looser = pacing.Pacer(max_overhead=0.10)
  for _ in range(4):
    _round(looser, between_steps=20, in_round_steps=5, in_round_step_s=0.014)
  assert looser.interval_s() == pytest.approx(cost_s / 0.10)


def test_rounds_slow_down_as_their_cost_grows_and_follow_it_back():
  pacer = pacing.Pacer(max_overhead=0.05, window_rounds=8)
  for _ in range(8):
    _round(pacer, between_steps=20, in_round_steps=5, in_round_step_s=0.012)
  cheap_s = pacer.interval_s()
  intervals = []
  for _ in range(8):  # Each round's steps now take twice the extra time.
    _round(pacer, between_steps=20, in_round_steps=5, in_round_step_s=0.014)
    intervals.append(pacer.interval_s())
  # From the first dearer round on, rounds are spaced further; while the window mixes cheap and dear rounds the
  # spread of their costs makes the pace cautious; once it holds only the dearer ones, twice the cost: twice the pace.
  assert all(interval > cheap_s for interval in intervals) and intervals[0] < intervals[3], intervals
  assert intervals[-1] == pytest.approx(2 * cheap_s)
  for _ in range(8):
    _round(pacer, between_steps=20, in_round_steps=5, in_round_step_s=0.012)
  assert pacer.interval_s() == pytest.approx(cheap_s)


def test_a_slower_link_spaces_the_rounds_further():
  """Same slowdown of each step beside a round, but a round in flight for 4x the steps (its bytes take 4x as long
  on the wire): 4x the cost, 4x the interval."""
  fast, slow = pacing.Pacer(0.05), pacing.Pacer(0.05)
  for _ in range(6):
    _round(fast, between_steps=30, in_round_steps=4, in_round_step_s=0.012)
    _round(slow, between_steps=30, in_round_steps=16, in_round_step_s=0.012)
  assert slow.interval_s() == pytest.approx(4 * fast.interval_s())


def test_rounds_that_cost_nothing_still_leave_steps_between_them():
  pacer = pacing.Pacer(max_overhead=0.05)
  for _ in range(4):
    _round(pacer, between_steps=3, in_round_steps=6, in_round_step_s=STEP_S * 0.99)  # Noise: "faster" in rounds.
  assert pacer.round_cost_s() == 0.0
  assert pacer.interval_s() == pytest.approx(6 * STEP_S * 0.99 + pacing.STEPS_BETWEEN_ROUNDS * STEP_S)


def test_noisy_measurements_space_the_rounds_further():
  """The pace takes an upper bound of the cost: the same mean cost measured with scatter gives a longer interval,
  which shrinks towards the steady one as more rounds are measured."""
  steady, noisy = pacing.Pacer(0.05, window_rounds=64), pacing.Pacer(0.05, window_rounds=64)
  for pacer in (steady, noisy):  # The warm-up round, left out.
    _round(pacer, between_steps=20, in_round_steps=5, in_round_step_s=0.012)
  for i in range(8):
    _round(steady, between_steps=20, in_round_steps=5, in_round_step_s=0.012)
    _round(noisy, between_steps=20, in_round_steps=5, in_round_step_s=0.012 + (0.004 if i % 2 else -0.004))
  assert noisy.round_cost_s() == pytest.approx(steady.round_cost_s())
  few = noisy.interval_s()
  assert few > 1.2 * steady.interval_s()
  for i in range(56):
    _round(noisy, between_steps=20, in_round_steps=5, in_round_step_s=0.012 + (0.004 if i % 2 else -0.004))
  assert steady.interval_s() < noisy.interval_s() < few


def test_a_fixed_interval_is_kept_and_still_measured():
  pacer = pacing.Pacer(max_overhead=0.05, fixed_interval_s=0.2)
  assert pacer.interval_s() == 0.2
  for _ in range(3):
    _round(pacer, between_steps=20, in_round_steps=5, in_round_step_s=0.014)
  assert pacer.interval_s() == 0.2
  assert pacer.stats()['sync_round_cost_s'] == pytest.approx(5 * 0.004)


@pytest.mark.parametrize(
  'kwargs, message',
  [
    ({'max_overhead': 0.0}, 'max_overhead'),
    ({'max_overhead': 1.0}, 'max_overhead'),
    ({'max_overhead': 0.05, 'fixed_interval_s': -1.0}, 'fixed_interval_s'),
    ({'max_overhead': 0.05, 'window_rounds': 0}, 'window_rounds'),
    ({'max_overhead': 0.05, 'memory_s': 0.0}, 'memory_s'),
  ],
)
def test_bad_settings_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    pacing.Pacer(**kwargs)


def _simulate(pacer: pacing.Pacer, num_steps: int, slowdown_at, round_steps: int) -> tuple[float, int]:
  """A training loop and its shadow thread in made-up time, as `shadow.ShadowSync` times them: a step takes
  STEP_S, or STEP_S x slowdown_at(step) while a round is in flight or in its three tail steps; a round is handed its
  snapshot at the first boundary `interval_s()` after the last one started, and is merged `round_steps` steps
  later. Returns (the share of throughput lost, rounds)."""
  now_s, last_start_s, left, tail, rounds = 0.0, None, 0, 0, 0
  for step in range(num_steps):
    in_flight = left > 0
    if not in_flight and (last_start_s is None or now_s - last_start_s >= pacer.interval_s()):
      last_start_s, left, tail, in_flight = now_s, round_steps, 3, True
    in_round = in_flight or tail > 0
    seconds = STEP_S * (slowdown_at(step) if in_round else 1.0)
    pacer.observe_step(seconds, in_round)
    now_s += seconds
    tail = max(0, tail - 1)
    if in_flight:
      left -= 1
      if left == 0:
        pacer.observe_round(latency_s=round_steps * STEP_S)
        tail, rounds = 3, rounds + 1
  return 1.0 - num_steps * STEP_S / now_s, rounds


@pytest.mark.parametrize('slowdown, round_steps', [(1.5, 3), (2.0, 10), (1.2, 40)])
def test_a_paced_run_loses_about_its_budget_and_no_more(slowdown, round_steps):
  pacer = pacing.Pacer(max_overhead=0.05)
  lost, rounds = _simulate(pacer, 20_000, lambda step: slowdown, round_steps)
  assert rounds > 50
  assert 0.035 < lost <= 0.052, (lost, pacer.stats())


def test_a_paced_run_follows_a_round_cost_that_doubles():
  """Until the window of rounds has turned over, the pace lags a sudden change: a little over budget meanwhile."""
  pacer = pacing.Pacer(max_overhead=0.05)
  _, rounds_cheap = _simulate(pacer, 20_000, lambda step: 1.5, round_steps=5)
  lost, rounds_dear = _simulate(pacer, 20_000, lambda step: 2.0, round_steps=5)
  assert rounds_dear < 0.6 * rounds_cheap, (rounds_cheap, rounds_dear)
  assert lost <= 0.055, (lost, pacer.stats())


def test_an_early_costly_round_ages_out_of_the_pace():
  """The first round after the warm-up stalls the trainers for seconds (a busy machine): the pace it sets would
  leave the rest of the run without a round; the pacer forgets it after `memory_s` of training and paces anew."""
  slow_until_step = 40  # The warm-up round and the first measured one: 40x slower steps while in flight.
  pacer = pacing.Pacer(max_overhead=0.05)
  lost, rounds = _simulate(pacer, 20_000, lambda step: 40.0 if step < slow_until_step else 1.5, round_steps=5)
  run_s = 20_000 * STEP_S / (1 - lost)
  assert run_s > 4 * pacing.MEMORY_S
  assert rounds > 200, (rounds, pacer.stats())  # Paced at the cheap rounds' cost for the rest of the run.
  assert pacer.interval_s() < 2.0, pacer.stats()

  unforgetting = pacing.Pacer(max_overhead=0.05, memory_s=1e9)  # What it did before: one round, the whole run.
  _, rounds_kept = _simulate(unforgetting, 20_000, lambda step: 40.0 if step < slow_until_step else 1.5, round_steps=5)
  assert rounds_kept < 20 < rounds, (rounds_kept, rounds)


def test_the_block_clock_times_the_block_in_flight_not_the_one_just_dispatched():
  """The loop keeps one block in flight: the time from one boundary to the next is the block dispatched before the
  first of them. Blocks of 16 and 1 steps at 10 ms a step, each timed as the block just dispatched, read steps of
  160 ms and 0.6 ms; timed as the block in flight, every step reads 10 ms."""
  pacer = pacing.Pacer(max_overhead=0.05)
  clock = pacing.BlockClock(pacer)
  sizes = [1, 16, 1, 16, 1, 16, 1]
  now = 0.0
  for previous, steps in zip([None] + sizes, sizes):
    now += (previous or 0) * STEP_S  # The wait at this boundary ends with the block before this one.
    clock.boundary(now, steps, in_flight=False)
  assert pacer.step_time_s() == pytest.approx(STEP_S)
  assert pacer.round_cost_bound_s() is None  # No round yet.
  assert pacer._open.between_sq_s2 == pytest.approx(sum(sizes[:-1]) * STEP_S**2)  # pylint: disable=protected-access


def test_the_block_clock_counts_the_blocks_a_round_touched_as_in_it():
  """A snapshot handed over (or a round merged) at boundary i is copied on the device after block i and before
  block i + 1: block i ran before it (between rounds), blocks i + 1 and i + 2 carry it (in the round); a block that
  ran while a round was in flight is in it. `skip` leaves out the next interval (the loop's own work filled it)."""
  pacer = pacing.Pacer(max_overhead=0.05)
  clock = pacing.BlockClock(pacer)
  now, in_flight = 0.0, False

  def boundary(steps, seconds):
    nonlocal now
    now += seconds
    clock.boundary(now, steps, in_flight)

  boundary(4, 0.0)  # Block 0 dispatched: nothing timed yet.
  boundary(4, 4 * STEP_S)  # Times block 0; block 1 dispatched, then the hand-over.
  in_flight = True
  clock.touched()
  assert clock.in_round(in_flight)
  boundary(4, 4 * STEP_S)  # Times block 1: it ran before the copy.
  assert (pacer._open.between_steps, pacer._open.in_round_steps) == (8, 0)  # pylint: disable=protected-access
  boundary(4, 8 * STEP_S)  # Times block 2: after the copy, beside the round.
  in_flight = False  # Merged at this boundary.
  clock.touched()
  boundary(4, 8 * STEP_S)  # Block 3: in flight.
  boundary(4, 8 * STEP_S)  # Block 4: after the merge.
  boundary(4, 8 * STEP_S)  # Block 5: the margin.
  assert (pacer._open.between_steps, pacer._open.in_round_steps) == (8, 16)  # pylint: disable=protected-access
  assert not clock.in_round(in_flight)
  boundary(4, 4 * STEP_S)  # Block 6: between.
  clock.skip()
  boundary(4, 100 * STEP_S)  # Left out: a save filled it.
  boundary(4, 4 * STEP_S)  # Block 8: between.
  assert (pacer._open.between_steps, pacer._open.in_round_steps) == (16, 16)  # pylint: disable=protected-access
  assert pacer._open.between_s == pytest.approx(16 * STEP_S)  # pylint: disable=protected-access


def test_a_block_waited_for_at_its_own_boundary_is_timed_as_itself():
  """A straggler waits for each block to stretch it (as do 'auto''s probes and the compiling block): then no block
  is in flight, and the interval up to its boundary holds that block (with the one in flight before it, if any)."""
  pacer = pacing.Pacer(max_overhead=0.05)
  clock = pacing.BlockClock(pacer)
  now = 0.0
  clock.boundary(now, 1, in_flight=False, waited=True)  # The compiling block: nothing before it.
  for steps in (16, 1, 16, 1):  # Each waited for: its interval is its own time.
    now += steps * STEP_S
    clock.boundary(now, steps, in_flight=False, waited=True)
  assert pacer.step_time_s() == pytest.approx(STEP_S)
  now += 0.0001  # Then one kept in flight: the next interval (the loop's wait for nothing) times no block,
  clock.boundary(now, 8, in_flight=False)
  now += 8 * STEP_S  # and the one after it times that block.
  clock.boundary(now, 8, in_flight=False)
  assert pacer._open.between_steps == 34 + 8  # pylint: disable=protected-access
  assert pacer.step_time_s() == pytest.approx(STEP_S, rel=1e-3)


def test_a_pause_that_is_no_training_is_left_out_of_the_interval():
  """'auto' compiles the programs of the K it chose after its last probe: seconds in the probe's interval that are
  no step's (timed as a step in a round, one such compile made a round read 30x its cost and stopped the rounds)."""
  pacer = pacing.Pacer(max_overhead=0.05)
  clock = pacing.BlockClock(pacer)
  clock.boundary(0.0, 4, in_flight=False, waited=True)
  clock.boundary(4 * STEP_S + 1.5, 4, in_flight=False, waited=True, paused_s=1.5)  # A 1.5 s compile in it.
  clock.boundary(8 * STEP_S + 1.5, 4, in_flight=False, waited=True)  # The next interval keeps all of its time.
  assert pacer._open.between_s == pytest.approx(8 * STEP_S)  # pylint: disable=protected-access


def test_rounds_are_never_paced_further_apart_than_the_memory():
  """A round measured as costing seconds would space the next one past `memory_s`; a driver that fixes the next
  round's step when it dispatches a round (sharded tables' `scheduled`) would then keep that gap with no round in
  between to measure afresh. The interval is `memory_s` at most."""
  pacer = pacing.Pacer(max_overhead=0.05, memory_s=5.0)
  for _ in range(2):
    _round(pacer, between_steps=20, in_round_steps=2, in_round_step_s=0.5)  # A second a round: a 20 s pace.
  assert pacer.round_cost_s() == pytest.approx(2 * (0.5 - STEP_S))
  assert pacer.interval_s() == 5.0
  stalled = pacing.Pacer(max_overhead=0.05, memory_s=5.0)
  _round(stalled, between_steps=0, in_round_steps=0, in_round_step_s=0.0)  # The warm-up round.
  _round(stalled, between_steps=0, in_round_steps=0, in_round_step_s=0.0, latency_s=2.0)  # No step time yet.
  assert stalled.interval_s() == 5.0
