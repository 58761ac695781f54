"""ProgressLine on a fake clock: rate and time-left arithmetic, throttling, the first (compiling) step left out."""

import pytest

from shadowsync_jax.metrics.progress import ProgressLine
from shadowsync_jax.metrics.progress import format_duration


class FakeClock:
  def __init__(self, now: float = 100.0):
    self.now = now

  def __call__(self) -> float:
    return self.now


def _progress(clock, lines, **kwargs):
  kwargs = {'total_steps': 5000, 'examples_per_step': 1000, 'every_seconds': 5.0, **kwargs}
  return ProgressLine(print_fn=lines.append, clock=clock, **kwargs)


@pytest.mark.parametrize(
  'seconds, expected',
  [
    (0, '0:00:00'),
    (40.4, '0:00:40'),
    (121, '0:02:01'),
    (3600 * 27 + 189, '27:03:09'),
    (-3, '0:00:00'),
  ],
)
def test_format_duration(seconds, expected):
  assert format_duration(seconds) == expected


def test_rate_and_time_left_exclude_the_first_step():
  clock, lines = FakeClock(), []
  progress = _progress(clock, lines)
  clock.now += 30.0  # Compilation: 30 s for step 1.
  progress.update(1)
  clock.now += 10.0
  progress.update(201)  # 200 steps * 1000 examples in 10 s.
  assert lines == ['step 201/5000 (4%)  20,000 ex/s  elapsed 0:00:40  left 0:04:00']
  # Left: 4799 steps * 1000 / 20000 = 239.95 s, rounded to 0:04:00; elapsed counts compilation.


def test_prints_at_most_every_period():
  clock, lines = FakeClock(), []
  progress = _progress(clock, lines)
  progress.update(1)
  for step in range(2, 42):  # 0.25 s per step (exact in binary): 10 s in all.
    clock.now += 0.25
    progress.update(step)
  assert [line.split()[1] for line in lines] == ['21/5000', '41/5000']  # At 5.0 s and 10.0 s.


def test_first_update_prints_nothing():
  clock, lines = FakeClock(), []
  progress = _progress(clock, lines)
  clock.now += 100.0
  progress.update(1)
  assert lines == []


def test_rate_follows_recent_window():
  clock, lines = FakeClock(), []
  progress = _progress(clock, lines, window_lines=2, total_steps=100_000)
  progress.update(0)
  step = 0
  for _ in range(4):  # Fast phase: 100 steps per 5 s line = 20,000 ex/s.
    clock.now += 5.0
    step += 100
    progress.update(step)
  for _ in range(2):  # Slow phase: 10 steps per line = 2,000 ex/s; the 2-line window has left the fast phase.
    clock.now += 5.0
    step += 10
    progress.update(step)
  assert '20,000 ex/s' in lines[3]
  assert '11,000 ex/s' in lines[4]  # Window spans one fast and one slow interval: 110 steps in 10 s.
  assert '2,000 ex/s' in lines[5]
  assert progress.examples_per_sec == pytest.approx(420 * 1000 / 30.0)


def test_finish_reports_the_mean_rate_after_the_first_step():
  clock, lines = FakeClock(), []
  progress = _progress(clock, lines, total_steps=101, examples_per_step=64)
  clock.now += 20.0
  progress.update(1)
  clock.now += 4.0  # Below the print period: no progress line.
  progress.update(101)
  progress.finish()
  assert lines == ['done 101/101 steps in 0:00:24  mean 1,600 ex/s (after the first step)']
  assert progress.examples_per_sec == pytest.approx(1600.0)


def test_finish_without_updates():
  clock, lines = FakeClock(), []
  progress = _progress(clock, lines)
  progress.finish()
  assert lines == ['done 0/5000 steps in 0:00:00  mean n/a (after the first step)']
  assert progress.examples_per_sec is None


def test_no_time_passed_gives_unknown_rate():
  clock, lines = FakeClock(), []
  progress = _progress(clock, lines, every_seconds=0.0)
  progress.update(1)
  progress.update(2)
  assert lines == ['step 2/5000 (0%)  -- ex/s  elapsed 0:00:00  left ?']


def test_rejects_non_positive_sizes():
  with pytest.raises(ValueError, match='positive'):
    ProgressLine(total_steps=0, examples_per_step=10)
