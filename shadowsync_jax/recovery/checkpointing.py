"""Per-process async orbax checkpoints of the train state and the stream position: no process waits for another.

  checkpointer = Checkpointer(workdir / 'checkpoints', meshes, every_steps=500)   # writes .../process_{p}/
  restored = checkpointer.restore_latest(abstract_state_L)   # (state_L, data) or None on a fresh workdir
  for step in ...:
    if checkpointer.due(step):
      checkpointer.save(step, state_L)                      # returns at once; orbax writes in the background
  checkpointer.close()                                      # waits for the last save

  # Partial recovery (CPR): read back only some leaves of a saved step, e.g. the embedding table.
  wanted = checkpointing.keep_leaves(abstract_state, lambda path: path.startswith("['train'].params['embedding']"))
  restored = checkpointer.restore_partial(step, wanted)    # the other leaves come back as checkpointing.SKIPPED

Every process checkpoints its own part (its replicas, `meshes.local`) into its own directory, at its own pace,
with no barrier and no collective (docs/design.md §7: checkpoints must not tie every process to the slowest one). Which
step each process restores after a restart is `restart_plan`'s decision; this module only saves and reads. What
it is handed is `training_state`'s (the training tree, the state a run starts from); the leaves' names and the shapes
a restore checks, `saved_shapes`'.

Memory (docs/design.md §4: no second copy of the tables). An async save reads the arrays while the training goes on;
on a CPU it reads the device buffers themselves, which the next step then cannot update in place (it copies the whole
state instead), and elsewhere it copies them to the host first. So a state above `ASYNC_SAVE_MAX_BYTES` is saved
blocking: the loop waits while it is written, straight from where it lives: its large leaves (tables and their
optimizer state) as a third item, `tables`, written and read a block of rows at a time (`row_blocks`), the rest by
orbax. A caller that restores over a state it holds releases that state first (`release`), so a restored state
never meets a second one. Arrays are written uncompressed (trained floats do not compress; zstd only costs the
writer's cores).

A checkpoint holds two items: `state` (any pytree of this process's [L, ...] arrays, restored with the shardings
of the abstract tree) and `data` (JSON: `step`, the stream position the next batch starts at, and whatever the
caller adds). Orbax writes each checkpoint into a temporary directory and renames it when complete, so a process
killed mid-save leaves its previous checkpoint as the newest complete one.

How orbax 0.12.8 writes one process's part alone (the route its own emergency checkpointing takes for host-local
storage): every barrier is skipped (`active_processes={p}`); this process writes its metadata and every shard it
holds (`primary_host=None`, `replica_id=None`); directories are created synchronously, so no signal keys go to the
coordinator's key-value store (their names have no process id: two processes would collide); and the leaves are
saved as the job-wide view of this process's arrays (orbax refuses a process-local array in a job of several
processes), so each process restores only its own directory.
"""

from collections.abc import Callable
import functools
import json
import logging
import pathlib
import shutil
import time
from typing import Any

from absl import logging as absl_logging
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint import type_handlers

from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import private_apis
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import row_blocks
from shadowsync_jax.recovery import saved_shapes

PyTree = Any

SKIPPED = ocp.PLACEHOLDER  # A leaf `restore_partial` does not read (in its argument and in what it returns).
_SHAPES = 'saved_shapes'  # The data item's key of every leaf's shape and dtype as saved (`_check_shapes`).
ASYNC_SAVE_MAX_BYTES = 256 << 20  # A larger state (this process's part) is saved blocking, without a copy.
LARGE_LEAF_BYTES = 1 << 20  # In a blocking save, leaves from this size on go by blocks of rows (`row_blocks`).


def saves_block(num_bytes: int) -> bool:
  """Whether a save of a state of `num_bytes` (this process's part) blocks: too large to be read while the training
  goes on."""
  return num_bytes > ASYNC_SAVE_MAX_BYTES


START_OVER = 'Use a new workdir, or delete that checkpoint directory to start over.'


class MismatchError(ValueError):
  """A checkpoint of another state than this run's (the shapes its save wrote down differ, or a differential's
  initial state: `incremental`): another model, algorithm, replica count, seed, or version of the code."""


class _WithoutSizeLogging(logging.Filter):
  """Orbax warns at every save that it logs no global sizes for a process saving alone: what is meant here."""

  def filter(self, record: logging.LogRecord) -> bool:
    return 'Global object size logging disabled' not in record.getMessage()


absl_logging.get_absl_logger().addFilter(_WithoutSizeLogging())


class Checkpointer:
  """This process's orbax checkpoints in `directory/process_{p}`; due every `every_steps` steps (0: when asked)."""

  def __init__(
    self,
    directory: str | pathlib.Path,
    meshes: replicas.ReplicaMeshes,
    every_steps: int = 0,
    max_to_keep: int | None = 2,
    during_save: Callable[[int], None] | None = None,
  ):
    """`during_save(step)`: called inside each save's write, before the save can complete (tests: a `--kill_at`
    kill at a save's step lands in its write, every time)."""
    self._during_save = during_save
    # Orbax's save futures look for signals in the coordinator's key-value store; a process's own saves need none,
    # and the store may be gone with a dead coordinator while a survivor saves its live state: keep them here.
    private_apis.orbax_signals_in_process()
    self._every_steps, self._meshes = every_steps, meshes
    process = jax.process_index()
    self.directory = pathlib.Path(directory).absolute() / f'process_{process}'
    self.directory.mkdir(parents=True, exist_ok=True)  # Orbax refuses to create it with `active_processes`.
    self._alone = ocp.options.MultiprocessingOptions(
      primary_host=None, active_processes={process}, barrier_sync_key_prefix=f'process_{process}'
    )
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        enable_async_checkpointing=True,
        create=False,
        cleanup_tmp_directories=True,
        multiprocessing_options=self._alone,
        async_options=ocp.options.AsyncOptions(create_directories_asynchronously=False),
      ),
      item_handlers={
        'state': self._state_handler(),
        'data': ocp.JsonCheckpointHandler(multiprocessing_options=self._alone),
        'tables': row_blocks.RowBlockHandler(),
      },
    )
    # Its removal of the saves a kill cut short runs in a thread that a process ending soon after (a restore it
    # refuses) would find shut down, printing orbax's traceback under its one line: done now (a directory's listing).
    private_apis.await_orbax_cleanup(self._manager)
    self._leaf_reader: ocp.Checkpointer | None = None  # For restore_partial, made on first use.
    self._timings: dict[str, list[float]] = {'save_blocking_s': [], 'restore_s': []}
    self._bytes_written = 0
    self.last_save: dict[str, Any] = {}  # What the newest save wrote: its kind and bytes.
    self._last_blocked = False

  def _state_handler(self) -> ocp.PyTreeCheckpointHandler:
    registry = type_handlers.create_type_handler_registry(
      (jax.Array, type_handlers.ArrayHandler(primary_host=None, replica_id=None, use_replica_parallel=False))
    )
    return ocp.PyTreeCheckpointHandler(
      use_ocdbt=True,
      use_zarr3=True,
      use_compression=False,
      multiprocessing_options=self._alone,
      type_handler_registry=registry,
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """The steps of the complete checkpoints on disk, ascending (a save being written is not one yet)."""
    return sorted(self._manager.all_steps())

  def restore(self, step: int, abstract_state: PyTree) -> tuple[PyTree, dict[str, Any]]:
    """The checkpoint at `step` as (state, data), arrays placed like `abstract_state` (this process's [L, ...])."""
    self._manager.wait_until_finished()
    self._check_shapes(step, abstract_state)
    started = time.perf_counter()
    in_blocks = self._row_block_leaves(step, abstract_state)
    abstract_job = _job_abstract(_skipping(abstract_state, in_blocks), self._meshes)
    items = {
      'state': ocp.args.PyTreeRestore(item=abstract_job, restore_args=_restore_args(abstract_job)),
      'data': ocp.args.JsonRestore(),
    }
    if in_blocks:
      items['tables'] = row_blocks.RowBlockRestore(in_blocks)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except (ValueError, KeyError, FileNotFoundError) as error:  # Orbax lists tree paths; say first what to do.
      raise ValueError(
        f'The checkpoint at step {step} in {self.directory} does not match this run (another model, sync '
        'algorithm, replica or process count, or an older version of the code). Use a new workdir, or delete '
        f'that checkpoint directory to start over. Orbax said: {error}'
      ) from error
    state = _merged(self._local(restored.state), restored.get('tables') or {})
    state = jax.block_until_ready(state)
    self._timings['restore_s'].append(time.perf_counter() - started)
    data = dict(restored.data)
    data.pop(_SHAPES, None)
    return state, data

  def restore_latest(self, abstract_state: PyTree) -> tuple[PyTree, dict[str, Any]] | None:
    """The newest complete checkpoint as (state, data); None if there is none."""
    self._manager.wait_until_finished()
    step = self._manager.latest_step()
    return None if step is None else self.restore(step, abstract_state)

  def restore_partial(self, step: int, abstract_state: PyTree) -> PyTree:
    """The leaves of the checkpoint at `step` that `abstract_state` describes, read without the others.

    `abstract_state` has the saved tree's whole structure, with `SKIPPED` at the leaves not wanted (`keep_leaves`
    builds it); the result has that structure too, arrays placed like their abstract leaves and `SKIPPED` where
    nothing was read. Pending async saves are waited for first, so a step saved a moment ago can be read.
    """
    self._manager.wait_until_finished()
    if step not in self._manager.all_steps():
      raise ValueError(
        f'There is no complete checkpoint at step {step} in {self.directory} (complete: {self.all_steps()}).'
      )
    in_blocks = self._row_block_leaves(step, abstract_state)
    abstract_job = _job_abstract(_skipping(abstract_state, in_blocks), self._meshes)
    if self._leaf_reader is None:
      self._leaf_reader = ocp.Checkpointer(self._state_handler(), multiprocessing_options=self._alone)
    restored = self._leaf_reader.restore(
      self.directory / str(step) / 'state',
      args=ocp.args.PyTreeRestore(item=abstract_job, restore_args=_restore_args(abstract_job)),
    )
    tables = row_blocks.RowBlockHandler().restore(self._item(step, 'tables'), row_blocks.RowBlockRestore(in_blocks))
    return _merged(self._local(restored), tables)

  def _check_shapes(self, step: int, abstract_state: PyTree) -> None:
    """Raises `MismatchError` where a leaf saved at `step` has another shape or dtype than `abstract_state`'s
    (orbax restores into other shapes by cutting or padding: a run with narrower tables would go on silently)."""
    try:
      saved = json.loads((self._item(step, 'data') / 'metadata').read_text()).get(_SHAPES)
    except (OSError, ValueError):
      return  # Orbax's restore says what is wrong with the checkpoint.
    if saved is None:
      return
    differ = saved_shapes.shape_difference(saved, saved_shapes.leaf_shapes(abstract_state))
    if differ is not None:
      raise MismatchError(
        f'The checkpoint at step {step} in {self.directory} does not match this run: {differ} (another model, sync '
        f'algorithm, replica or process count, or an older version of the code). {START_OVER}'
      )

  def _local(self, restored_job: PyTree) -> PyTree:
    return jax.tree.map(
      lambda x: x if x is SKIPPED else replicas.to_local(x, self._meshes), restored_job, is_leaf=lambda x: x is SKIPPED
    )

  def _item(self, step: int, item: str) -> pathlib.Path:
    return self.directory / str(step) / item

  def _row_block_leaves(self, step: int, abstract_state: PyTree) -> dict[str, Any]:
    """{name: abstract leaf} of the wanted leaves the checkpoint at `step` holds in its `tables` item."""
    directory = self._item(step, 'tables')
    saved = {path.name for path in directory.iterdir()} if directory.is_dir() else set()
    flat = jax.tree_util.tree_flatten_with_path(abstract_state, is_leaf=lambda x: x is SKIPPED)[0]
    return {
      saved_shapes.leaf_name(path): leaf
      for path, leaf in flat
      if leaf is not SKIPPED and saved_shapes.leaf_name(path) in saved
    }

  def due(self, step: int) -> bool:
    """Whether `step` is a periodic save point."""
    return self._every_steps > 0 and step % self._every_steps == 0

  def boundaries(self, start_step: int, stop_step: int) -> list[int]:
    """The periodic save points after `start_step` and before `stop_step`, then `stop_step`: where a loop that
    must stop to save (drain its workers) stops."""
    return [step for step in range(start_step + 1, stop_step) if self.due(step)] + [stop_step]

  def save(self, step: int, state: PyTree, **data: Any) -> bool:
    """Saves this process's `state` as the position `step` (with `data` beside it in the JSON item), unless that
    step is saved already; True if started. Async (returns at once) up to `ASYNC_SAVE_MAX_BYTES`, blocking beyond
    (module docstring)."""
    if step in self._manager.all_steps():
      return False
    num_bytes = memory.state_bytes(state)
    self._last_blocked = saves_block(num_bytes)
    in_blocks = _large_leaves(state) if self._last_blocked else {}
    # Of every leaf as saved: a restore into other shapes is refused (orbax cuts them).
    shapes = saved_shapes.leaf_shapes(state)
    if in_blocks:  # A byte a device where a leaf went to the `tables` item (orbax saves arrays only, here).
      num_local = self._meshes.local.shape[replicas.REPLICA_AXIS]
      sharding = replicas.replica_sharding(self._meshes.local)
      stand_in = jax.jit(lambda: jnp.zeros(num_local, jnp.int8), out_shardings=sharding)()
      state = _standing_in(state, in_blocks, stand_in)
    items = {
      'state': ocp.args.PyTreeSave(replicas.to_job(state, self._meshes)),
      'data': ocp.args.JsonSave({'step': step, **data, _SHAPES: shapes}),
    }
    if in_blocks or self._during_save is not None:
      during = None if self._during_save is None else functools.partial(self._during_save, step)
      items['tables'] = row_blocks.RowBlockSave(in_blocks, during)
    started_s = time.perf_counter()
    started = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    if started and self._last_blocked:
      self._manager.wait_until_finished()
    if started:
      self._timings['save_blocking_s'].append(time.perf_counter() - started_s)
      self._bytes_written += num_bytes
      self.last_save = {'kind': 'whole', 'bytes': num_bytes}
    return started

  def stats(self) -> dict[str, Any]:
    """What this process's saves and full restores cost: their count, the mean seconds a save held the caller (the
    whole write for a blocking save; the start of an async one) and a restore took; None where there was none."""
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    saves, restores = self._timings['save_blocking_s'], self._timings['restore_s']
    return {
      'saves': len(saves),
      'save_blocking_s': mean(saves),
      'saves_block': bool(saves) and self._last_blocked,
      'restores': len(restores),
      'restore_s': mean(restores),
      # As `incremental.IncrementalCheckpointer` reports them: every save here is a whole one.
      'checkpoint_saves': len(saves),
      'checkpoint_baselines': len(saves),
      'checkpoint_bytes_written': self._bytes_written,
      'checkpoint_blocked_s': sum(saves),
      'incremental': False,
    }

  @staticmethod
  def blocks(state: PyTree) -> bool:
    """Whether a save of `state` blocks (`saves_block`)."""
    return saves_block(memory.state_bytes(state))

  def delete(self, steps: list[int]) -> None:
    """Deletes the checkpoints of `steps` (those on disk)."""
    self._manager.wait_until_finished()
    on_disk = set(self._manager.all_steps())
    for step in steps:
      if step in on_disk:
        self._manager.delete(step)

  def delete_after(self, step: int) -> list[int]:
    """Deletes the checkpoints newer than `step` (a timeline abandoned by a full recovery); returns their steps."""
    self._manager.wait_until_finished()
    newer = [s for s in self._manager.all_steps() if s > step]
    for s in newer:
      self._manager.delete(s)
    return newer

  def delete_before(self, step: int) -> None:
    """Deletes the checkpoints older than `step` but the newest (those no restart plan can still choose), without
    waiting for a save being written (it is newer: `step` is at most the save before it; the wait held the loop
    for every save's write, uncounted: at the default size, saves every ~0.2 s, a third of the steps' time)."""
    steps = self.all_steps()
    for s in steps[:-1]:
      if s < step:
        self._manager.delete(s)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def saving(self) -> bool:
    """Whether a save is still being written (cheap: call it every step)."""
    return self._manager.is_saving_in_progress()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
    if self._leaf_reader is not None:
      self._leaf_reader.close()

  def remove(self) -> None:
    """Closes and deletes this process's directory (a live state, once it was restored)."""
    self.close()
    shutil.rmtree(self.directory, ignore_errors=True)


def _large_leaves(state: PyTree) -> dict[str, jax.Array]:
  """{name: leaf} of the leaves of this process's state that go by blocks of rows."""
  flat = jax.tree_util.tree_flatten_with_path(state)[0]
  return {
    saved_shapes.leaf_name(path): leaf
    for path, leaf in flat
    if getattr(leaf, 'ndim', 0) >= 2 and memory.state_bytes(leaf) >= LARGE_LEAF_BYTES
  }


def _standing_in(tree: PyTree, names: dict[str, Any], stand_in: jax.Array) -> PyTree:
  return jax.tree_util.tree_map_with_path(
    lambda path, x: stand_in if saved_shapes.leaf_name(path) in names else x, tree
  )


def _skipping(abstract: PyTree, names: dict[str, Any]) -> PyTree:
  return jax.tree_util.tree_map_with_path(
    lambda path, x: SKIPPED if saved_shapes.leaf_name(path) in names else x, abstract, is_leaf=lambda x: x is SKIPPED
  )


def _merged(tree: PyTree, by_name: dict[str, jax.Array]) -> PyTree:
  """`tree` with the leaves named in `by_name` taken from there."""
  return jax.tree_util.tree_map_with_path(
    lambda path, x: by_name.get(saved_shapes.leaf_name(path), x), tree, is_leaf=lambda x: x is SKIPPED
  )


def release(tree: PyTree) -> None:
  """Frees the device buffers of `tree` (which must not be used again): a state a restore is about to replace, so
  that the two never coexist."""
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf, jax.Array) and not leaf.is_deleted():
      leaf.delete()


def keep_leaves(abstract_state: PyTree, keep: Callable[[str], bool]) -> PyTree:
  """`abstract_state` with `SKIPPED` at every leaf whose path (as `jax.tree_util.keystr` writes it, e.g.
  "['train'].params['embedding']") `keep` rejects: the argument of `Checkpointer.restore_partial`."""
  return jax.tree_util.tree_map_with_path(
    lambda path, leaf: leaf if keep(jax.tree_util.keystr(path)) else SKIPPED, abstract_state
  )


def _job_abstract(abstract_L: PyTree, meshes: replicas.ReplicaMeshes) -> PyTree:
  """The job-wide view of this process's abstract [L, ...] leaves (`SKIPPED` stays)."""
  if meshes.job is meshes.local:
    return abstract_L
  sharding, num_processes = replicas.replica_sharding(meshes.job), jax.process_count()

  def one(x):
    if x is SKIPPED:
      return x
    return jax.ShapeDtypeStruct((x.shape[0] * num_processes, *x.shape[1:]), x.dtype, sharding=sharding)

  return jax.tree.map(one, abstract_L, is_leaf=lambda x: x is SKIPPED)


def _restore_args(abstract: PyTree) -> PyTree:
  return jax.tree.map(
    lambda x: (
      ocp.RestoreArgs()
      if x is SKIPPED
      else ocp.ArrayRestoreArgs(sharding=x.sharding, global_shape=x.shape, dtype=x.dtype)
    ),
    abstract,
    is_leaf=lambda x: x is SKIPPED,
  )
