"""An emulated straggler: a process whose own steps take `slowdown` times as long as they would.

  delay = straggler.from_config(config.straggler, process_index)   # Straggler(slowdown, warmup_steps, ...)
  for block in ...:
    delay.sleep_before(n)                           # once calibrated: sleeps first, what the block will not take
    state, metrics = train_block(state, block)      # n steps in one dispatch (one, for gba's workers)
    delay.time_block(metrics, n)                    # waits for them and times them
  (as a hook of the training loop: `before_block`, `waits_for`, `at_boundary`, `next_due`)
  delay.restart()                  # after a wait that is no step (another process compiling): not timed

Its own step time is measured before it is slowed, while every process runs at the same pace: its mean step time over
`calibration_steps` steps, after the first (which compiles) and `warmup_steps` more (the first steps of a job run slower
than its steady ones: caches fill, peers finish compiling; timing them set a "2x" straggler's period 2.4x the job's
steady step under sync_sgd). A block of n steps is timed from the end of the previous `time_block` to the moment its
results are ready, each of its steps a 1/n share (data, dispatch, compute and the steps' collectives: everything the
loop does per step), and the mean, not the median, is what a pace is (examples/sec is steps over their summed time).

From then on a block of n steps lasts n x `slowdown` x that period: before dispatching it, the straggler sleeps what the
block will not take, the period less the loop's work since the last block and the block's expected run (n x the mean
step of its slowed blocks, sleep excluded; its own step time before the first), plus what the blocks before fell short
of their periods (a block that ran shorter than expected; the mean lags a pace that speeds up: without it a "2x"
straggler beside a shadow thread achieved 1.89x; a block that ran longer is not made up). It sleeps *before* the block,
not after it: in a job whose steps are collectives (sync_sgd, sharded tables) a peer's block waits in them for the
straggler's, so its delay lands in the same block on every process; slept after block b, it landed in the peers' block b
+ 1, and where blocks differ in length (a scheduled shadow round's one-step blocks after 64-step ones) a one-step block
carried a 64-step block's delay and the peers' shadow pacer read rounds as 100x dearer than they were. The expected run
is the mean of what its slowed blocks took, not its calibrated step: a straggler that wakes to a peer parked in the all-
reduce steps slower than one in step with it (a fixed (slowdown - 1) x its step of sleep overshot to 2.55x under
sync_sgd), and the mean takes that in. So the slowdown is of its own work, never a multiple of the time it waits for its
peers (timing every step and sleeping a multiple of it made a "2x" straggler slow sync_sgd 3.6x). Under sync_sgd a 2x
straggler then holds a job of equal processes to about 1/2 of its pace; without per-step collectives it runs at about
1/2 of its own (its warm-up and calibration steps, unslowed, make a short run's share a little more). Waiting for every
block costs it its dispatch overlap, in the calibration too, so the period is measured against the same kind of step.
`achieved_slowdown` says what it did: its slowed blocks' mean step, sleeps included, over its own step time.
"""

import statistics
import time
from typing import Any

import jax

from shadowsync_jax import hooks
from shadowsync_jax.parallel import replicas


class Straggler(hooks.Hook):
  """Sleeps before each block so that the process's steps last `slowdown` times its own step time (1.0: no delay,
  no waiting); a hook of the training loop (`hooks`), or called by a loop of its own (`sleep_before`, `time_block`:
  the parameter server's workers)."""

  def __init__(self, slowdown: float, warmup_steps: int, calibration_steps: int, first_step: int = 0):
    """`first_step`: the run's first step (its calibration ends a number of steps after it)."""
    if slowdown < 1:
      raise ValueError(f'slowdown={slowdown} must be >= 1.')
    if warmup_steps < 0:
      raise ValueError(f'warmup_steps={warmup_steps} must be >= 0.')
    if calibration_steps < 1:
      raise ValueError(f'calibration_steps={calibration_steps} must be >= 1.')
    self.slowdown = slowdown
    self._first_step = first_step
    self.slept_s = 0.0
    self.own_step_s: float | None = None  # The mean calibrated step time, once measured.
    self.slowed_steps = 0
    self.slowed_s = 0.0  # The slowed steps' summed length, sleeps included.
    self._warmup_steps = warmup_steps
    self._calibration_steps = calibration_steps
    self._steps_seen = 0  # Timed steps (the compiling first one is not), warm-up included.
    self._step_times: list[float] = []
    self._last_end: float | None = None
    self._woke: float | None = None  # When `sleep_before` last finished sleeping (None: no slowed block pending).
    self._run_s, self._run_steps = 0.0, 0  # The slowed blocks' runs (from the sleep's end to ready), summed.
    self._owed_s = 0.0  # What the slowed blocks so far fell short of their periods (< 0: ran over; by one at most).

  @property
  def achieved_slowdown(self) -> float | None:
    """Its slowed steps' mean length over its own step time (None before any step was slowed)."""
    if not self.slowed_steps or not self.own_step_s:
      return None
    return self.slowed_s / self.slowed_steps / self.own_step_s

  @property
  def waits_for_blocks(self) -> bool:
    """Whether `time_block` waits for the block it is given (to stretch it): then none is left in flight."""
    return self.slowdown != 1

  def before_block(self, b: hooks.Boundary) -> None:
    self.sleep_before(b.steps)

  def waits_for(self, b: hooks.Boundary) -> bool:
    return self.waits_for_blocks

  def at_boundary(self, b: hooks.Boundary) -> None:
    self.time_block(b.metrics, b.steps)

  def sleep_before(self, steps: int) -> None:
    """Before a dispatch of `steps` steps: once calibrated, sleeps what of their period (`steps` x `slowdown` x its
    own step) the loop's work since the last block and the block's expected run will not fill, and what the blocks
    before fell short of theirs."""
    if not self.waits_for_blocks or self.own_step_s is None or self._last_end is None:
      return
    expected_step_s = self._run_s / self._run_steps if self._run_steps else self.own_step_s
    elapsed = time.perf_counter() - self._last_end
    delay = max(0.0, steps * (self.slowdown * self.own_step_s - expected_step_s) - elapsed + self._owed_s)
    time.sleep(delay)
    self.slept_s += delay
    self._woke = time.perf_counter()

  def time_block(self, block_result: Any, steps: int) -> None:
    """After a dispatch of `steps` steps: waits for them; times them (the loop plans blocks that end where
    calibration does)."""
    if not self.waits_for_blocks:
      return
    jax.block_until_ready(block_result)
    now = time.perf_counter()
    if self.own_step_s is None:
      if self._last_end is not None:  # The first step compiles: it is not a step time.
        for _ in range(steps):
          self._steps_seen += 1
          if self._steps_seen > self._warmup_steps and len(self._step_times) < self._calibration_steps:
            self._step_times.append((now - self._last_end) / steps)
      if len(self._step_times) == self._calibration_steps:
        self.own_step_s = statistics.fmean(self._step_times)
    elif self._woke is not None:
      self._run_s += now - self._woke
      self._run_steps += steps
      # A block whose period came out short (it ran shorter than expected) leaves the next sleep longer, one whose
      # period came out long leaves it shorter, by at most this block's period: a long wait (a save, a peer) is not
      # made up by running unslowed for long after it.
      period_s = steps * self.slowdown * self.own_step_s
      self._owed_s = max(-period_s, self._owed_s + period_s - (now - self._last_end))
      self.slowed_steps += steps
      self.slowed_s += now - self._last_end
    self._woke = None
    self._last_end = now

  def next_due(self, step: int) -> int | None:
    """Where its calibration ends (the loop ends a block there); None once calibrated or without a slowdown."""
    if self.slowdown == 1 or self.own_step_s is not None:
      return None
    due = self._first_step + 1 + self._warmup_steps + self._calibration_steps
    return due if due > step else None

  def restart(self) -> None:
    """The next step is timed from now: the wait since the last step (a compilation elsewhere, a checkpoint) is
    not part of its steps."""
    self._last_end = time.perf_counter()
    self._woke = None


def from_config(section: Any, process_index: int, first_step: int = 0) -> Straggler:
  """The delay a run's `straggler` section asks of this process: slowed if it is `section.process`, else never
  waiting; for a run from `first_step`."""
  slowdown = section.slowdown if section.process == process_index else 1.0
  return Straggler(slowdown, section.warmup_steps, section.calibration_steps, first_step)


def summary(delay: Straggler, straggler_process: int) -> dict[str, float | None]:
  """The straggler process's figures for summary.json, on every process (a collective: every process calls it):
  straggler_sleep_s (its sleeps, summed), straggler_step_s (the own step time they multiply) and
  straggler_achieved_slowdown (its slowed steps' mean length over that); 0 and None without a straggler."""
  if straggler_process < 0:  # The same config on every process: none of them gathers.
    return {'straggler_sleep_s': 0.0, 'straggler_step_s': None, 'straggler_achieved_slowdown': None}
  figures = (delay.slept_s, delay.own_step_s or 0.0, delay.achieved_slowdown or 0.0)
  slept, own, achieved = (replicas.gather_from_processes(x) for x in figures)
  return {
    'straggler_sleep_s': float(slept[straggler_process]),
    'straggler_step_s': float(own[straggler_process]) or None,
    'straggler_achieved_slowdown': float(achieved[straggler_process]) or None,
  }
