"""Runs bracketed by a reference: the order, and each run read against its neighbours."""

import pytest

from shadowsync_jax.studies import bracketed


def test_every_other_run_sits_between_two_reference_runs():
  assert bracketed.run_order('none', ['sync_sgd', 'fr_ma', 'fr_ma']) == [
    'none', 'sync_sgd', 'none', 'fr_ma', 'none', 'fr_ma', 'none',
  ]  # fmt: skip
  assert bracketed.run_order('none', []) == ['none']


def test_a_run_is_read_against_the_mean_of_its_neighbours_so_a_steady_drift_cancels():
  order = bracketed.run_order('none', ['a', 'b'])
  # The machine slows steadily (none: 100, 90, 80); a runs at 0.9 of none, b at 0.5.
  speeds = [100.0, 0.9 * 95.0, 90.0, 0.5 * 85.0, 80.0]
  assert bracketed.ratios(order, speeds, 'none') == pytest.approx([1.0, 0.9, 1.0, 0.5, 1.0])


def test_a_run_without_a_reference_on_both_sides_has_no_ratio():
  assert bracketed.ratios(['a', 'none', 'b', 'c', 'none'], [1.0, 2.0, 3.0, 4.0, 5.0], 'none') == [
    None, 1.0, None, None, 1.0,
  ]  # fmt: skip
  with pytest.raises(ValueError, match='2 speeds'):
    bracketed.ratios(['none', 'a', 'none'], [1.0, 2.0], 'none')
