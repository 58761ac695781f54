"""What a surviving process keeps when a peer dies: its train state as of its last step, saved before it exits.

  keeper = live_state.LiveKeeper(workdir / 'live' / f'process_{p}')
  keeper.every_steps = 49             # copies no closer than this (`intervals.survivor_copy_interval`)
  keeper.covered(step)                # a checkpoint of `step` was saved: a copy as good as any
  keeper.at_boundary(step, lambda: tree_L)   # every `every_s` at most: a device copy, to the host in the background
  keeper.save(step, tree_L)           # at a step boundary (the training thread): exactly this state
  keeper.save_latest()                # from any thread: the newest host copy (the devices may be stuck)
  keeper.steps()                      # the steps saved on disk; keeper.restore(step, abstract_L) -> tree_L
  keeper.use_differentials(checkpointer)   # with incremental checkpoints: the rows changed since their baseline

A survivor learns of a dead peer at a step boundary (`distributed.peer_lost`), and saves that step's state. But a
collective whose partner died can block its devices for good (gloo may wait out its own timeout of many minutes):
the training thread then never reaches a boundary, and its state, donated to the step that waits behind the
collective, exists nowhere. So a copy of the state goes to host memory every `every_s` seconds (a jitted copy on
the device, dispatched between steps, so the donated state is not touched; then `device_get` in a thread of its
own), and whichever thread ends the process writes the newest one. The file is written with numpy, not orbax, so
that saving needs nothing of the devices or the coordinator: `DIRECTORY/<step>.npz` (a temporary file renamed
when complete), the leaves by their tree paths.

A copy is taken only where the survivor's newest copy of its state is `every_steps` old: a checkpoint counts (the
restart plan restores whichever is newer, and a survivor that exits waits for the checkpoint being written), so
where the checkpoint interval already holds the survivors' expected loss under `recovery.target_pls`
(`intervals.survivor_copy_interval`: two processes), no copy is taken between checkpoints. (Copies at their cost
budget alone, 0.05 of the time, cost a partial-recovery run at Criteo Kaggle's size 7-16 s of its ~180, more than
the work full recovery trains again, to save survivors 0-32 steps a failure that the checkpoints' interval already
allowed.)

With incremental checkpoints (`use_differentials`) a copy is a differential over the checkpoints' baseline instead
(`incremental.IncrementalCheckpointer.take`: the rows stamped since it, gathered on the device, and the dense
leaves), and a restore lays it over that baseline, read or rebuilt. At Criteo Kaggle's size that is tens of MB a
process rather than 1.1 GB, written in a fraction of a second when the process must stop (the whole state took
seconds of its restart). A take finds the changed rows from the stamps on the host (it waits for the block in
flight: where the job's steps are collectives, the loop waited already) and gathers them on the devices; each is
timed, its compile left out, and copies come no more often than `max_overhead` of the time allows (at most every
`LEAST_S`); `spent_s` adds up what they cost the training core, compiles included (`recovery.overhead`). (XLA's
`nonzero` on the devices took ~0.3 s of a process's one core at Criteo Kaggle's size, 16.9M rows, and a program
for each size the changes grew through, 0.5-2 s each; the host's scan takes tens of ms.)
"""

from collections.abc import Callable
import pathlib
import queue
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shadowsync_jax.parallel import compilation_cache
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import differentials
from shadowsync_jax.recovery import incremental
from shadowsync_jax.recovery import saved_shapes

PyTree = Any


@jax.jit
def _copy(tree: PyTree) -> PyTree:
  return jax.tree.map(jnp.copy, tree)


class LiveKeeper:
  """This process's live state: host copies in memory, and the one written when the process must stop."""

  def __init__(self, directory: str | pathlib.Path, every_s: float = 1.0, max_overhead: float = 0.05):
    """`every_s`: seconds between whole copies (`pace_for` sets it by their size); `max_overhead`: the share of
    the time differentials' takes may cost (`use_differentials`)."""
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self._every_s = every_s
    self._max_overhead = max_overhead
    self._last_copy = -float('inf')
    self._latest: tuple[int, dict[str, np.ndarray]] | None = None  # (step, host leaves by path)
    self._lock = threading.Lock()
    self._copies: queue.Queue = queue.Queue(maxsize=1)
    self.every_steps: int | None = None  # Steps between the newest copy (or checkpoint) and a new copy, at least.
    self._newest_step = -1  # Of the newest copy of the state: a host copy taken, a checkpoint saved, the start.
    self._differentials: incremental.IncrementalCheckpointer | None = None
    self._take_s = 0.0  # What the newest take cost, its compile left out.
    self.spent_s = 0.0  # What the takes cost the training core, compiles included (not the block they waited for).
    threading.Thread(target=self._to_host, name='live-state', daemon=True).start()

  def use_differentials(self, checkpointer: incremental.IncrementalCheckpointer) -> None:
    """Copies (and saves) differentials over `checkpointer`'s baseline, not the whole state (module docstring)."""
    self._differentials = checkpointer
    self._every_s = LEAST_S  # Then as the copies' size allows (`_to_host`).

  def pace_for(self, tree: PyTree) -> float:
    """Copies as often as `COPY_BYTES_PER_S` of copying allows for `tree`'s size (differentials: for the size of
    the newest copy), at most every `LEAST_S`; returns the interval."""
    if self._differentials is None:
      self._every_s = _pace(sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree)))
    return self._every_s

  def covered(self, step: int) -> None:
    """The state of `step` is on disk or being written there (a checkpoint, the state this start restored): a copy
    as good as a host copy, for the pace (`every_steps`)."""
    self._newest_step = max(self._newest_step, step)

  def at_boundary(self, step: int, tree: Callable[[], PyTree]) -> None:
    """At a block boundary: starts a host copy of `tree()` if the newest copy is `every_s` and `every_steps` old
    (never waits for one)."""
    if self.every_steps is not None and step - self._newest_step < self.every_steps:
      return
    now = time.monotonic()
    if now - self._last_copy < self._every_s or self._copies.full():
      return
    self._last_copy = now
    if self._differentials is None:
      self._copies.put_nowait((step, _copy(tree())))
    else:
      taken = self._take(step, tree())
      if taken is None:  # No complete baseline yet; the next boundary tries again.
        return
      self._copies.put_nowait(taken)
    self.covered(step)

  def _take(self, step: int, tree: PyTree) -> differentials.TakenDifferential | None:
    """A differential of `tree` taken now, after the block in flight (a stall, where the loop had not waited for it
    already), timed: its time without its compile sets the pace (`max_overhead`)."""
    jax.block_until_ready(tree)
    started = time.perf_counter()
    with compilation_cache.compiling() as compiled:
      taken = self._differentials.take(step, tree)
    spent = time.perf_counter() - started
    self.spent_s += spent
    self._take_s = max(0.0, spent - compiled.seconds)
    return taken

  def save(self, step: int, tree: PyTree) -> int:
    """Writes `tree` (ready to read: the training thread at a step boundary); returns its step."""
    leaves = self._differentials.read_differential(step, tree) if self._differentials is not None else None
    self._write(step, leaves if leaves is not None else _flatten(jax.device_get(tree)))
    return step

  def save_latest(self) -> int | None:
    """Writes the newest host copy, whatever the devices are doing; returns its step (None: there was none)."""
    with self._lock:
      latest = self._latest
    if latest is None:
      return None
    self._write(*latest)
    return latest[0]

  def steps(self) -> list[int]:
    return sorted(int(path.name.removesuffix('.npz')) for path in self.directory.glob('*.npz'))

  def restore(self, step: int, abstract: PyTree) -> PyTree:
    """The state saved at `step`, placed like `abstract` (ShapeDtypeStructs with shardings): a differential over
    its baseline (`use_differentials` first), or the whole state."""
    with np.load(self.directory / f'{step}.npz') as saved:
      if 'meta' in saved.files:
        if self._differentials is None:
          raise ValueError(f'{self.directory}/{step}.npz is a differential: its baseline is in the checkpoints.')
        return self._differentials.compose(saved, abstract)[0]
      leaves = {name: saved[name] for name in saved.files}
    paths, structure = jax.tree_util.tree_flatten_with_path(abstract)
    differ = saved_shapes.shape_difference(
      {name: saved_shapes.shape_of(x) for name, x in leaves.items()},
      {jax.tree_util.keystr(path): saved_shapes.shape_of(leaf) for path, leaf in paths},
    )
    if differ is not None:
      raise checkpointing.MismatchError(
        f'The live state of step {step} in {self.directory} does not match this run: {differ}. '
        f'{checkpointing.START_OVER}'
      )
    return jax.tree.unflatten(
      structure, [jax.device_put(leaves[jax.tree_util.keystr(path)], leaf.sharding) for path, leaf in paths]
    )

  def delete(self) -> None:
    for path in self.directory.glob('*.npz'):
      path.unlink()

  def _to_host(self) -> None:
    while True:
      copy = self._copies.get()
      if isinstance(copy, differentials.TakenDifferential):
        step, host = copy.step, differentials.file_leaves(copy)
        self._differentials.hold(copy.baseline)  # Kept on disk while this copy may be written.
        self._every_s = max(_pace(sum(leaf.nbytes for leaf in host.values())), self._take_s / self._max_overhead)
      else:
        step, host = copy[0], _flatten(jax.device_get(copy[1]))
      with self._lock:
        self._latest = (step, host)

  def _write(self, step: int, leaves: dict[str, np.ndarray]) -> None:
    path = self.directory / f'{step}.npz'
    temporary = path.with_suffix('.npz.tmp')
    with open(temporary, 'wb') as file:
      np.savez(file, **leaves)
    temporary.replace(path)
    for old in self.steps():
      if old != step:
        (self.directory / f'{old}.npz').unlink(missing_ok=True)


COPY_BYTES_PER_S = 1e8  # About 1% of one core's memory bandwidth.
LEAST_S = 0.1


def _pace(num_bytes: int, bytes_per_s: float = COPY_BYTES_PER_S) -> float:
  """Seconds between copies of `num_bytes`."""
  return max(LEAST_S, num_bytes / bytes_per_s)


def _flatten(tree: PyTree) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
