"""A differential checkpoint's parts: the row leaves a train state's stamps say changed, gathered on the devices,
and the one file that holds them (`incremental` writes and reads it).

  rows, dense = differentials.row_and_dense_leaves(tree_L)   # the leaves indexed by embedding row, and the rest
  gathered = differentials.gather(rows, ids_LxM)             # each device's changed rows, in new buffers
  arrays = differentials.file_leaves(taken)                  # a taken differential as its file holds it
  differentials.fingerprint(tree_L)                          # whether two trees hold the same rows

A leaf is a row leaf when it is a table, the optimizer's per-row state or the stamps (`row_steps`), indexed by
embedding row on its second axis ([L, V, ...]). `row_steps` stamps every row the optimizer writes with the step
count after it (`model.step`): the rows changed since a baseline of step b are those stamped after b. A file holds
its meta (JSON: step, baseline, rows changed, the data position and what a restore checks), the dense leaves, and
each local device's changed ids and their rows. A fingerprint (a checksum of each row leaf, of 2^16 of its rows at
most) tells a restore over the initial state that the state it rebuilt is the one the differential was taken over;
where it is not, the settings that differ are named.
"""

from collections.abc import Mapping
import functools
import json
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from shadowsync_jax.parallel import replicas

PyTree = Any
_ROW_PREFIXES = ("['train'].params['embedding']", "['train'].embedding_opt_state", "['train'].row_steps")
STAMPS = "['train'].row_steps"


def is_row_leaf(path: str, leaf: Any, num_rows: int) -> bool:
  """Whether a leaf of a training tree is indexed by embedding row on its second axis ([L, V, ...])."""
  return path.startswith(_ROW_PREFIXES) and getattr(leaf, 'ndim', 0) >= 2 and leaf.shape[1] == num_rows


def row_and_dense_leaves(tree: PyTree) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
  """A training tree's leaves as (path, leaf), split into those indexed by embedding row (`is_row_leaf`) and the
  rest, in tree order."""
  flat = [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
  num_rows = next(leaf for path, leaf in flat if path == STAMPS).shape[1]
  rows = [(path, x) for path, x in flat if is_row_leaf(path, x, num_rows)]
  return rows, [(path, x) for path, x in flat if not is_row_leaf(path, x, num_rows)]


@jax.jit
def gather(rows: list[jax.Array], ids_LxM: jax.Array) -> list[jax.Array]:
  """Each leaf [L, V, ...] at rows `ids_LxM` of each device ([L, M, ...]); ids >= V read zeros."""
  take = lambda x: jax.vmap(lambda x_1, ids: x_1.at[ids].get(mode='fill', fill_value=0))(x, ids_LxM)
  return [take(x) for x in rows]


@jax.jit
def copy_tree(tree: PyTree) -> PyTree:
  return jax.tree.map(jnp.copy, tree)


@functools.partial(jax.jit, donate_argnums=0)  # In place: the restored baseline's rows are not kept.
def scatter(rows: list[jax.Array], ids_LxM: jax.Array, values: list[jax.Array]) -> list[jax.Array]:
  """Each leaf [L, V, ...] with rows `ids_LxM` of each device set to `values` ([L, M, ...]); ids >= V dropped."""
  put = lambda x, v: jax.vmap(lambda x_1, ids, v_1: x_1.at[ids].set(v_1, mode='drop'))(x, ids_LxM, v)
  return [put(x, v) for x, v in zip(rows, values)]


@jax.jit
def stamp_rows(row_steps_LxV: jax.Array, rows_LxK: jax.Array, step: jax.Array) -> jax.Array:
  """`row_steps` with rows `rows_LxK` of each device stamped `step`: rows written outside a step (a priority
  save's rows over a restored state) that the next differential must hold."""
  return jax.vmap(lambda r, ids: r.at[ids].set(step, mode='drop'))(row_steps_LxV, rows_LxK)


_FINGERPRINT_ROWS = 1 << 16  # Rows of a leaf [L, V, ...] a fingerprint reads at most, evenly spaced.


@jax.jit
def _checksums(leaves: list[jax.Array]) -> list[jax.Array]:
  """`replicas.checksum` of each leaf; of a leaf of more than `_FINGERPRINT_ROWS` rows, of that many evenly spaced
  (another seed or initializer changes every row; hashing the whole tables cost a process at Criteo Kaggle's size
  most of a second of a core at every start from the initial state and every restore over it)."""

  def one(x):
    if x.ndim >= 2 and x.shape[1] > _FINGERPRINT_ROWS:
      x = x[:, :: -(-x.shape[1] // _FINGERPRINT_ROWS)]
    return replicas.checksum(x.reshape(-1, *x.shape[2:]) if x.ndim >= 2 else x)

  return [one(x) for x in leaves]


def fingerprint(tree: PyTree) -> dict[str, int]:
  """{row leaf path: checksum} of this process's part of a training tree: whether two trees hold the same rows. Of
  the row leaves alone: a differential holds every dense leaf, so only the rows it leaves out come from the state
  under it (and each leaf more is a program to trace at every restore: all ~40 leaves took ~0.4 s a restart at
  Criteo Kaggle's size, mostly tracing)."""
  rows, _ = row_and_dense_leaves(tree)
  sums = jax.device_get(_checksums([x for _, x in rows]))
  return {path: int(total) for (path, _), total in zip(rows, sums)}


def settings_difference(saved: Mapping[str, Any] | None, here: Mapping[str, Any]) -> str:
  """The settings of the saving run that differ from this run's, in words (the first few)."""
  if saved is None:
    return ''
  differ = sorted(key for key in set(saved) | set(here) if saved.get(key) != here.get(key))
  if not differ:
    return '; no setting differs (another version of the code?)'
  shown = '; '.join(_one_difference(key, saved.get(key), here.get(key)) for key in differ[:3])
  more = f' (and {len(differ) - 3} more)' if len(differ) > 3 else ''
  return f'; settings that differ: {shown}{more}'


def _one_difference(key: str, there: Any, here: Any) -> str:
  """'KEY THERE there, HERE here'; of two lists of one length, their first element that differs."""
  if isinstance(there, list) and isinstance(here, list) and len(there) == len(here):
    index = next(i for i, (a, b) in enumerate(zip(there, here)) if a != b)
    key, there, here = f'{key}[{index}]', there[index], here[index]
  return f'{key} {_short(there)} there, {_short(here)} here'


def _short(value: Any) -> str:
  text = json.dumps(value)
  return text if len(text) <= 48 else text[:45] + '...'


def device_rows(array_LxV: jax.Array) -> list[np.ndarray]:
  """Each local device's row of an [L, V, ...] array on the host, in the order of the leading axis: on a CPU a view
  of its buffer (not a second [L, V] array assembled)."""
  shards = sorted(array_LxV.addressable_shards, key=lambda shard: shard.index[0].start or 0)
  return [np.asarray(shard.data)[0] for shard in shards]


def bucket(count: int) -> int:
  """A padded row count (a power of two from 256): few shapes, so few compiled gathers."""
  return max(256, 1 << max(0, count - 1).bit_length())


class TakenDifferential(NamedTuple):
  """A differential taken on the devices (`IncrementalCheckpointer.take`), still there."""

  step: int
  baseline: int
  changed: list[np.ndarray]  # Each local device's rows changed since the baseline.
  rows: dict[str, jax.Array]  # Path -> [L, M, ...], the rows of `changed` (zeros past them).
  dense: dict[str, jax.Array]  # Path -> a copy of the leaf.
  data: dict[str, Any]
  identity: dict[str, Any]  # What a restore checks (`IncrementalCheckpointer._identity`).


def file_leaves(taken: TakenDifferential) -> dict[str, np.ndarray]:
  """A taken differential's arrays as its file holds them (copied to the host)."""
  meta = meta_of(taken.step, taken.baseline, taken.changed, taken.data, taken.identity)
  rows = cut_rows(jax.device_get(taken.rows), taken.changed)
  return file_arrays(meta, taken.changed, rows, jax.device_get(taken.dense))


def cut_rows(rows: dict[str, np.ndarray], changed: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
  """Gathered rows ([L, M, ...] by path) as each device's changed ones."""
  return {
    path: [values_LxM[local, : len(ids)] for local, ids in enumerate(changed)] for path, values_LxM in rows.items()
  }


def meta_of(
  step: int, baseline: int, changed: list[np.ndarray], data: dict[str, Any], identity: dict[str, Any]
) -> dict[str, Any]:
  return {
    'step': step,
    'baseline': baseline,
    'rows_changed': [len(c) for c in changed],
    'data': {'step': step, **data},
    **identity,
  }


def file_arrays(meta: dict, changed: list[np.ndarray], rows: dict[str, list], dense: dict) -> dict[str, np.ndarray]:
  """A differential's file: its meta (JSON), the dense leaves, and each device's changed ids and rows (`rows`: by
  path, each device's)."""
  leaves = {'meta': np.asarray(json.dumps(meta))}
  leaves.update({f'dense:{path}': np.asarray(x) for path, x in dense.items()})
  for path, values in rows.items():
    for local, values_M in enumerate(values):
      leaves[f'rows:{local}:{path}'] = np.asarray(values_M)
  for local, ids in enumerate(changed):
    leaves[f'ids:{local}'] = np.asarray(ids, np.int32)
  return leaves
