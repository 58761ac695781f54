"""What a training checkpoint holds, the training tree (`training_tree`: this process's train state, and the sync
state where its rounds keep one), its shapes without its arrays (`abstract_like`), and the state a run starts from
when nothing is restored, built only if asked for (`FreshState`).

  fresh = FreshState(build, meshes)             # build() -> (state_L, sync_state_R); nothing built yet
  abstract = fresh.abstract()                   # what a restore reads into (`checkpointing.Checkpointer.restore`)
  state_L, sync_state_R = fresh()               # built now, where nothing was restored
  tree = training_tree(state_L, sync_state_L)   # a checkpoint's `state` item
  abstract_like(tree)                           # its shapes, dtypes and shardings
"""

from collections.abc import Callable
from typing import Any

import jax

from shadowsync_jax.parallel import replicas

PyTree = Any


def training_tree(state_L: PyTree, sync_state_L: PyTree) -> dict[str, PyTree]:
  """What a training checkpoint's `state` item holds: this process's train state and, for round-based sync, its
  copies of the sync state."""
  return {'train': state_L} if sync_state_L is None else {'train': state_L, 'sync': sync_state_L}


class FreshState:
  """The state a run starts from when nothing is restored, built only if asked for: a restore reads a checkpoint
  into arrays of the abstract shapes, never over tables built first (at Criteo Kaggle's size, 2.2 GB of random rows
  made and dropped at every restart).

    fresh = FreshState(build, initial_sync_state, abstract_state_L, meshes)
    fresh.abstract()                      # the training tree's shapes, dtypes and shardings: what a restore reads
    state_L, sync_state_R = fresh()       # built now: build(), initial_sync_state(state_L)
  """

  def __init__(
    self,
    build: Callable[[], PyTree],
    initial_sync_state: Callable[[PyTree], PyTree],
    abstract_state_L: PyTree,
    meshes: replicas.ReplicaMeshes,
  ):
    """`build()`: this process's train state [L, ...], whose shapes `abstract_state_L` gives (known without
    tracing it again: `program_store.output_shapes`); `initial_sync_state(state_L)`: the sync state [R, ...] over
    it."""
    self._build, self._initial_sync_state, self._abstract_state_L = build, initial_sync_state, abstract_state_L
    self._meshes = meshes

  def __call__(self) -> tuple[PyTree, PyTree]:
    state_L = self._build()
    return state_L, self._initial_sync_state(state_L)

  def abstract(self) -> PyTree:
    """`abstract_like(training_tree(state_L, this process's sync state))` of the state `build` would make, without
    making it: every leaf [L, ...] on this process's replicas (the sync state's [R, ...] cut to [L, ...])."""
    state_L = self._abstract_state_L
    sync_state_R = jax.eval_shape(self._initial_sync_state, state_L)
    sharding, num_local = replicas.replica_sharding(self._meshes.local), self._meshes.local.shape[replicas.REPLICA_AXIS]
    placed = lambda x: jax.ShapeDtypeStruct((num_local, *x.shape[1:]), x.dtype, sharding=sharding)
    return jax.tree.map(placed, training_tree(state_L, sync_state_R))


def abstract_like(tree: PyTree) -> PyTree:
  """Shape, dtype and sharding of every leaf: what restore needs to place arrays like a freshly built state."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
