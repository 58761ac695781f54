"""Replicas as a leading axis: R copies of the train state, one per device, stepped by one jitted `shard_map`.

  mesh = replicas.make_mesh(num_replicas)
  state_R = replicas.replicate(state, mesh)                     # every leaf gains a leading axis R, sharded
  train_step = replicas.make_replicated_step(step_fn, mesh)    # jit(shard_map(step_fn)), state donated
  state_R, metrics_R = train_step(state_R, replicas.shard(batch_RxB, mesh))
  mean_params = replicas.replica_mean(state_R.params)          # one model: the average of the replicas

Inside the step each device sees its own replica with the leading axis removed, so `step_fn` is the plain
one-replica step; collectives over `REPLICA_AXIS` (sync SGD) are the only coupling between replicas.

Several processes (`jax.distributed`): the job's R replicas are split evenly, process p holding replicas
[p L, (p + 1) L) on its first L local devices. Two meshes name the same replica axis:

  meshes = replicas.make_meshes(num_replicas)   # .local: this process's L replicas; .job: all R of the job
  state_L = ...                                 # the train state lives on meshes.local: steps stay process-local
  params_R = replicas.to_job(params_L, meshes)  # the same buffers seen as the job's [R, ...] array (no copy)
  params_L = replicas.to_local(params_R, meshes)

A sync round, sync SGD's step and the final consensus run on `meshes.job`; everything else on `meshes.local`. With
one process the two meshes are one object and the conversions return their argument.

Across processes, two threads issuing collectives pair calls with the wrong partners (docs/design.md §3). While a thread
has reserved them (`reserve_collectives`: GBA's gradient-exchange thread, from start to finish), the job-wide
functions here and in the sync drivers raise CollectiveThreadError when called from any other thread.
"""

from collections.abc import Callable
import functools
import hashlib
import threading
from typing import Any, NamedTuple

import jax
from jax import lax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from shadowsync_jax.parallel import program_store

REPLICA_AXIS = 'replica'

PyTree = Any


def make_mesh(num_replicas: int, devices: list[jax.Device] | None = None) -> Mesh:
  """A one-axis mesh over the first `num_replicas` devices."""
  devices = list(jax.devices() if devices is None else devices)
  if num_replicas > len(devices):
    raise ValueError(f'num_replicas={num_replicas} exceeds the {len(devices)} available devices.')
  # Auto axis: shardings are placed by jit, not carried in types, so plain indexing works on replica arrays.
  return jax.make_mesh(
    (num_replicas,), (REPLICA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices[:num_replicas]
  )


class ReplicaMeshes(NamedTuple):
  """The replica axis as this process sees it (`local`) and as the whole job does (`job`)."""

  local: Mesh
  job: Mesh


def make_meshes(num_replicas: int) -> ReplicaMeshes:
  """`num_replicas` job replicas split evenly over the processes, each on its own first local devices."""
  num_processes = jax.process_count()
  if num_replicas % num_processes:
    raise ValueError(f'num_replicas={num_replicas} must be a multiple of the process count ({num_processes}).')
  per_process = num_replicas // num_processes
  local = make_mesh(per_process, sorted(jax.local_devices(), key=lambda d: d.id))
  if num_processes == 1:
    return ReplicaMeshes(local, local)
  by_process: dict[int, list[jax.Device]] = {}
  for device in sorted(jax.devices(), key=lambda d: d.id):
    by_process.setdefault(device.process_index, []).append(device)
  if any(len(devices) < per_process for devices in by_process.values()):
    raise ValueError(
      f'num_replicas={num_replicas} needs {per_process} devices on each of the {num_processes} '
      f'processes; they have {[len(d) for _, d in sorted(by_process.items())]}.'
    )
  job_devices = [d for _, devices in sorted(by_process.items()) for d in devices[:per_process]]
  return ReplicaMeshes(local, make_mesh(num_replicas, job_devices))


def to_job(tree_L: PyTree, meshes: ReplicaMeshes) -> PyTree:
  """This process's replicas [L, ...] as its part of the job-wide [R, ...] arrays (the same device buffers)."""
  if meshes.job is meshes.local:
    return tree_L
  return _reassemble(tree_L, meshes.job)


def to_local(tree_R: PyTree, meshes: ReplicaMeshes) -> PyTree:
  """The job-wide [R, ...] arrays cut down to this process's replicas [L, ...] (the same device buffers)."""
  if meshes.job is meshes.local:
    return tree_R
  return _reassemble(tree_R, meshes.local)


def _reassemble(tree: PyTree, mesh: Mesh) -> PyTree:
  sharding, num_replicas = replica_sharding(mesh), mesh.shape[REPLICA_AXIS]

  def one(x):
    if isinstance(x, jax.core.Tracer):  # Traced for its shape alone (`jax.eval_shape`): no buffers to reassemble.
      return jnp.zeros((num_replicas, *x.shape[1:]), x.dtype)
    shards = [shard.data for shard in x.addressable_shards]
    return jax.make_array_from_single_device_arrays((num_replicas, *x.shape[1:]), sharding, shards)

  return jax.tree.map(one, tree)


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


def make_replicated_step(
  step_fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]], mesh: Mesh
) -> Callable[[PyTree, PyTree], tuple[PyTree, PyTree]]:
  """jit(shard_map(step_fn)) over the replica axis; the state argument is donated (updated in place)."""

  def per_device(state_1, batch_1):
    state, metrics = step_fn(squeeze(state_1), squeeze(batch_1))
    return unsqueeze(state), unsqueeze(metrics)

  spec = P(REPLICA_AXIS)
  sharded = jax.shard_map(per_device, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec))
  return jax.jit(sharded, donate_argnums=0)


class Between(NamedTuple):
  """Rounds fused into a block (`make_replicated_block`), per device, from the block's carry: `next_at(carry, done)
  -> int32`, the count of the block's steps done at which the next round after `done` falls (past the block's
  steps: no more in it); `round(state, carry) -> (state, carry)`, one round (`sync.scheduled`)."""

  next_at: Callable[[PyTree, jax.Array], jax.Array]
  round: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]]
  donate_carry: bool = False  # The block takes the carry's buffers: a large carry updated in place, not copied.


def make_replicated_block(
  step_fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
  mesh: Mesh,
  between: Between | None = None,
) -> 'BlockProgram':
  """`block(state_R, batches_RxK, steps_R, full=False) -> (state_R, metrics_RxK)`: `steps` <= K steps of `step_fn`,
  one after the other on each device, in one dispatch (docs/design.md §13); the state donated.

  With `between` (`Between`: sync rounds fused into the block, `sync.scheduled`), the block takes a carry and
  returns it (donated if `between.donate_carry`): `block(state_R, batches_RxK, steps_R, carry_R,
  full=False) -> (state_R, metrics_RxK, carry_R)`. The steps run in stretches from one round to the next, each
  round between two stretches: no test in the steps' loop, so the steps between rounds run as they do without
  (a round behind a `lax.cond` after every step had XLA copy the state through the untaken branch at every step:
  the default config's `shadow_ea` blocks took 3-5% longer with no round in them, issue 64).

  Batches come [R, K, B, ...] (replica first, like every replicated array here, `shard` places them) and step k
  reads `batches[:, k]`; the metrics come back [R, K], those of steps past `steps` zero. `steps` is an int32 array
  [R] of one value, an argument, not a constant: a block cut short by an event runs the same compiled program
  (one program per K, not per block length). `full=True` says `steps` is K: a second program whose loop has a
  static trip count (with rounds fused in, the stretches' counts are known on the device only). (On a GPU, XLA's
  loop with a trip count known only on the device has the host read its test after every step: on an H200 the
  default config's block kept the GPU 83-87% busy that way, against 95-98% and 1.23-1.28x the examples a second
  with the count static; BUILD.md.) Collectives in `step_fn` (sync SGD, sharded tables) run in every step, so
  every device of the mesh must run the same number of steps.
  """

  def per_device(state_1, batches_1xK, steps_1, *carry_1, full: bool):
    batches_K = squeeze(batches_1xK)
    block_steps = jax.tree.leaves(batches_K)[0].shape[0]
    num_steps = block_steps if full else steps_1[0]
    state = squeeze(state_1)
    batch_at = lambda k: jax.tree.map(lambda x: lax.dynamic_index_in_dim(x, k, keepdims=False), batches_K)
    metrics_shape = jax.eval_shape(step_fn, state, batch_at(0))[1]
    zeros = lambda m: lax.pcast(jnp.zeros((block_steps, *m.shape), m.dtype), (REPLICA_AXIS,), to='varying')
    metrics_K = jax.tree.map(zeros, metrics_shape)  # Per device, as the steps' metrics are.

    def one_step(k, loop_carry):
      state, metrics_K = loop_carry
      state, metrics = step_fn(state, batch_at(k))
      metrics_K = jax.tree.map(lambda all_, m: lax.dynamic_update_index_in_dim(all_, m, k, 0), metrics_K, metrics)
      return state, metrics_K

    if between is None:
      state, metrics_K = lax.fori_loop(0, num_steps, one_step, (state, metrics_K))
      return unsqueeze(state), unsqueeze(metrics_K)

    def more_rounds(loop_carry):
      done, _, _, carry = loop_carry
      return between.next_at(carry, done) <= num_steps

    def stretch_and_round(loop_carry):
      done, state, metrics_K, carry = loop_carry
      at = between.next_at(carry, done)
      state, metrics_K = lax.fori_loop(done, at, one_step, (state, metrics_K))
      state, carry = between.round(state, carry)
      return at, state, metrics_K, carry

    carry = squeeze(carry_1[0])
    none_done = jnp.zeros_like(steps_1[0])  # Per device, as `next_at`'s counts are.
    done, state, metrics_K, carry = lax.while_loop(more_rounds, stretch_and_round, (none_done, state, metrics_K, carry))
    state, metrics_K = lax.fori_loop(done, num_steps, one_step, (state, metrics_K))
    return unsqueeze(state), unsqueeze(metrics_K), unsqueeze(carry)

  spec = P(REPLICA_AXIS)
  arity = 3 if between is None else 4
  program = lambda full: program_store.stored(
    'block_all_steps' if full else 'block',
    jax.jit(
      jax.shard_map(
        functools.partial(per_device, full=full), mesh=mesh, in_specs=(spec,) * arity, out_specs=(spec,) * (arity - 1)
      ),
      donate_argnums=(0, 3) if between is not None and between.donate_carry else 0,
    ),
  )
  return BlockProgram(program(False), program(True))


class BlockProgram(NamedTuple):
  """The two programs of a block (`make_replicated_block`): any number of steps, and all K of them. With
  `job_meshes` (steps that are collectives of the whole job) it takes and returns this process's replicas and runs
  on the job's mesh (`to_job`, `to_local`). Its arguments after the state: the batches, the steps, and the carry
  of its `between` if it has one."""

  any_steps: Callable[..., tuple[PyTree, ...]]
  all_steps: Callable[..., tuple[PyTree, ...]]
  job_meshes: 'ReplicaMeshes | None' = None

  def __call__(self, state: PyTree, *args: PyTree, full: bool = False) -> tuple[PyTree, ...]:
    outputs = (self.all_steps if full else self.any_steps)(*self._arguments(state, *args))
    if self.job_meshes is None:
      return outputs
    return tuple(to_local(output, self.job_meshes) for output in outputs)

  def compile_all_steps(self, state: PyTree, *args: PyTree) -> None:
    """Compiles the all-K program for these arguments' shapes now, ahead of its first block (nothing runs)."""
    program_store.compile(self.all_steps, *self._arguments(state, *args))

  def _arguments(self, state, *args) -> tuple:
    if self.job_meshes is None:
      return state, *args
    return to_job(state, self.job_meshes), *to_job(args, self.job_meshes)


@jax.jit
def replica_mean(params_R: PyTree) -> PyTree:
  """The average of the replicas, one tree without the leading axis."""
  return jax.tree.map(lambda x: jnp.mean(x, axis=0), params_R)


class CollectiveThreadError(RuntimeError):
  """A job-wide collective called from a thread other than the one that reserved them."""


_collective_thread: threading.Thread | None = None


def reserve_collectives(thread: threading.Thread | None) -> None:
  """From now on only `thread` may issue job-wide collectives (None: any thread, one at a time, as before)."""
  global _collective_thread
  _collective_thread = thread


def check_collective_thread(what: str) -> None:
  """Raises CollectiveThreadError if another thread than the calling one has reserved the job's collectives."""
  owner = _collective_thread
  if owner is not None and owner.is_alive() and owner is not threading.current_thread():
    raise CollectiveThreadError(
      f'{what} is a job-wide collective, called from thread {threading.current_thread().name!r} while thread '
      f'{owner.name!r} owns them: across processes two threads issuing collectives mismatch their partners.'
    )


def job_mean(params_L: PyTree, meshes: ReplicaMeshes) -> PyTree:
  """The average of all the job's replicas, one tree without the leading axis, whole on every device of the job
  (a collective across processes: call it from one thread per process, in the same order everywhere)."""
  return whole_on_job(replica_mean, meshes)(to_job(params_L, meshes))


def whole_on_job(fn: Callable[..., PyTree], meshes: ReplicaMeshes) -> Callable[..., PyTree]:
  """`fn` jitted so that its results are whole on every device of the job (readable with `fetch` everywhere); a
  job-wide collective (see `reserve_collectives`)."""
  jitted = _whole_on(fn, meshes.job)

  def call(*args):
    check_collective_thread(getattr(fn, '__name__', 'a job-wide function'))
    return jitted(*args)

  return call


@functools.cache
def _whole_on(fn: Callable[..., PyTree], mesh: Mesh) -> Callable[..., PyTree]:
  return jax.jit(fn, out_shardings=NamedSharding(mesh, P()))


def fetch(tree: PyTree) -> PyTree:
  """A tree of arrays whole on every device (e.g. a consensus computed on the job mesh) as host numpy arrays,
  read from this process's own copy."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)) if x.is_fully_replicated else np.asarray(x), tree)


def host_mean(values_L: jax.Array) -> float:
  """The mean of a per-replica value of this process's replicas (a step's losses), computed on the host.

  `np.mean(values_L)` would call `values_L.mean()`: a jitted program with an all-reduce over the replica devices,
  one more cross-replica collective on the training thread every step.
  """
  return float(np.asarray(values_L).mean())


def gather_from_processes(value: float | int) -> list:
  """[value of process 0, value of process 1, ...] on every process."""
  check_collective_thread('gathering from the processes')
  if jax.process_count() == 1:
    return [value]
  return list(multihost_utils.process_allgather(np.asarray(value)))


_CHECKSUM_CHUNK_ROWS = 1 << 16  # Rows hashed at once: the checksum's only temporary.


def checksum(table: jax.Array) -> jax.Array:
  """A uint32 of every bit and position of an array's rows (its leading axis), computed a chunk of rows at a time
  where it lives (no copy); traced inside a caller's program. Values of 1, 2 or 8 bytes count as their uint32 words."""
  table = table.reshape(1, 1) if table.ndim == 0 else table
  rows = table.shape[0]
  chunk = min(rows, _CHECKSUM_CHUNK_ROWS)

  def add_chunk(i, total):
    start = jnp.minimum(i * chunk, rows - chunk)  # The last chunk ends at the last row; rows seen before: masked.
    bits = _uint32_words(lax.dynamic_slice_in_dim(table, start, chunk)).reshape(chunk, -1)
    row_size = bits.shape[1]
    position = (start + jnp.arange(chunk, dtype=jnp.uint32))[:, None] * jnp.uint32(row_size) + jnp.arange(
      row_size, dtype=jnp.uint32
    )
    mixed = bits * (position * jnp.uint32(0x9E3779B9) | jnp.uint32(1))
    fresh = (start + jnp.arange(chunk) >= i * chunk)[:, None]
    return total + jnp.sum(jnp.where(fresh, mixed ^ (mixed >> 15), 0), dtype=jnp.uint32)

  return lax.fori_loop(0, -(-rows // chunk), add_chunk, jnp.uint32(0))


def _uint32_words(x: jax.Array) -> jax.Array:
  """An array's bits as uint32 (8-byte values as two words on a last axis, 1- and 2-byte ones widened)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def fingerprint(params: Any) -> np.uint32:
  """32 bits of a hash of the model's bytes: equal on two processes when they hold the same model (and different,
  but for a 2^-32 chance, when they do not)."""
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(params):
    digest.update(np.ascontiguousarray(leaf).tobytes())
  return np.uint32(int.from_bytes(digest.digest()[:4], 'little'))  # 32 bits: JAX gathers without 64-bit types.


def fingerprints_per_process(params: Any) -> list[str]:
  """Every process's `fingerprint` of its `params`, in hex (a collective): all equal when they hold one model."""
  return [f'{int(x):08x}' for x in gather_from_processes(fingerprint(params))]


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


_DIVERGENCE_CHUNK_ELEMENTS = 1 << 22  # Of one replica: a table is measured this many elements at a time.


@jax.jit
def replica_divergence(params_R: PyTree) -> jax.Array:
  """Mean over replicas of the L2 distance of each replica's params to the replica mean (docs/design.md §6). A large
  leaf (a table) is measured a chunk of rows at a time, so no table-sized temporary exists."""
  squared_R = sum(_squared_distance_to_mean(x) for x in jax.tree.leaves(params_R))
  return jnp.mean(jnp.sqrt(squared_R))


def _squared_distance_to_mean(x_R: jax.Array) -> jax.Array:
  if x_R.shape[0] == 1:
    return jnp.zeros((1,), jnp.float32)
  if x_R.ndim < 2 or x_R[0].size <= _DIVERGENCE_CHUNK_ELEMENTS:
    return jnp.sum(jnp.square(x_R - jnp.mean(x_R, axis=0, keepdims=True)).reshape(x_R.shape[0], -1), axis=1)
  rows = x_R.shape[1]
  chunk = max(1, _DIVERGENCE_CHUNK_ELEMENTS // (x_R[0].size // rows))

  def add_chunk(i, squared_R):
    start = jnp.minimum(i * chunk, rows - chunk)  # The last chunk ends at the last row; rows seen before: masked.
    part = jax.lax.dynamic_slice_in_dim(x_R, start, chunk, axis=1)
    fresh = (start + jnp.arange(chunk) >= i * chunk).reshape(1, chunk, *([1] * (x_R.ndim - 2)))
    deviation = jnp.where(fresh, part - jnp.mean(part, axis=0, keepdims=True), 0.0)
    return squared_R + jnp.sum(jnp.square(deviation).reshape(x_R.shape[0], -1), axis=1)

  return jax.lax.fori_loop(0, -(-rows // chunk), add_chunk, jnp.zeros((x_R.shape[0],), jnp.float32))
