"""Checkpoints that cost what changed: a full baseline now and then, between them the rows changed since it.

  checkpointer = incremental.IncrementalCheckpointer(
      checkpointing.Checkpointer(workdir / 'checkpoints', meshes, max_to_keep=None), meshes, rebaseline_fraction=0.5,
      initial=build_tree_L)                          # the state at step 0, rebuilt exactly: the first baseline
  checkpointer.save(step, tree_L)                    # a differential (in the background), or a baseline once the
                                                     # rows changed since the last are half the table rows
  tree_L, data = checkpointer.restore(step, abstract_L)   # its baseline, then its differential over it
  checkpointer.all_steps(); checkpointer.delete_before(step); checkpointer.delete_after(step)   # as `Checkpointer`

Check-N-Run (Eisenman et al., NSDI 2022) writes only the embedding rows modified since the last baseline, and a new
baseline from time to time (its "intermittent differential" checkpoints); Monolith,
PERSIA and TorchRec's `ModelDeltaTracker` track touched rows the same way. Here the train state says which rows
changed: `row_steps` stamps every row the optimizer writes with the step count after it (`model.step`), so the
rows changed since a baseline of step b are those stamped after b, exactly, on whichever device holds them
(a replica's table, a shared copy, a shard of a sharded table). Rows are changed by the steps only where no sync
round rewrites tables (`modes.incremental_why_not`).

A baseline is `checkpointing.Checkpointer`'s save of the whole state (blocking above its async limit), but the first:
the state the job started from (`INITIAL`, step 0), which `initial()` rebuilds bit for bit from the config's seed, is
a baseline that costs nothing to write and is built, not read, by a restore (at Criteo Kaggle's size a process's
first save was a 4-5 s blocking write of 1.1 GB, and building its tables takes ~0.8 s against ~2.3 s to read them);
without `initial` the first save is a written baseline. A
differential of step s holds everything but the row leaves (the MLP, its optimizer, counters, sync state: small),
and for each local device the rows stamped after its baseline b with their values in every row leaf (the table,
the optimizer's per-row state, the stamps): `<checkpoints>/differentials/process_<p>/<s>_<b>.npz`. The training
thread reads the stamps, gathers the changed rows into new buffers and copies the dense leaves on the device
(dispatched, so the next step may update the state in place); a thread of its own copies them to the host and
writes the file (a temporary file, fsynced and renamed: a process killed mid-write leaves no differential). A
restore reads the baseline, then one differential over it (never a chain): bit for bit the state that was saved.
A differential is started only once its baseline is complete on disk. A restore refuses
(`checkpointing.MismatchError`) what it could not restore exactly: a differential writes down every leaf's shape and
dtype, and over the initial state a checksum of each of its leaves (`differentials.fingerprint`: of 2^16 of its rows at
most); a
run of other shapes, or whose rebuilt initial state differs (another seed, cardinalities, initializer or version of
the code), is told so in one line, with the settings that differ from the saving run's, before anything is laid
over it.

Retention: a differential needs its baseline, so deleting a checkpoint never deletes a baseline that a kept
differential names; `keep` (None: all) keeps the newest complete checkpoints and what they need, also across
restarts (the directory is read at start; a temporary file left by a kill is removed).
"""

from collections.abc import Callable, Mapping
from concurrent import futures
import json
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import differentials
from shadowsync_jax.recovery import modes
from shadowsync_jax.recovery import saved_shapes

PyTree = Any
INITIAL = 0  # The baseline of the state the job started from (`initial`): never written, rebuilt.


def enabled(config: ml_collections.ConfigDict, saves_block: bool) -> bool:
  """`recovery.incremental` for a run: 'auto' is on where it applies (`modes.incremental_why_not`) and a whole
  save would block the loop (`saves_block`: `checkpointing.saves_block` of this process's state, or
  emulated save costs); true and false as given."""
  setting = modes.incremental_setting(config.recovery.incremental)
  if setting == 'auto':
    sync = config.sync
    return saves_block and not modes.incremental_why_not(
      sync.algorithm, sync.embedding_placement, config.num_replicas, sync.what
    )
  return bool(setting)


class IncrementalCheckpointer:
  """Baselines through `full` (a `checkpointing.Checkpointer` that keeps everything: retention is decided here),
  differentials beside them (module docstring)."""

  def __init__(
    self,
    full: checkpointing.Checkpointer,
    meshes: replicas.ReplicaMeshes,
    rebaseline_fraction: float = 0.5,
    keep: int | None = None,
    initial: Callable[[], PyTree] | None = None,
    settings: Mapping[str, Any] | None = None,
    during_write: Callable[[int], None] | None = None,
  ):
    """`settings`: the run's settings ({dotted key: JSON value}), written with each differential so that a restore
    it refuses can name those that differ. `during_write(step)`: called with the differential of `step` written and
    not yet complete, as `checkpointing.Checkpointer`'s `during_save` is inside a whole save (tests: kills that land
    in a save's write)."""
    self._full, self._meshes, self._initial = full, meshes, initial
    self._during_write = during_write
    self._settings = dict(settings or {})
    self._initial_sums: dict[str, int] | None = (
      None  # `differentials.fingerprint` of the initial state (`note_initial`).
    )
    self._rebaseline_fraction, self._keep = rebaseline_fraction, keep
    self.directory = full.directory
    self._differentials = full.directory.parent / 'differentials' / full.directory.name
    self._differentials.mkdir(parents=True, exist_ok=True)
    for stale in self._differentials.glob('*.tmp'):
      stale.unlink()  # A differential a kill cut short: never complete, never read.
    self._writer = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix='differential-writer')
    self._pending: futures.Future | None = None
    self._held: int | None = None  # A baseline a live differential names (`hold`).
    self._baseline: int | None = max(self._full.all_steps(), default=self._first_baseline())
    self._counts = {'saves': 0, 'baselines': 0, 'differentials': 0, 'bytes_written': 0, 'rows_written': 0}
    self._blocked_s = 0.0
    self._restores_s: list[float] = []  # Each restore whole, a baseline's or a differential's over its baseline.
    self.last_save: dict[str, Any] = {}  # What the newest save wrote: its kind, bytes and rows (a differential's
    # bytes as its arrays count them, before the file is written).

  # What is on disk.

  def _differential_steps(self) -> dict[int, int]:
    """{step: its baseline's step} of the complete differentials."""
    found = {}
    for path in self._differentials.glob('*.npz'):
      step, baseline = path.name.removesuffix('.npz').split('_')
      found[int(step)] = int(baseline)
    return found

  def all_steps(self) -> list[int]:
    """The steps of the complete checkpoints, baselines and differentials, ascending."""
    return sorted(set(self._full.all_steps()) | set(self._differential_steps()))

  def latest_step(self) -> int | None:
    return max(self.all_steps(), default=None)

  def baseline_of(self, step: int) -> int:
    return self._differential_steps().get(step, step)

  def _first_baseline(self) -> int | None:
    """The baseline before any is written: the initial state where it can be rebuilt, else none."""
    return INITIAL if self._initial is not None else None

  def _has_baseline(self) -> bool:
    """Whether the baseline a differential would name is complete: written, or the initial state."""
    if self._baseline is None:
      return False
    return self._baseline in self._full.all_steps() or (self._baseline == INITIAL and self._initial is not None)

  # Saves.

  def save(self, step: int, tree: PyTree, **data: Any) -> bool:
    """A baseline (the first save without `initial`; or once the rows changed since the last baseline are
    `rebaseline_fraction` of this process's table rows) or a differential of this process's `tree` at `step`; False
    if `step` is saved already.

    The rule weighs the one differential a restore reads, not the sum the differentials wrote: a baseline blocks
    the loop (no second copy of the tables) and a differential is written in the background, so what a run pays for
    a late baseline is a bigger restore (the tables read at most 1 + `rebaseline_fraction` times) and background
    bytes. Summing the bytes written (the rule until 2026-11-28) rebaselined every partial-recovery run of the Criteo
    Kaggle study: 4.3-5.3 s blocked a process, about a third of their checkpoint-related overhead."""
    if step in self.all_steps():
      return False
    started = time.perf_counter()
    self._finish_writing()
    self._prune()
    if self._baseline is not None and self._full.saving():
      self._full.wait()  # A differential needs its baseline complete on disk.
    rows, dense = differentials.row_and_dense_leaves(tree)
    stamps = dict(rows)[differentials.STAMPS]
    whole_bytes, changed = memory.state_bytes(tree), None
    if self._has_baseline():
      changed = self._changed_on_host(stamps)
      row_bytes = sum(x.dtype.itemsize * int(np.prod(x.shape[2:])) for _, x in rows) + np.int32().itemsize
      differential_bytes = sum(len(c) for c in changed) * row_bytes + memory.state_bytes([x for _, x in dense])
      if sum(len(c) for c in changed) >= self._rebaseline_fraction * np.prod(stamps.shape):
        changed = None  # The rows changed since the baseline: that share of the tables' rows.
    if changed is None:
      saved = self._full.save(step, tree, **data)
      self._baseline = step
      self.last_save = {'kind': 'baseline', 'bytes': whole_bytes, 'rows': int(np.prod(stamps.shape))}
      self._account('baseline', self.last_save['bytes'], self.last_save['rows'])
    else:
      saved = self._save_differential(step, rows, dense, changed, data)
      self.last_save = {'kind': 'differential', 'bytes': differential_bytes, 'rows': sum(len(c) for c in changed)}
    self._blocked_s += time.perf_counter() - started
    return saved

  def _save_differential(
    self, step: int, rows: list, dense: list, changed: list[np.ndarray], data: dict[str, Any]
  ) -> bool:
    """Gathers the `changed` rows of each device out of the row leaves `rows` ([(path, leaf)]) and copies the
    `dense` ones, on the device; hands them to the writer."""
    taken = self._gathered(step, rows, dense, changed, data)
    meta = differentials.meta_of(step, self._baseline, changed, data, taken.identity)
    self._pending = self._writer.submit(self._write, meta, changed, taken.rows, taken.dense)
    return True

  def _gathered(
    self, step: int, rows: list, dense: list, changed: list[np.ndarray], data: dict[str, Any]
  ) -> differentials.TakenDifferential:
    """The `changed` rows of each device gathered out of the row leaves `rows` ([(path, leaf)]) and the `dense`
    leaves copied, on the devices, waited for: they have nothing else to do (the state was waited for), so their
    time is the save's, not the steps' after it. One padded size a power of two: few programs to compile."""
    counts, num_rows = [len(c) for c in changed], rows[0][1].shape[1]
    ids_LxM = np.full((len(changed), differentials.bucket(max(counts))), num_rows, np.int32)
    for local, ids in enumerate(changed):
      ids_LxM[local, : len(ids)] = ids
    sharding = replicas.replica_sharding(self._meshes.local)
    values = differentials.gather([x for _, x in rows], jax.device_put(ids_LxM, sharding))
    copied = differentials.copy_tree(dict(dense))
    jax.block_until_ready((values, copied))
    row_values = dict(zip([path for path, _ in rows], values))
    return differentials.TakenDifferential(
      step, self._baseline, changed, row_values, copied, data, self._identity(rows + dense)
    )

  def take(self, step: int, tree: PyTree, **data: Any) -> differentials.TakenDifferential | None:
    """This process's `tree` at `step` as a differential over the current baseline, gathered on the devices (its
    rows found from the stamps on the host, which waits for them); None where there is no complete baseline yet.
    A survivor's live state (`live_state`) is kept this way."""
    if not self._has_baseline():
      return None
    rows, dense = differentials.row_and_dense_leaves(tree)
    return self._gathered(step, rows, dense, self._changed_on_host(dict(rows)[differentials.STAMPS]), data)

  def read_differential(self, step: int, tree: PyTree, **data: Any) -> dict[str, np.ndarray] | None:
    """This process's `tree` at `step` as a differential's arrays over the current baseline, read from the devices'
    buffers without running anything on them (a survivor's last act, its devices maybe failed in a collective);
    None where there is no complete baseline yet."""
    if not self._has_baseline():
      return None
    rows, dense = differentials.row_and_dense_leaves(tree)
    changed = self._changed_on_host(dict(rows)[differentials.STAMPS])
    values = {path: [x_V[ids] for x_V, ids in zip(differentials.device_rows(x), changed)] for path, x in rows}
    meta = differentials.meta_of(step, self._baseline, changed, data, self._identity(rows + dense))
    return differentials.file_arrays(meta, changed, values, jax.device_get(dict(dense)))

  def _changed_on_host(self, stamps_LxV: jax.Array) -> list[np.ndarray]:
    """Each local device's rows stamped after the baseline, read from its buffer: for Criteo Kaggle's 16.9M rows a
    process, tens of ms of one core, where XLA's `nonzero` on the devices took ~0.3 s."""
    return [np.flatnonzero(row > self._baseline).astype(np.int32) for row in differentials.device_rows(stamps_LxV)]

  def note_initial(self, tree: PyTree) -> None:
    """`tree` is the initial state this run built (it starts from it): its `differentials.fingerprint` goes with the
    differentials over it."""
    self._initial_sums = differentials.fingerprint(tree)

  def _identity(self, leaves: list[tuple[str, Any]]) -> dict[str, Any]:
    """What a restore of a differential over the current baseline checks before it lays it over: every leaf's shape
    and dtype (`leaves`: (path, leaf) of the whole tree), the initial state's `differentials.fingerprint` where that
    is the
    baseline, and the run's settings (to say which differ)."""
    if self._baseline == INITIAL and self._initial_sums is None:
      self._initial_sums = differentials.fingerprint(
        self._initial()
      )  # Not noted by whoever built it: built again, once.
    return {
      'shapes': {path: saved_shapes.shape_of(x) for path, x in leaves},
      'initial': self._initial_sums if self._baseline == INITIAL else None,
      'settings': self._settings,
    }

  def hold(self, baseline: int | None) -> None:
    """Keeps `baseline` from deletion (besides what the checkpoints kept need): a live differential names it."""
    self._held = baseline

  def _write(self, meta: dict, changed: list, rows: dict, dense: dict) -> None:
    leaves = differentials.file_arrays(
      meta, changed, differentials.cut_rows(jax.device_get(rows), changed), jax.device_get(dense)
    )
    path = self._differentials / f'{meta["step"]}_{meta["baseline"]}.npz'
    temporary = path.with_suffix('.npz.tmp')
    with open(temporary, 'wb') as file:
      np.savez(file, **leaves)
      file.flush()
      os.fsync(file.fileno())
    if self._during_write is not None:
      self._during_write(meta['step'])
    os.replace(temporary, path)
    self._account('differential', path.stat().st_size, sum(len(ids) for ids in changed))

  def _account(self, kind: str, num_bytes: int, rows: int) -> None:
    self._counts['saves'] += 1
    self._counts[f'{kind}s'] += 1
    self._counts['bytes_written'] += num_bytes
    self._counts['rows_written'] += rows

  def _finish_writing(self) -> None:
    if self._pending is not None:
      pending, self._pending = self._pending, None
      pending.result()  # Its error, if any, is raised here.

  # Restores.

  def restore(self, step: int, abstract: PyTree) -> tuple[PyTree, dict[str, Any]]:
    """The checkpoint at `step` as (tree, data): a baseline as `Checkpointer.restore` reads it, a differential as
    its baseline with its rows and dense leaves over it."""
    self.wait()
    started = time.perf_counter()
    baseline = self._differential_steps().get(step)
    if baseline is None:
      tree, data = self._full.restore(step, abstract)
      self._baseline = step
    else:
      with np.load(self._differentials / f'{step}_{baseline}.npz') as saved:
        tree, data = self.compose(saved, abstract)
    self._restores_s.append(time.perf_counter() - started)
    return tree, data

  def compose(self, saved: Mapping[str, np.ndarray], abstract: PyTree) -> tuple[PyTree, dict[str, Any]]:
    """A differential's arrays (its file's, or `differentials.file_leaves`') over its baseline, read or rebuilt:
    (tree, data), placed like `abstract`; the next differential is over the same baseline."""
    meta = json.loads(str(saved['meta']))
    baseline = meta['baseline']
    if meta.get('shapes') is not None:  # (Differentials written before 2026-12-06 hold no shapes.)
      flat = jax.tree_util.tree_flatten_with_path(abstract)[0]
      wanted = {jax.tree_util.keystr(path): saved_shapes.shape_of(x) for path, x in flat}
      differ = saved_shapes.shape_difference(meta['shapes'], wanted)
      if differ is not None:
        self._refuse(meta, differ + ' (another model, sync algorithm, replica or process count)')
    if baseline == INITIAL:
      tree = self._initial_like(abstract)
      sums = differentials.fingerprint(tree)
      if meta.get('initial') is not None and meta['initial'] != sums:
        leaf = next(path for path, total in sums.items() if meta['initial'].get(path) != total)
        self._refuse(meta, f"its rows go over the initial state of another run ({leaf} differs from this run's)")
      self._initial_sums = sums
    else:
      tree = self._full.restore(baseline, abstract)[0]
    rows, _ = differentials.row_and_dense_leaves(tree)
    row_paths, num_rows = {path for path, _ in rows}, rows[0][1].shape[1]
    flat, structure = jax.tree_util.tree_flatten_with_path(tree)
    paths = [jax.tree_util.keystr(p) for p, _ in flat]
    leaves = [x for _, x in flat]
    row_index = [i for i, p in enumerate(paths) if p in row_paths]
    for i, (p, x) in enumerate(zip(paths, leaves)):
      if i not in row_index:
        leaves[i] = jax.device_put(saved[f'dense:{p}'], x.sharding)
    num_local = len(meta['rows_changed'])
    ids_LxM = np.full((num_local, differentials.bucket(max(meta['rows_changed']))), num_rows, np.int32)
    values = [np.zeros((num_local, ids_LxM.shape[1], *leaves[i].shape[2:]), leaves[i].dtype) for i in row_index]
    for local in range(num_local):
      ids = saved[f'ids:{local}']
      ids_LxM[local, : len(ids)] = ids
      for v, i in zip(values, row_index):
        v[local, : len(ids)] = saved[f'rows:{local}:{paths[i]}']
    sharding = replicas.replica_sharding(self._meshes.local)
    placed = lambda x: jax.device_put(x, sharding)
    rows = differentials.scatter([leaves[i] for i in row_index], placed(ids_LxM), [placed(v) for v in values])
    for i, x in zip(row_index, rows):
      leaves[i] = jax.device_put(x, leaves[i].sharding)
    self._baseline = baseline
    return jax.block_until_ready(jax.tree.unflatten(structure, leaves)), meta['data']

  def _refuse(self, meta: dict[str, Any], what: str) -> None:
    over = 'the initial state' if meta['baseline'] == INITIAL else f'its baseline of step {meta["baseline"]}'
    raise checkpointing.MismatchError(
      f'The checkpoint at step {meta["step"]} in {self.directory} (a differential over {over}) does not match this '
      f'run: {what}{differentials.settings_difference(meta.get("settings"), self._settings)}. '
      f'{checkpointing.START_OVER}'
    )

  def _initial_like(self, abstract: PyTree) -> PyTree:
    """The initial state (`initial()`), placed like `abstract`."""
    if self._initial is None:
      raise ValueError(f'{self.directory}: a differential over the initial state, and no way to rebuild it given.')
    return jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), self._initial(), abstract)

  # Retention.

  def _delete(self, steps: list[int]) -> None:
    differentials = self._differential_steps()
    for step in steps:
      if step in differentials:
        (self._differentials / f'{step}_{differentials[step]}.npz').unlink(missing_ok=True)
    self._full.delete([s for s in steps if s not in differentials])

  def _needed(self, kept: list[int]) -> set[int]:
    """`kept` and the baselines they need, and the baseline the next differential will name."""
    differentials = self._differential_steps()
    return set(kept) | {differentials.get(s, s) for s in kept} | ({self._baseline, self._held} - {None})

  def _prune(self) -> None:
    if self._keep is not None:
      steps = self.all_steps()
      needed = self._needed(steps[-self._keep :])
      self._delete([s for s in steps if s not in needed])

  def delete_after(self, step: int) -> list[int]:
    """Deletes the checkpoints newer than `step` (a timeline abandoned); returns their steps."""
    self.wait()
    newer = [s for s in self.all_steps() if s > step]
    self._delete(newer)
    if self._baseline is not None and self._baseline > step:
      self._baseline = max((s for s in self._full.all_steps() if s <= step), default=self._first_baseline())
    return newer

  def delete_before(self, step: int) -> None:
    """Deletes the checkpoints older than `step` but the newest complete one, and never a baseline a kept one needs;
    without waiting for a differential or a baseline being written (`step` is at most the save before it, complete:
    what it keeps does not need the one being written)."""
    steps = self.all_steps()
    needed = self._needed([s for s in steps if s >= step] + steps[-1:])
    self._delete([s for s in steps if s < step and s not in needed])

  # The rest of `Checkpointer`'s interface.

  def wait(self) -> None:
    """Returns once every save started is on disk (and what `keep` no longer needs is deleted)."""
    self._full.wait()
    self._finish_writing()
    self._prune()

  def saving(self) -> bool:
    return self._full.saving() or (self._pending is not None and not self._pending.done())

  def stats(self) -> dict[str, Any]:
    """`Checkpointer.stats` and what incremental checkpoints wrote: baselines, differentials, their bytes and
    rows, and the seconds the loop was blocked by them."""
    self.wait()
    full = self._full.stats()
    saves = self._counts['saves']
    return {
      **full,
      **{f'checkpoint_{key}': value for key, value in self._counts.items()},
      'checkpoint_blocked_s': self._blocked_s,
      'save_blocking_s': self._blocked_s / saves if saves else None,
      # Every restore, a differential's too (the whole checkpointer's count only the baselines it reads).
      'restores': len(self._restores_s),
      'restore_s': sum(self._restores_s) / len(self._restores_s) if self._restores_s else None,
      'incremental': True,
    }

  def close(self) -> None:
    self.wait()
    self._writer.shutdown()
    self._full.close()
