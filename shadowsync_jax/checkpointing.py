"""Periodic async orbax checkpoints of the train state and the data position, and resume from the newest one.

  checkpointer = Checkpointer(workdir / 'checkpoints', every_steps=500)
  restored = checkpointer.restore_latest(abstract_state)   # (state, data_step) or None on a fresh workdir
  for step in ...:
    if checkpointer.due(step):
      checkpointer.save(step, state)                       # returns at once; orbax writes in the background
  checkpointer.close()                                     # waits for the last save

A checkpoint holds two items: `state` (any pytree of arrays: in training, the stacked replica train state and the
sync state, restored with the shardings of `abstract_state`) and `data` (JSON: the stream position, i.e. the
global step the next batch starts at). Orbax
writes each checkpoint into a temporary directory and renames it when complete, so a process killed mid-save
leaves the previous checkpoint as the newest complete one. In a job of several processes every process calls the
same methods at the same steps with job-wide arrays; each writes its own replicas' shards.
"""

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

PyTree = Any


class Checkpointer:
  """Owns one orbax CheckpointManager; saves every `every_steps` steps (0 = only when asked with force)."""

  def __init__(self, directory: str | pathlib.Path, every_steps: int, max_to_keep: int = 2):
    self._every_steps = every_steps
    self._manager = ocp.CheckpointManager(
        pathlib.Path(directory).absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=True,
                                             cleanup_tmp_directories=True),
        item_names=('state', 'data'),
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore_latest(self, abstract_state: PyTree) -> tuple[PyTree, int] | None:
    """The newest complete checkpoint as (state, data_step), arrays placed like `abstract_state`; None if none."""
    step = self._manager.latest_step()
    if step is None:
      return None
    try:
      restored = self._manager.restore(
          step,
          args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()),
      )
    except ValueError as error:  # Orbax's message lists tree paths; say first what went wrong and what to do.
      raise ValueError(
          f'The checkpoint at step {step} in {self._manager.directory} does not match this run (another model, '
          'sync algorithm or replica count, or an older version of the code). Use a new workdir, or delete that '
          f'checkpoint directory to start over. Orbax said: {error}') from error
    return restored.state, int(restored.data['step'])

  def due(self, step: int) -> bool:
    """Whether `step` is a periodic save point."""
    return self._every_steps > 0 and step % self._every_steps == 0

  def save(self, step: int, state: PyTree) -> bool:
    """Starts an async save of `state` as the position `step`, unless that step is saved already; True if started."""
    if step == self._manager.latest_step():
      return False
    return self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave({'step': step})),
        force=True,
    )

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def abstract_like(tree: PyTree) -> PyTree:
  """Shape, dtype and sharding of every leaf: what restore needs to place arrays like a freshly built state."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
