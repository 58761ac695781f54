"""The progress line printed during training: position, recent examples/sec and time left.

  progress = ProgressLine(total_steps=5000, examples_per_step=num_replicas * batch_size)
  for step in range(1, 5001):
    state, metrics = train_step(state, batch)
    progress.update(step)
  progress.finish()

prints, at most every 5 seconds,

  step 1200/5000 (24%)  31,250 ex/s  elapsed 0:00:40  left 0:02:01

The first `update` only starts the rate clock: its step paid for compilation, which would skew the rate. The rate
is measured over the last few printed lines, so it follows slowdowns; time left assumes that rate holds.
`print_fn` and `clock` are injectable so tests run on a fake clock.
"""

import collections
from collections.abc import Callable
import time

from shadowsync_jax import hooks


def format_duration(seconds: float) -> str:
  """`H:MM:SS`, hours unbounded (`27:03:09`), rounded to the second."""
  total = int(round(max(seconds, 0.0)))
  hours, remainder = divmod(total, 3600)
  minutes, secs = divmod(remainder, 60)
  return f'{hours}:{minutes:02d}:{secs:02d}'


class ProgressLine(hooks.Hook):
  """Throttled progress printing for a loop of `total_steps` steps of `examples_per_step` examples each; as a hook
  of the training loop, `update` at every boundary."""

  def __init__(
    self,
    total_steps: int,
    examples_per_step: int,
    every_seconds: float = 5.0,
    window_lines: int = 6,
    print_fn: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
  ):
    if total_steps <= 0 or examples_per_step <= 0:
      raise ValueError(f'total_steps and examples_per_step must be positive; got {total_steps}, {examples_per_step}.')
    self._total_steps = total_steps
    self._examples_per_step = examples_per_step
    self._every_seconds = every_seconds
    self._print_fn = print_fn
    self._clock = clock
    self._created_time = clock()
    self._first_mark: tuple[float, int] | None = None  # (time, step) of the first update.
    self._last_mark: tuple[float, int] | None = None
    self._last_print_time = 0.0
    self._window = collections.deque(maxlen=window_lines + 1)  # (time, step) at recent printed lines.

  def update(self, step: int) -> None:
    """Call after step `step` (1-based count of steps done) completes; prints if `every_seconds` have passed."""
    now = self._clock()
    self._last_mark = (now, step)
    if self._first_mark is None:
      self._first_mark = self._last_mark
      self._window.append(self._last_mark)
      self._last_print_time = now
      return
    if now - self._last_print_time < self._every_seconds:
      return
    self._window.append(self._last_mark)
    self._last_print_time = now
    self._print_fn(self._line(now, step, _rate(self._window[0], self._last_mark, self._examples_per_step)))

  def at_boundary(self, b: hooks.Boundary) -> None:
    self.update(b.step)

  @property
  def examples_per_sec(self) -> float | None:
    """Mean rate from the first update to the last, so excluding the compiled first step; None before two."""
    if self._first_mark is None:
      return None
    return _rate(self._first_mark, self._last_mark, self._examples_per_step)

  def finish(self) -> None:
    """Prints the closing line with the whole-run rate (excluding the first step)."""
    now = self._clock()
    step = self._last_mark[1] if self._last_mark else 0
    rate = self.examples_per_sec
    rate_text = 'n/a' if rate is None else f'{rate:,.0f} ex/s'
    self._print_fn(
      f'done {step}/{self._total_steps} steps in {format_duration(now - self._created_time)}'
      f'  mean {rate_text} (after the first step)'
    )

  def _line(self, now: float, step: int, rate: float | None) -> str:
    percent = 100 * step // self._total_steps
    if rate is None or rate == 0.0:
      rate_text, left_text = '-- ex/s', '?'
    else:
      remaining_examples = max(self._total_steps - step, 0) * self._examples_per_step
      rate_text, left_text = f'{rate:,.0f} ex/s', format_duration(remaining_examples / rate)
    return (
      f'step {step}/{self._total_steps} ({percent}%)  {rate_text}'
      f'  elapsed {format_duration(now - self._created_time)}  left {left_text}'
    )


def _rate(start: tuple[float, int], end: tuple[float, int], examples_per_step: int) -> float | None:
  """Examples per second between two (time, step) marks; None when no time has passed."""
  seconds = end[0] - start[0]
  if seconds <= 0.0:
    return None
  return (end[1] - start[1]) * examples_per_step / seconds
