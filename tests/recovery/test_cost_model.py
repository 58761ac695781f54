"""CPR's first mechanism: the expected overheads of partial and full recovery, and the choice between them."""

import numpy as np
import pytest

from shadowsync_jax.recovery import cost_model
from shadowsync_jax.recovery import intervals


def test_partial_overhead_counts_saves_priority_saves_and_restores():
  # 1000 steps, a save every 100 (9 inside the run), priority saves every 25 but where a full one falls (30),
  # 1000 / 250 = 4 failures restoring 5 steps each.
  got = cost_model.expected_partial_recovery_overhead(100, 2.0, 5.0, 250.0, 1000, 0.5, 25)
  assert got == pytest.approx((9 * 2.0 + 30 * 0.5 + 4 * 5.0) / 1000)
  assert cost_model.expected_partial_recovery_overhead(100, 2.0, 5.0, 250.0, 1000) == pytest.approx(38 / 1000)


def test_partial_recovery_is_chosen_where_its_interval_is_long():
  # 8 parts and a 2% PLS budget (the CPR study's setting): partial saves every ~389 steps, full every ~89.
  choice = cost_model.choose(3.3, 7.0, 1.0, 1200.0, 8, 0.02, 7812)
  assert choice.mode == 'partial' and choice.partial_interval_steps > 4 * choice.full_interval_steps
  assert choice.partial_overhead < choice.full_overhead / 3
  assert choice.why.startswith('partial recovery is expected to cost less')


def test_full_recovery_is_chosen_where_the_pls_target_forces_frequent_saves():
  # The case: MTBF 200 steps over 4 shards at 1% PLS: partial saves every ~15 steps, full every ~38.
  choice = cost_model.choose(3.7, 3.0, 1.0, 200.0, 4, 0.01, 7812)
  assert choice.mode == 'full', choice
  assert choice.partial_interval_steps < choice.full_interval_steps
  assert choice.full_overhead == pytest.approx(
    intervals.expected_full_recovery_overhead(choice.full_interval_steps, 3.7, 3.0, 200.0, 7812)
  )
  unreachable = cost_model.choose(3.7, 3.0, 1.0, 200.0, 4, 1e-6, 7812)
  assert unreachable.mode == 'full' and unreachable.partial_overhead is None and 'cannot hold' in unreachable.why


def test_a_restart_cost_paid_by_both_modes_narrows_the_gap_but_keeps_the_order():
  cheap = cost_model.choose(3.3, 7.0, 1.0, 1200.0, 8, 0.02, 7812)
  costly = cost_model.choose(3.3, 7.0, 1.0, 1200.0, 8, 0.02, 7812, restart_steps=300.0)
  gap = lambda c: c.full_overhead - c.partial_overhead
  assert costly.mode == 'partial' and np.isclose(gap(costly), gap(cheap), rtol=0.2)
  assert costly.partial_overhead / costly.full_overhead > cheap.partial_overhead / cheap.full_overhead
