"""Periodic async orbax checkpoints of the train state and the data position, and resume from the newest one.

  checkpointer = Checkpointer(workdir / 'checkpoints', every_steps=500)
  restored = checkpointer.restore_latest(abstract_state)   # (state, data_step) or None on a fresh workdir
  for step in ...:
    if checkpointer.due(step):
      checkpointer.save(step, state)                       # returns at once; orbax writes in the background
  checkpointer.close()                                     # waits for the last save

  # Partial recovery (CPR): read back only some leaves of a saved step, e.g. the embedding table.
  wanted = checkpointing.keep_leaves(abstract_state, lambda path: path.startswith("['train'].params['embedding']"))
  restored = checkpointer.restore_partial(step, wanted)    # the other leaves come back as checkpointing.SKIPPED

A checkpoint holds two items: `state` (any pytree of arrays: in training, the stacked replica train state and the
sync state, restored with the shardings of `abstract_state`) and `data` (JSON: the stream position, i.e. the
global step the next batch starts at). Orbax
writes each checkpoint into a temporary directory and renames it when complete, so a process killed mid-save
leaves the previous checkpoint as the newest complete one. In a job of several processes every process calls the
same methods at the same steps with job-wide arrays; each writes its own replicas' shards.
"""

from collections.abc import Callable
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

PyTree = Any

SKIPPED = ocp.PLACEHOLDER  # A leaf `restore_partial` does not read (in its argument and in what it returns).


class Checkpointer:
  """Owns one orbax CheckpointManager; saves every `every_steps` steps (0 = only when asked with force)."""

  def __init__(self, directory: str | pathlib.Path, every_steps: int, max_to_keep: int = 2):
    self._every_steps = every_steps
    self._manager = ocp.CheckpointManager(
      pathlib.Path(directory).absolute(),
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=True, cleanup_tmp_directories=True
      ),
      item_names=('state', 'data'),
    )
    self._leaf_reader: ocp.Checkpointer | None = None  # For restore_partial, made on first use.

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore_latest(self, abstract_state: PyTree) -> tuple[PyTree, int] | None:
    """The newest complete checkpoint as (state, data_step), arrays placed like `abstract_state`; None if none."""
    self._manager.wait_until_finished()  # A save still being written is not a checkpoint yet.
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
        f'checkpoint directory to start over. Orbax said: {error}'
      ) from error
    return restored.state, int(restored.data['step'])

  def restore_partial(self, step: int, abstract_state: PyTree) -> PyTree:
    """The leaves of the checkpoint at `step` that `abstract_state` describes, read without the others.

    `abstract_state` has the saved tree's whole structure, with `SKIPPED` at the leaves not wanted (`keep_leaves`
    builds it); the result has that structure too, arrays placed like their abstract leaves and `SKIPPED` where
    nothing was read. Pending async saves are waited for first, so a step saved a moment ago can be read.
    """
    self._manager.wait_until_finished()
    if step not in self._manager.all_steps():
      raise ValueError(
        f'There is no complete checkpoint at step {step} in {self._manager.directory} (complete: '
        f'{sorted(self._manager.all_steps())}).'
      )
    # The manager that saved the item with StandardSave refuses PyTreeRestore for it (orbax 0.12.8); a
    # checkpointer on the item's directory accepts SKIPPED leaves and reads only the others.
    restore_args = jax.tree.map(
      lambda x: (
        ocp.RestoreArgs()
        if x is SKIPPED
        else ocp.ArrayRestoreArgs(sharding=x.sharding, global_shape=x.shape, dtype=x.dtype)
      ),
      abstract_state,
      is_leaf=lambda x: x is SKIPPED,
    )
    if self._leaf_reader is None:
      self._leaf_reader = ocp.PyTreeCheckpointer()
    return self._leaf_reader.restore(
      self._manager.directory / str(step) / 'state',
      args=ocp.args.PyTreeRestore(item=abstract_state, restore_args=restore_args),
    )

  def all_steps(self) -> list[int]:
    """The steps of the complete checkpoints on disk, ascending."""
    return sorted(self._manager.all_steps())

  def due(self, step: int) -> bool:
    """Whether `step` is a periodic save point."""
    return self._every_steps > 0 and step % self._every_steps == 0

  def boundaries(self, start_step: int, stop_step: int) -> list[int]:
    """The periodic save points after `start_step` and before `stop_step`, then `stop_step`: where a loop that
    must stop to save (drain its workers) stops."""
    return [step for step in range(start_step + 1, stop_step) if self.due(step)] + [stop_step]

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
    if self._leaf_reader is not None:
      self._leaf_reader.close()


def keep_leaves(abstract_state: PyTree, keep: Callable[[str], bool]) -> PyTree:
  """`abstract_state` with `SKIPPED` at every leaf whose path (as `jax.tree_util.keystr` writes it, e.g.
  "['train'].params['embedding']") `keep` rejects: the argument of `Checkpointer.restore_partial`."""
  return jax.tree_util.tree_map_with_path(
    lambda path, leaf: leaf if keep(jax.tree_util.keystr(path)) else SKIPPED, abstract_state
  )


def training_tree(state_R: PyTree, sync_state_R: PyTree) -> dict[str, PyTree]:
  """What a training checkpoint's `state` item holds: the job's train state and, for round-based sync, its state."""
  return {'train': state_R} if sync_state_R is None else {'train': state_R, 'sync': sync_state_R}


def abstract_like(tree: PyTree) -> PyTree:
  """Shape, dtype and sharding of every leaf: what restore needs to place arrays like a freshly built state."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
