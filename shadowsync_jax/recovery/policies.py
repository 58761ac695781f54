"""Which failures a run meets and how it comes back from them: emulated in one process, real otherwise.

  recovery = policies.make(config, meshes, workdir, total_steps)
  state_L, sync_state_R, step = recovery.resume(fresh)      # fresh() -> (state_L, sync_state_R): built only if needed
  recovery.start(step, state_L, sync_state_R)
  for ...:                                                  # the training loop (train.py), a block at a time
    state_L, driver, rewind_to = recovery.at_boundary(step, state_L, n, block, driver, trained)
    recovery.next_due(step)                                 # where the loop ends the next block
  recovery.finish(step, state_L, driver.sync_state())
  recovery.summary()

Both own the run's checkpoints. One process with a `recovery.mode` emulates failures on a seeded schedule
(`emulated`: the CPR study); everything else meets real failures (`real`: a process of the job dies, the job is
started again, each process restores what the restart plan gives it), which without a `recovery.mode` is a resume
from the newest checkpoints.
"""

import pathlib
from typing import Any, Protocol

import jax
import ml_collections

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import emulated
from shadowsync_jax.recovery import real

PyTree = Any


class RecoveryPolicy(Protocol):
  """What the training loop calls (module docstring)."""

  def resume(self, fresh: checkpointing.FreshState) -> tuple[Any, PyTree, int]: ...

  def start(self, step: int, state_L: Any, sync_state_R: PyTree) -> None: ...

  def waits_for(self, step: int) -> bool:
    """Whether the block that ends at `step` must be done before its boundary's work (the loop waits for it)."""

  def next_due(self, step: int) -> int | None: ...

  def at_boundary(
    self, step: int, state_L: Any, steps: int, block: Batch, driver: Any, trained: int | None = None
  ) -> tuple[Any, Any, int | None]:
    """`trained`: the last step known trained (`step` where the loop waited for the block, else the boundary
    before: one block stays in flight)."""

  def on_error(self, error: BaseException, step: int, state_L: Any, driver: Any) -> None: ...

  def finish(self, step: int, state_L: Any, sync_state_R: PyTree) -> None: ...

  def summary(self) -> dict[str, Any]: ...


def make(
  config: ml_collections.ConfigDict,
  meshes: replicas.ReplicaMeshes,
  workdir: str | pathlib.Path,
  total_steps: int,
  warmup_steps: int = 0,
) -> RecoveryPolicy:
  """The policy of `config.recovery.mode` for a job of `jax.process_count()` processes; `warmup_steps`: the steps
  of a start before the loop runs at its pace (its first block and 'auto''s probe), a restart's cost."""
  if config.recovery.mode != 'none' and jax.process_count() == 1:
    return emulated.EmulatedFailures(config, meshes, workdir, total_steps)
  return real.RealFailures(config, meshes, workdir, total_steps, warmup_steps)
