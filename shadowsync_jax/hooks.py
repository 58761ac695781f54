"""What acts at the training loop's block boundaries, and what it sees there (docs/design.md §13).

  class Hook(hooks.Hook):                  # every method optional: the base does nothing
    def next_due(self, step): ...          # the first step after `step` whose boundary it must act at (None: any)
    def before_block(self, b): ...         # before the block of b.steps from b.step is dispatched
    def waits_for(self, b): ...            # whether that block must be done before its boundary
    def at_boundary(self, b): ...          # after it: b.step (its end), b.steps, b.state, b.metrics, b.block, ...
    def end(self, b): ...                  # after the last block, before the loop's time stops

The loop (`loop.run_blocks`) plans each block to end at the first step any hook is due, then calls each hook's
`before_block`, dispatches the block, asks `waits_for`, and calls each `at_boundary`, in the order it was given the
hooks, the run's sync driver among them (`Boundary.driver`: a full recovery may restart it). A hook changes what
the loop goes on with through `b`: the train state (a round, a restore), the sync driver, `rewind_to` (the stream
restarts there). The loop owns the clock: `b.waited`, `b.paused_s` and `b.work_s` say what of the time since the
last boundary was no step's.
"""

import dataclasses
from typing import Any


@dataclasses.dataclass
class Boundary:
  """The loop between two blocks. In `before_block`, `step` is where the next block starts and `steps` its length;
  in `at_boundary`, `step` is where the block just dispatched ends."""

  step: int
  state: Any  # The train state (its last block may still be in flight, unless `waited`).
  driver: Any  # The sync driver (`sync.drivers`).
  steps: int = 0
  metrics: Any = None  # The block's metrics, on the device.
  block: Any = None  # The block's batches [L, K, B, ...].
  trained: int = 0  # The last step known trained: `step` if the loop waited for the block, else the one before.
  waited: bool = False  # The loop waited for the block before this boundary: none is in flight.
  paused_s: float = 0.0  # Seconds since the last boundary that were no training (compiling the K 'auto' chose).
  work_s: float = 0.0  # Seconds the loop's hooks after the sync driver took at the last boundary (writes, saves).
  rewind_to: int | None = None  # Set by a full recovery: the loop goes on from this step.


class Hook:
  """A hook that does nothing: subclasses override what they act on (module docstring)."""

  def next_due(self, step: int) -> int | None:
    return None

  def before_block(self, b: Boundary) -> None:
    return None

  def waits_for(self, b: Boundary) -> bool:
    return False

  def at_boundary(self, b: Boundary) -> None:
    return None

  def end(self, b: Boundary) -> None:
    return None
