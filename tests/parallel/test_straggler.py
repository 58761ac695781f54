"""The emulated straggler on a fake clock: it multiplies its own calibrated step time, never its waits."""

import re

import pytest

from shadowsync_jax import config as config_lib
from shadowsync_jax.parallel import straggler


class _Clock:
  """`time.perf_counter` and `time.sleep` of the straggler module: sleeping advances the clock."""

  def __init__(self):
    self.now = 100.0

  def perf_counter(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


def _run(delay, clock, step_s, steps=1):
  """One block of `steps` steps that runs `step_s` each, as the loop dispatches it; returns the seconds slept."""
  slept = delay.slept_s
  delay.sleep_before(steps)
  clock.now += steps * step_s
  delay.time_block(None, steps)
  return delay.slept_s - slept


def test_a_straggler_paces_its_steps_to_slowdown_times_its_own_calibrated_step_never_a_multiple_of_its_waits(
  monkeypatch,
):
  clock = _Clock()
  monkeypatch.setattr(straggler, 'time', clock)
  delay = straggler.Straggler(slowdown=3.0, warmup_steps=2, calibration_steps=3)
  _run(delay, clock, step_s=5.0)  # The first step compiles: not a step time, no sleep.
  clock.now += 1.5  # A wait that is no step (the gba servers' compilation): restarted, not timed.
  delay.restart()
  for step_s in (0.09, 0.07):  # Warm-up: slower than the steady steps, neither timed nor slowed.
    _run(delay, clock, step_s)
  for step_s in (0.01, 0.04, 0.01):  # Calibration: timed at the job's even pace, not slowed; their mean is a pace.
    _run(delay, clock, step_s)
  assert delay.slept_s == 0.0 and delay.own_step_s == pytest.approx(0.02) and delay.achieved_slowdown is None
  first_slowed = start = clock.now
  assert _run(delay, clock, step_s=0.02) == pytest.approx(2 * 0.02)  # Before its first slowed block: its own step.
  assert clock.now - start == pytest.approx(3 * 0.02)
  # Four steps that run slower than its own (it wakes to a peer parked in a collective): slept for its own step, so
  # their period runs over by 0.04 s.
  start = clock.now
  assert _run(delay, clock, step_s=0.03, steps=4) == pytest.approx(4 * 2 * 0.02)
  assert clock.now - start == pytest.approx(4 * (0.04 + 0.03))
  # From then on a block is expected to run as long as its slowed blocks' mean step (0.14 s over 5 steps); the loop's
  # work since the last block is part of its period, and the overrun before is made up: the two blocks last their
  # 6 periods.
  clock.now += 0.01
  assert _run(delay, clock, step_s=0.028, steps=2) == pytest.approx(2 * (0.06 - 0.028) - 0.01 - 0.04)
  assert clock.now - start == pytest.approx(6 * 3 * 0.02)
  # A block that runs shorter than expected falls short of its period: the next sleep makes it up.
  start = clock.now
  _run(delay, clock, step_s=0.005)
  assert clock.now - start < 3 * 0.02
  _run(delay, clock, step_s=delay._run_s / delay._run_steps)  # pylint: disable=protected-access
  assert clock.now - start == pytest.approx(2 * 3 * 0.02)
  # Loop work longer than the period (a save): no sleep, never a negative one, and of the overrun one period at most
  # is made up after it (the next block's sleep), not seconds of unslowed steps.
  clock.now += 1.0
  assert _run(delay, clock, step_s=0.02) == 0.0
  start, expected_step_s = clock.now, delay._run_s / delay._run_steps  # pylint: disable=protected-access
  assert _run(delay, clock, expected_step_s) == 0.0  # The one period it makes up,
  assert _run(delay, clock, expected_step_s) > 0.0  # and slowed again from the next block:
  _run(delay, clock, expected_step_s)
  _run(delay, clock, expected_step_s)
  assert clock.now - start == pytest.approx((4 - 1) * 3 * 0.02)  # four blocks in three periods.
  assert delay.slowed_steps == 14
  assert delay.achieved_slowdown == pytest.approx((clock.now - first_slowed) / 14 / 0.02)


def test_the_sleep_comes_before_the_block_so_a_peers_same_block_waits_for_it(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(straggler, 'time', clock)
  delay = straggler.Straggler(slowdown=2.0, warmup_steps=0, calibration_steps=1)
  _run(delay, clock, step_s=5.0)  # Compiles.
  _run(delay, clock, step_s=0.1)  # Calibrates: 0.1 s a step.
  before = clock.now
  delay.sleep_before(64)
  assert clock.now - before == pytest.approx(64 * 0.1)  # Slept for the 64-step block, before dispatching it.
  clock.now += 64 * 0.1
  delay.time_block(None, 64)
  before = clock.now
  delay.sleep_before(1)  # A one-step block after it sleeps for one step, not for the 64 before it.
  assert clock.now - before == pytest.approx(0.1)


def test_no_slowdown_never_waits_nor_sleeps(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(straggler, 'time', clock)
  delay = straggler.Straggler(slowdown=1.0, warmup_steps=0, calibration_steps=1)
  for _ in range(3):
    _run(delay, clock, step_s=0.5)
  assert delay.slept_s == 0.0 and clock.now == 101.5


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match='slowdown'):
    straggler.Straggler(slowdown=0.5, warmup_steps=0, calibration_steps=1)
  with pytest.raises(ValueError, match='warmup_steps'):
    straggler.Straggler(slowdown=2.0, warmup_steps=-1, calibration_steps=1)
  with pytest.raises(ValueError, match='calibration_steps'):
    straggler.Straggler(slowdown=2.0, warmup_steps=0, calibration_steps=0)


def test_only_the_configured_process_is_slowed():
  config = config_lib.base_config()
  config.straggler.process, config.straggler.slowdown = 1, 2.5
  config.straggler.warmup_steps, config.straggler.calibration_steps = 7, 9
  slow, fast = straggler.from_config(config.straggler, 1), straggler.from_config(config.straggler, 0)
  assert (slow.slowdown, slow._warmup_steps, slow._calibration_steps) == (2.5, 7, 9)
  assert fast.slowdown == 1.0


@pytest.mark.parametrize(
  'settings, key',
  [
    ({'warmup_steps': -1}, 'straggler.warmup_steps'),
    ({'calibration_steps': 0}, 'straggler.calibration_steps'),
    ({'process': 1, 'slowdown': 2.0, 'warmup_steps': 3000, 'calibration_steps': 1000}, 'leave none'),
  ],
)
def test_a_straggler_that_would_never_be_slowed_is_a_config_error(settings, key):
  config = config_lib.base_config()  # 2,000,000 examples / (2 replicas x 256): 3,906 steps a process.
  config.straggler.update(settings)
  with pytest.raises(config_lib.ConfigError, match=re.escape(key)):
    config_lib.validate(config, num_devices=8, num_processes=2)
