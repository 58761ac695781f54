"""Which failures a run meets and how it comes back from them: emulated in one process, real otherwise.

  recovery = policies.make(config, meshes, workdir, total_steps)
  state_L, sync_state_R, step = recovery.resume(fresh)      # fresh() -> (state_L, sync_state_R): built only if needed
  recovery.start(step, state_L, sync_state_R)
  for ...:                                                  # the training loop (train.py), a block at a time
    recovery.at_boundary(b)                                 # b: `hooks.Boundary` (a full recovery sets b.state,
    recovery.next_due(step)                                 #   b.driver, b.rewind_to); where the next block ends
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

from shadowsync_jax import hooks
from shadowsync_jax.parallel import control
from shadowsync_jax.parallel import history
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import emulated
from shadowsync_jax.recovery import real
from shadowsync_jax.recovery import training_state

PyTree = Any


class RecoveryPolicy(Protocol):
  """What the training loop calls (module docstring): a hook of the loop (`hooks.Hook`), and the run's start and
  end."""

  def resume(self, fresh: training_state.FreshState) -> tuple[Any, PyTree, int]: ...

  def start(self, step: int, state_L: Any, sync_state_R: PyTree) -> None: ...

  def waits_for(self, b: hooks.Boundary) -> bool:
    """Whether the block that ends at `b.step` must be done before its boundary's work (the loop waits for it)."""

  def next_due(self, step: int) -> int | None: ...

  def at_boundary(self, b: hooks.Boundary) -> None:
    """`b.trained`: the last step known trained (`b.step` where the loop waited for the block, else the boundary
    before: one block stays in flight)."""

  def on_error(self, error: BaseException, step: int, state_L: Any, driver: Any) -> None: ...

  def finish(self, step: int, state_L: Any, sync_state_R: PyTree) -> None: ...

  def summary(self) -> dict[str, Any]: ...


def make(
  config: ml_collections.ConfigDict,
  meshes: replicas.ReplicaMeshes,
  workdir: str | pathlib.Path,
  total_steps: int,
  warmup_steps: int = 1,
  warmup_blocks: int = 1,
) -> RecoveryPolicy:
  """The policy of `config.recovery.mode` for a job of `jax.process_count()` processes; `warmup_steps` and
  `warmup_blocks`: the steps and blocks of a start before the loop runs at its pace (its compiling block and
  'auto''s probe: `block_plan.steps_until_chosen`, `blocks_until_chosen`), a restart's cost, untimed."""
  if config.recovery.mode != 'none' and jax.process_count() == 1:
    return emulated.EmulatedFailures(config, meshes, workdir, total_steps, untimed_blocks=warmup_blocks)
  return real.RealFailures(config, meshes, workdir, total_steps, warmup_steps)


def steps_per_dispatch(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> int | str:
  """The K this start of the run dispatches: `train.steps_per_dispatch`, but for a restart of a job (the launcher's
  generation > 0) under 'auto', the K an earlier start chose (`note_steps_per_dispatch`: process 0's, so every
  process of the job takes the same), so that a restart does not probe again (its blocks waited for and timed,
  their programs compiled: about a second a restart at Criteo Kaggle's size). A first start, and a run resumed by
  hand (perhaps on another machine), probe."""
  configured, generation = config.train.steps_per_dispatch, control.generation()
  if configured != 'auto' or generation == 0:
    return configured
  chosen = [
    record['steps_per_dispatch']
    for record in history.read(workdir)
    if record.get('event') == 'steps_per_dispatch' and record.get('generation', generation) < generation
  ]
  return chosen[-1] if chosen else configured


def note_steps_per_dispatch(workdir: str | pathlib.Path, steps: int) -> None:
  """Writes down the K 'auto' chose (process 0's; the job's where the processes agree on one) for the job's
  restarts (`steps_per_dispatch`)."""
  if jax.process_index() == 0:
    record = {'event': 'steps_per_dispatch', 'generation': control.generation(), 'steps_per_dispatch': steps}
    history.append(workdir, 'process_0', record)
