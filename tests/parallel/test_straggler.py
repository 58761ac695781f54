"""The emulated straggler on a fake clock: it multiplies its steps, and only its steps."""

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


def test_a_straggler_runs_its_steps_slowdown_times_slower_but_not_the_waits_it_restarts_after(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(straggler, 'time', clock)
  delay = straggler.Straggler(slowdown=3.0)
  _run(delay, clock, step_s=5.0)  # The first step compiles: not a step time, no sleep.
  assert delay.slept_s == 0.0
  start = clock.now
  _run(delay, clock, step_s=0.01)
  _run(delay, clock, step_s=0.02)
  assert clock.now - start == pytest.approx(3 * 0.03) and delay.slept_s == pytest.approx(2 * 0.03)
  clock.now += 1.5  # A wait that is no step (the gba servers' compilation): restarted, not multiplied.
  delay.restart()
  start = clock.now
  _run(delay, clock, step_s=0.01)
  assert clock.now - start == pytest.approx(3 * 0.01) and delay.slept_s == pytest.approx(2 * 0.04)


def test_no_slowdown_never_waits_nor_sleeps(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(straggler, 'time', clock)
  delay = straggler.Straggler(slowdown=1.0)
  for _ in range(3):
    _run(delay, clock, step_s=0.5)
  assert delay.slept_s == 0.0 and clock.now == 101.5
