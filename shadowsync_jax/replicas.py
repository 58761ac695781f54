"""Replicas as a leading axis: R copies of the train state, one per device, stepped by one jitted `shard_map`.

  mesh = replicas.make_mesh(num_replicas)
  state_R = replicas.replicate(state, mesh)                     # every leaf gains a leading axis R, sharded
  train_step = replicas.make_replicated_step(step_fn, mesh)    # jit(shard_map(step_fn)), state donated
  state_R, metrics_R = train_step(state_R, replicas.shard(batch_RxB, mesh))
  mean_params = replicas.replica_mean(state_R.params)          # one model: the average of the replicas

Inside the step each device sees its own replica with the leading axis removed, so `step_fn` is the plain
one-replica step; collectives over `REPLICA_AXIS` (sync SGD) are the only coupling between replicas.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

REPLICA_AXIS = 'replica'

PyTree = Any


def make_mesh(num_replicas: int, devices: list[jax.Device] | None = None) -> Mesh:
  """A one-axis mesh over the first `num_replicas` devices."""
  devices = list(jax.devices() if devices is None else devices)
  if num_replicas > len(devices):
    raise ValueError(f'num_replicas={num_replicas} exceeds the {len(devices)} available devices.')
  # Auto axis: shardings are placed by jit, not carried in types, so plain indexing works on replica arrays.
  return jax.make_mesh((num_replicas,), (REPLICA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=devices[:num_replicas])


def replica_sharding(mesh: Mesh) -> NamedSharding:
  """Leading axis split over replicas, the rest whole on each device."""
  return NamedSharding(mesh, P(REPLICA_AXIS))


def replicate(tree: PyTree, mesh: Mesh) -> PyTree:
  """R identical copies of `tree` stacked on a new leading axis, each built on its own device."""
  num_replicas = mesh.shape[REPLICA_AXIS]
  stack = lambda t: jax.tree.map(lambda x: jnp.broadcast_to(x, (num_replicas, *jnp.shape(x))), t)
  return jax.jit(stack, out_shardings=replica_sharding(mesh))(tree)


def shard(tree_R: PyTree, mesh: Mesh) -> PyTree:
  """Places host arrays with a leading replica axis onto the mesh, one slice per device."""
  return jax.device_put(tree_R, replica_sharding(mesh))


def make_replicated_step(step_fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
                         mesh: Mesh) -> Callable[[PyTree, PyTree], tuple[PyTree, PyTree]]:
  """jit(shard_map(step_fn)) over the replica axis; the state argument is donated (updated in place)."""

  def per_device(state_1, batch_1):
    state, metrics = step_fn(squeeze(state_1), squeeze(batch_1))
    return unsqueeze(state), unsqueeze(metrics)

  spec = P(REPLICA_AXIS)
  sharded = jax.shard_map(per_device, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec))
  return jax.jit(sharded, donate_argnums=0)


@jax.jit
def replica_mean(params_R: PyTree) -> PyTree:
  """The average of the replicas, one tree without the leading axis."""
  return jax.tree.map(lambda x: jnp.mean(x, axis=0), params_R)


def unstack(tree_R: PyTree) -> list[PyTree]:
  """The R replicas of a stacked tree, one tree each."""
  num_replicas = jax.tree.leaves(tree_R)[0].shape[0]
  return [jax.tree.map(lambda x, r=r: x[r], tree_R) for r in range(num_replicas)]


def squeeze(tree_1: PyTree) -> PyTree:
  """Inside shard_map: a device's slice [1, ...] of a replica-stacked tree as the plain one-replica tree."""
  return jax.tree.map(lambda x: x[0], tree_1)


def unsqueeze(tree: PyTree) -> PyTree:
  """Inside shard_map: a one-replica tree back as its [1, ...] slice of the stacked tree."""
  return jax.tree.map(lambda x: x[None], tree)
