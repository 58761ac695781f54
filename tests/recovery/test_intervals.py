"""Checkpoint intervals and PLS against closed forms, brute force and Monte Carlo simulations with fixed seeds."""

import math

import numpy as np
import pytest

from shadowsync_jax.recovery import failures
from shadowsync_jax.recovery import intervals as ci


def test_young_interval_and_units():
  assert ci.young_interval(save_cost=2.0, mtbf=100.0) == pytest.approx(20.0)
  save_cost_steps = ci.steps_from_seconds(0.5, step_time_s=0.05)  # a 0.5 s save blocks 10 steps of 50 ms
  assert save_cost_steps == pytest.approx(10.0)
  assert ci.young_interval_steps(save_cost_steps, mtbf_steps=500, total_steps=10_000) == 100
  assert ci.young_interval_steps(save_cost_steps, mtbf_steps=500, total_steps=60) == 60  # capped by the run
  assert ci.young_interval_steps(0.0, mtbf_steps=500, total_steps=60) == 1
  with pytest.raises(ValueError, match='step_time_s'):
    ci.steps_from_seconds(1.0, 0.0)


def test_young_interval_is_near_the_optimum_of_the_exact_full_recovery_overhead():
  save, restore, mtbf, total = 4.0, 2.0, 2_000.0, 200_000
  overhead = {k: ci.expected_full_recovery_overhead(k, save, restore, mtbf, total) for k in range(20, 400)}
  best = min(overhead, key=overhead.get)
  young = ci.young_interval_steps(save, mtbf, total)  # sqrt(2 * 4 * 2000) = 126.5
  assert young == 126 and abs(best - young) < 0.1 * young, best
  assert overhead[young] < 1.01 * overhead[best]
  first_order = save / young + ((young + 1) / 2 + restore) / mtbf
  assert overhead[young] == pytest.approx(first_order, rel=0.05)


def _simulate_full_recovery(seed, interval, save, restore, mtbf, total):
  """Runs the full-recovery loop on the failure clock: a failure rewinds the data to the last checkpoint."""
  schedule = failures.FailureSchedule(seed, mtbf, 'replica', 1, 1)
  executed = position = checkpoint = 0
  cost = 0.0
  while position < total:
    executed += 1
    position += 1
    if schedule.failures_at(executed):  # one restore, however many failures struck the step
      cost += restore
      position = checkpoint
    elif position % interval == 0 and position < total:
      cost += save
      checkpoint = position
  return (executed - total + cost) / total


def test_full_recovery_overhead_matches_a_simulation():
  interval, save, restore, mtbf, total = 20, 1.0, 3.0, 60.0, 200
  runs = np.array([_simulate_full_recovery(seed, interval, save, restore, mtbf, total) for seed in range(600)])
  expected = ci.expected_full_recovery_overhead(interval, save, restore, mtbf, total)
  assert abs(runs.mean() - expected) < 4 * runs.std() / math.sqrt(len(runs)), (runs.mean(), expected)


def _monte_carlo_pls(interval, mtbf, num_parts, total, trials, seed, survivors=False):
  """PLS of independent simulated runs, in plain numpy: Poisson failures, uniform parts, unique lost steps; the
  failed parts' (each back to its copy before the failure), or with `survivors` the other parts' at each failure."""
  rng = np.random.default_rng(seed)
  times_TxF = np.cumsum(rng.exponential(mtbf, (trials, 4 * int(total / mtbf) + 64)), axis=1)
  assert np.all(times_TxF[:, -1] > total)  # drew enough failures for every trial
  parts_TxF = rng.integers(0, num_parts, times_TxF.shape)
  trial_F, fail_F = np.nonzero(times_TxF < total)
  step_F = np.ceil(times_TxF[trial_F, fail_F]).astype(int)
  interval_F = (step_F - 1) // interval  # checkpoints at 0, k, 2k, ...; one saved at s comes after s's failure
  last_TxPxI = np.zeros((trials, num_parts, total // interval + 1), np.int64)
  failed_F = parts_TxF[trial_F, fail_F]
  for part in range(num_parts):
    losing_F = failed_F != part if survivors else failed_F == part
    where = (trial_F[losing_F], np.full(losing_F.sum(), part), interval_F[losing_F])
    np.maximum.at(last_TxPxI, where, step_F[losing_F] - interval_F[losing_F] * interval)
  return last_TxPxI.sum(axis=(1, 2)) / (num_parts * total)


def test_expected_pls_matches_monte_carlo_where_the_first_order_estimate_does_not():
  """mu * k = 0.5: a part often fails twice in one interval, and the first-order (k + 1) / (2 N mtbf) is 17% high."""
  interval, mtbf, num_parts, total = 100, 50.0, 4, 1_050  # 10 whole intervals and one of 50 steps
  runs = _monte_carlo_pls(interval, mtbf, num_parts, total, trials=4_000, seed=0)
  standard_error = runs.std() / math.sqrt(len(runs))
  expected = ci.expected_pls(interval, mtbf, num_parts, total)
  assert abs(runs.mean() - expected) < 4 * standard_error, (runs.mean(), expected, standard_error)
  first_order = (interval + 1) / (2 * num_parts * mtbf)
  assert first_order - runs.mean() > 20 * standard_error


def test_expected_pls_tends_to_cpr_first_order_estimate_for_rare_failures():
  for interval in (1, 10, 250):
    assert ci.expected_pls(interval, 1e6, 8, 1_000) == pytest.approx((interval + 1) / (2 * 8 * 1e6), rel=1e-3)
  # An interval past the run: the initial state is the only checkpoint.
  assert ci.expected_pls(5_000, 1e6, 8, 1_000) == pytest.approx(ci.expected_pls(1_000, 1e6, 8, 1_000))


def test_the_schedule_and_lost_steps_give_the_expected_pls_on_average():
  interval, mtbf, num_parts, total = 40, 30.0, 3, 400
  checkpoints = range(0, total + 1, interval)
  runs = []
  for seed in range(1_500):
    schedule = failures.FailureSchedule(seed, mtbf, 'embedding_shard', 8, num_parts, total)
    runs.append(ci.measured_pls(ci.lost_steps(list(schedule), checkpoints), num_parts, total))
  runs = np.array(runs)
  expected = ci.expected_pls(interval, mtbf, num_parts, total)
  assert abs(runs.mean() - expected) < 4 * runs.std() / math.sqrt(len(runs)), (runs.mean(), expected)


def test_lost_steps_by_hand():
  r = lambda step, index: failures.Failure(step, 'replica', index)
  got = ci.lost_steps([r(5, 0), r(8, 0), r(8, 1), r(10, 1), r(12, 0), r(25, 1), r(25, 1)], checkpoint_steps=[10, 20])
  # r0 at 5: steps 1-5 since the initial state; at 8: only 6-8 are new; r1 at 8: 1-8; r1 at 10: the checkpoint at
  # 10 is saved after this failure, so 9-10; r0 at 12: 11-12; r1 at 25: 21-25, and again at once: nothing new.
  assert got == [5, 3, 8, 2, 2, 5, 0]
  assert ci.measured_pls(got, num_parts=2, total_steps=30) == pytest.approx(25 / 60)
  with pytest.raises(ValueError, match='step order'):
    ci.lost_steps([r(9, 0), r(4, 0)], [])


def test_partial_recovery_interval_is_the_longest_under_the_target():
  mtbf, num_parts, total = 80.0, 4, 600
  pls_K = np.array([ci.expected_pls(k, mtbf, num_parts, total) for k in range(1, total + 1)])
  assert np.all(np.diff(pls_K) >= 0)  # monotone, so bisection is valid
  for target in (0.004, 0.01, 0.05, 0.2, 0.5):
    brute = int(np.flatnonzero(pls_K <= target)[-1]) + 1
    assert ci.partial_recovery_interval(target, mtbf, num_parts, total) == brute, target
  assert ci.partial_recovery_interval(1.0, mtbf, num_parts, total) == total  # capped by the run
  assert pls_K[0] > 0.003  # a checkpoint every step loses 1 - e^-(1 / (N mtbf)) = 0.0031
  with pytest.raises(ValueError, match='unreachable'):
    ci.partial_recovery_interval(0.003, mtbf, num_parts, total)


def test_survivors_lose_the_steps_since_their_copies_whenever_another_part_fails():
  """A survivor stuck behind a dead peer goes back to its newest copy: `expected_pls` at the rate the other parts
  fail, so the copies' interval that holds it under a target is `partial_recovery_interval` at that rate."""
  interval, mtbf, num_parts, total = 20, 50.0, 3, 400
  runs = _monte_carlo_pls(interval, mtbf, num_parts, total, trials=4_000, seed=1, survivors=True)
  expected = ci.expected_pls(interval, mtbf / (num_parts - 1), num_parts, total)
  assert abs(runs.mean() - expected) < 4 * runs.std() / math.sqrt(len(runs)), (runs.mean(), expected)
  for target in (0.02, 0.05, 0.2):
    longest = ci.survivor_copy_interval(target, mtbf, num_parts, total)
    assert ci.expected_pls(longest, mtbf / 2, num_parts, total) <= target
    assert ci.expected_pls(longest + 1, mtbf / 2, num_parts, total) > target, target
  # Two parts: the survivor loses at the rate the other fails, as often as the failed part: the checkpoints' interval.
  assert ci.survivor_copy_interval(0.01, mtbf, 2, total) == ci.partial_recovery_interval(0.01, mtbf, 2, total)
  assert ci.survivor_copy_interval(0.01, mtbf, 1, total) is None  # No survivors.
  assert ci.survivor_copy_interval(1e-6, mtbf, num_parts, total) == 1  # Unreachable: as often as allowed.


def test_saves_beside_training_come_as_often_as_their_budget_allows_and_no_more_often_than_asked():
  # 0.8 s a save, 5% of the time, 68 ms a step: a save every 16 s, 236 steps.
  assert ci.budget_interval_steps(0.8, 0.068, 0.05, least_steps=9) == 236
  assert ci.budget_interval_steps(0.001, 0.068, 0.05, least_steps=9) == 9
  with pytest.raises(ValueError):
    ci.budget_interval_steps(0.8, 0.0, 0.05, least_steps=9)
