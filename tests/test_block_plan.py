"""The block plan: blocks of K steps cut where events fall, and 'auto''s K from timed blocks (pure, no device)."""

import pytest

from shadowsync_jax import block_plan


def _blocks(plan, start, due):
  """The block sizes from `start` to the stop, with `due(step)` the hooks' next due step."""
  sizes, step = [], start
  while step < plan.stop_step:
    sizes.append(plan.next_block(step, [due(step)]))
    step += sizes[-1]
  return sizes


def test_blocks_of_k_end_at_every_due_step_and_at_the_stop():
  plan = block_plan.BlockPlan(4, stop_step=23)
  every_10 = lambda step: block_plan.next_multiple(step, 10)
  # The first block is one step (it compiles); blocks of 4 after it, cut at 10, 20 and the stop.
  assert _blocks(plan, 0, every_10) == [1, 4, 4, 1, 4, 4, 2, 3]
  assert plan.steps_per_dispatch == 4 and not plan.probing


def test_a_due_step_at_or_before_the_current_step_cuts_nothing():
  plan = block_plan.BlockPlan(8, stop_step=100)
  plan.next_block(0)
  assert plan.next_block(10, [10, 3, None]) == 8


def test_auto_probes_then_picks_the_smallest_k_whose_dispatch_dwarfs_the_host():
  plan = block_plan.BlockPlan('auto', stop_step=10_000, max_steps=64)
  host_s, step_s = 2e-3, 1e-3  # A block of n steps: host_s + n step_s.
  step, sizes = 0, []
  while plan.steps_per_dispatch is None:
    n = plan.next_block(step)
    sizes.append(n)
    if plan.probing:
      plan.observe(n, host_s + n * step_s)
    step += n
  assert sizes == [1, *block_plan.PROBE]
  assert plan.host_s == pytest.approx(host_s) and plan.step_s == pytest.approx(step_s)
  # K step_s >= host_s / 0.05 = 40 step_s: the next power of two is 64.
  assert plan.steps_per_dispatch == 64 and plan.next_block(step) == 64
  assert plan.stats() == {
    'steps_per_dispatch': 64,
    'dispatch_host_s': plan.host_s,
    'dispatch_step_s': plan.step_s,
    'dispatch_host_bound_s': plan.host_s,  # Timings without noise: the bound is the fit.
  }


@pytest.mark.parametrize(
  ('host_s', 'step_s', 'expected'), [(1e-3, 1.0, 1), (1e-3, 0.5e-3, 64), (1e-3, 1e-9, 256), (0.0, 1e-3, 1)]
)
def test_choose_steps_per_dispatch(host_s, step_s, expected):
  assert block_plan.choose_steps_per_dispatch(host_s, step_s, max_steps=256) == expected


def _choose(timings_s: dict[int, list[float]], max_steps: int = 256) -> block_plan.BlockPlan:
  """A plan whose probe timed its blocks of n steps at `timings_s[n]`, in turn."""
  plan = block_plan.BlockPlan('auto', stop_step=10_000, max_steps=max_steps)
  step, left = 0, {n: list(seconds) for n, seconds in timings_s.items()}
  while plan.steps_per_dispatch is None:
    n = plan.next_block(step)
    if plan.probing:
      plan.observe(n, left[n].pop(0))
    step += n
  return plan


def test_a_fit_below_no_host_work_counts_as_noise():
  """Noise in a long probe block (a busy moment) can fit the host's work at 0 or less: it is never nothing, and K=1
  would pay a dispatch a step. A fit that far below 0 is off by at least as much: its bound is that far above."""
  plan = _choose({1: [0.010] * 3, 8: [0.090] * 3})  # 8 steps at 11.4 ms a step past one at 10 ms: h = -1.43 ms.
  assert plan.host_s == 0.0 and plan.host_bound_s == pytest.approx(0.080 / 7 - 0.010)
  # K step_s >= 1.43 ms / 0.05 with step_s = 11.4 ms: 2.5 steps, so 4.
  assert plan.steps_per_dispatch == 4


def test_noisy_probe_blocks_choose_k_from_the_hosts_upper_bound():
  """A probe seen on a busy 2-core machine (Kaggle's config, 'auto' chose K=1 there): one fast one-step block among
  slow ones fits h at 0.14 ms under a 4.66 ms step. The one-step blocks' spread (5.2 ms between the fastest two)
  could move h by 8/7 of it: the bound is the fastest one-step block, 4.8 ms, and K t >= 4.8 / 0.05 ms wants 32."""
  plan = _choose({1: [0.0048, 0.0100, 0.0110], 8: [0.03742, 0.0450, 0.0500]})
  assert plan.host_s == pytest.approx(0.14e-3) and plan.step_s == pytest.approx(4.66e-3)
  assert plan.host_bound_s == pytest.approx(0.0048) and plan.steps_per_dispatch == 32
  # Quiet blocks (0.1 ms apart) leave the fit nearly as measured: 0.14 ms + 8/7 * 0.1 ms + 1/7 * 0.1 ms.
  quiet = _choose({1: [0.0048, 0.0049, 0.0050], 8: [0.03742, 0.03752, 0.0376]})
  assert quiet.host_bound_s == pytest.approx(0.14e-3 + 9 / 7 * 0.1e-3)
  assert quiet.steps_per_dispatch == 2  # 0.27 ms / 0.05 = 5.4 ms: two steps of 4.66 ms.


def test_probe_blocks_cut_to_one_size_keep_the_probe_length():
  plan = block_plan.BlockPlan('auto', stop_step=1000)
  step = 0
  while plan.steps_per_dispatch is None:
    n = plan.next_block(step, [step + 1])  # An event every step.
    if plan.probing:
      plan.observe(n, 0.01)
    step += n
  assert plan.steps_per_dispatch == max(block_plan.PROBE) and plan.host_s is None


def test_a_job_takes_the_largest_k_any_process_chose():
  plan = block_plan.BlockPlan(2, stop_step=100)
  plan.agree([2, 16, 4])
  assert plan.steps_per_dispatch == 16


def test_fit_needs_two_sizes_and_takes_the_fastest_block_of_each():
  with pytest.raises(ValueError, match='two sizes'):
    block_plan.fit_host_and_step([(1, 0.1), (1, 0.2)])
  host_s, step_s = block_plan.fit_host_and_step([(1, 3.0), (1, 30.0), (9, 11.0), (9, 12.5)])
  assert (host_s, step_s) == pytest.approx((2.0, 1.0))


def test_invalid_steps_per_dispatch_and_a_block_past_the_stop():
  with pytest.raises(ValueError, match='steps_per_dispatch'):
    block_plan.BlockPlan(0, stop_step=10)
  with pytest.raises(ValueError, match='stops at 10'):
    block_plan.BlockPlan(2, stop_step=10).next_block(10)
  assert block_plan.next_multiple(7, None) is None and block_plan.next_multiple(10, 5) == 15


@pytest.mark.parametrize(
  'examples_per_step, expected', [(256, 256), (8 * 256, 256), (16_384, 64), (100_000, 8), (2**21, 1)]
)
def test_a_block_holds_at_most_a_million_examples_of_the_process(examples_per_step, expected):
  """'auto' never chooses a block past 2^20 of a process's examples (a GPU-sized batch of 16,384: 64 steps)."""
  assert block_plan.max_steps_for(examples_per_step) == expected


def test_peek_says_what_the_next_block_will_hold_without_planning_it():
  """What the loop reads ahead for the block after the current one: cut where that block will be cut (a CPR run's
  priority saves every 7 steps had K = 64 steps of data read for each block of 7)."""
  plan = block_plan.BlockPlan('auto', stop_step=100)
  every_7 = lambda step: block_plan.next_multiple(step, 7)
  step = 0
  while step < plan.stop_step:
    ahead = plan.peek(step, [every_7(step)])
    assert plan.peek(step, [every_7(step)]) == ahead  # Plans nothing.
    steps = plan.next_block(step, [every_7(step)])
    assert steps == ahead
    if plan.probing:
      plan.observe(steps, 0.01 + steps * 0.001)
    step += steps
  plan = block_plan.BlockPlan(64, stop_step=100)
  plan.next_block(0)
  assert plan.peek(1, [7]) == 6 and plan.peek(1) == 64 and plan.peek(90) == 10
