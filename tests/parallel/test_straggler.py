"""The emulated straggler on a fake clock: it multiplies its own calibrated step time, never its waits."""

import pytest

from shadowsync_jax.parallel import straggler


class _Clock:
  """`time.perf_counter` and `time.sleep` of the straggler module: sleeping advances the clock."""

  def __init__(self):
    self.now = 100.0

  def perf_counter(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


def _run(delay, clock, step_s):
  clock.now += step_s
  delay.after_step(None)


def test_a_straggler_paces_its_steps_to_slowdown_times_its_own_calibrated_step_never_a_multiple_of_its_waits(
  monkeypatch,
):
  clock = _Clock()
  monkeypatch.setattr(straggler, 'time', clock)
  delay = straggler.Straggler(slowdown=3.0, calibration_steps=3)
  _run(delay, clock, step_s=5.0)  # The first step compiles: not a step time, no sleep.
  clock.now += 1.5  # A wait that is no step (the gba servers' compilation): restarted, not timed.
  delay.restart()
  for step_s in (0.01, 0.03, 0.02):  # Calibration: timed at the job's even pace, not slowed.
    _run(delay, clock, step_s)
  assert delay.slept_s == 0.0 and delay.own_step_s == pytest.approx(0.02)
  start = clock.now
  _run(delay, clock, step_s=0.02)
  assert clock.now - start == pytest.approx(3 * 0.02) and delay.slept_s == pytest.approx(2 * 0.02)
  # A step that took longer (a wait for a peer): it sleeps what is left of the period, nothing past it.
  start = clock.now
  _run(delay, clock, step_s=0.05)
  assert clock.now - start == pytest.approx(3 * 0.02) and delay.slept_s == pytest.approx(2 * 0.02 + 0.01)
  _run(delay, clock, step_s=0.5)
  assert delay.slept_s == pytest.approx(2 * 0.02 + 0.01)


def test_no_slowdown_never_waits_nor_sleeps(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(straggler, 'time', clock)
  delay = straggler.Straggler(slowdown=1.0)
  for _ in range(3):
    _run(delay, clock, step_s=0.5)
  assert delay.slept_s == 0.0 and clock.now == 101.5


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match='slowdown'):
    straggler.Straggler(slowdown=0.5)
  with pytest.raises(ValueError, match='calibration_steps'):
    straggler.Straggler(slowdown=2.0, calibration_steps=0)
