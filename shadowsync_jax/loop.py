"""The training loop (docs/design.md §13): blocks of steps from a step to another, the hooks (`hooks`) acting at
every boundary between them, one clock for their timing. `train.train_and_evaluate` runs it over a whole run;
`studies.shadow_overhead` over its timed windows."""

from collections.abc import Sequence
import time
from typing import Any, NamedTuple

import jax

from shadowsync_jax import dispatch
from shadowsync_jax import hooks


class Timing(NamedTuple):
  """A loop's timed steps: those after its first block (which compiles; all of them where the caller times every
  block), their seconds less the loop's pauses (compiling the K 'auto' chose), and when that first block was done
  (`time.time()`; None where no block is left untimed)."""

  steps: int
  seconds: float
  first_block_done_at: float | None


def run_blocks(
  b: hooks.Boundary,
  until: int,
  blocks: dispatch.BlockDispatcher,
  hooks_before: Sequence[hooks.Hook] = (),
  hooks_after: Sequence[hooks.Hook] = (),
  first_block_untimed: bool = True,
) -> Timing:
  """The training loop (docs/design.md §13): blocks from `b.step` to `until`, moving `b` on as it goes (an error
  leaves it where it was). At each boundary the hooks act in order: `hooks_before`, the sync driver (`b.driver`,
  which a hook may replace), `hooks_after` (`hooks` module); before a block, the driver first. The loop's clock:
  `b.waited`, `b.paused_s`, and `b.work_s` (what `hooks_after` took at the last boundary). `first_block_untimed`:
  the loop's first block is waited for and left out of its timing (a run's first compiles;
  `studies.shadow_overhead`'s windows time every block)."""
  paused_at_start = blocks.paused_s
  timed_start, timed_steps, first_done_at = None if first_block_untimed else time.perf_counter(), 0, None

  def every_hook() -> list[Any]:
    return [*hooks_before, b.driver, *hooks_after]

  def hooks_due(at: int) -> list[int | None]:
    return [until, *(hook.next_due(at) for hook in every_hook())]

  while b.step < until:
    paused_before = blocks.paused_s
    b.steps = blocks.next_block(b.step, hooks_due)
    # The driver's first (a round's snapshot leaves before a straggler's sleep), then the others' (that sleep).
    for hook in [b.driver, *hooks_before, *hooks_after]:
      hook.before_block(b)
    b.state, b.metrics, b.block = blocks.dispatch(b.state, b.step, b.steps, hooks_due, rounds=b.driver)
    b.trained, b.step = b.step, b.step + b.steps  # The block before this one is done (one stays in flight).
    # Blocks the loop waits for before their boundary (none is left in flight): the first (it compiles), 'auto''s
    # probes, and those a hook asks for (a straggler's, stretched; one whose last step recovery must find trained).
    first = timed_start is None
    b.waited = first or blocks.waited or any(hook.waits_for(b) for hook in every_hook())
    if b.waited:
      jax.block_until_ready(b.metrics)
      b.trained = b.step
    if first:  # Examples/sec counts from the end of the first block.
      timed_start, first_done_at = time.perf_counter(), time.time()
    else:
      timed_steps += b.steps
    b.paused_s = blocks.paused_s - paused_before
    b.rewind_to = None
    for hook in hooks_before:
      hook.at_boundary(b)
    b.driver.at_boundary(b)  # Shadow paces time the blocks that ended since the last boundary.
    work_start = time.perf_counter()
    for hook in hooks_after:
      hook.at_boundary(b)
    b.work_s = time.perf_counter() - work_start  # A shadow pace leaves the next interval out if it held a save.
    if b.rewind_to is not None:  # Full recovery: the data restarts at the restored checkpoint.
      b.step = b.rewind_to
  for hook in every_hook():
    hook.end(b)
  jax.block_until_ready(b.state)
  seconds = 0.0 if timed_start is None else time.perf_counter() - timed_start - (blocks.paused_s - paused_at_start)
  return Timing(timed_steps, seconds, first_done_at)
