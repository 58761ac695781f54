"""Large arrays (tables, their optimizer state) saved and restored a block of rows at a time, where they live.

  handler = row_blocks.RowBlockHandler()            # an orbax CheckpointHandler, an item of a CheckpointManager
  manager.save(step, args=ocp.args.Composite(tables=row_blocks.RowBlockSave({'path': array_L}), ...))
  arrays = manager.restore(step, args=ocp.args.Composite(tables=row_blocks.RowBlockRestore({'path': abstract_L})))

Orbax's own array handler copies each shard whole to the host before it writes it, and reads a shard whole into
host memory before it places it on its device: a second copy of a table on the way out and on the way in. Here
each of this process's device shards [L, rows, ...] is written as rows [start, start + BLOCK_ROWS) at a time
(tensorstore, zarr3, chunks of BLOCK_ROWS rows): on a CPU the block is a view of the device buffer, on an
accelerator a transfer of one block. A restore allocates each shard on its device and fills it block by block in
place (a donated update), so a process never holds more than a block beyond its state. The caller must not change
the arrays while a save runs (`checkpointing` saves large states blocking).

Every process writes only its own shards, under `<array>/process_<p>` (no collective, no coordination).
"""

import dataclasses
import functools
import math
import pathlib
from typing import Any

from etils import epath
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

BLOCK_BYTES = 16 << 20  # Rows written or read at once: the most a save or restore holds beyond the state.


def block_rows(row_shape: tuple[int, ...], itemsize: int) -> int:
  """Rows per block for rows of `row_shape` (the shape after the row axis)."""
  return max(1, BLOCK_BYTES // max(1, math.prod(row_shape) * itemsize))


class RowBlockHandler(ocp.CheckpointHandler):
  """This process's shards of some arrays ([L, rows, ...], the leading axis its local devices), by blocks of rows."""

  def save(self, directory: epath.Path, args: 'RowBlockSave') -> None:
    for name, array in args.arrays.items():
      for local, shard in enumerate(_local_shards(array)):
        _write(_spec(directory, name, local), shard)

  def restore(self, directory: epath.Path, args: 'RowBlockRestore') -> dict[str, jax.Array]:
    restored = {}
    for name, abstract in args.abstract.items():
      devices = _local_devices(abstract.sharding, abstract.shape)
      shards = [_read(_spec(directory, name, local), device) for local, device in enumerate(devices)]
      restored[name] = jax.make_array_from_single_device_arrays(abstract.shape, abstract.sharding, shards)
    return restored

  def metadata(self, directory: epath.Path) -> None:
    return None


@ocp.args.register_with_handler(RowBlockHandler, for_save=True)
@dataclasses.dataclass
class RowBlockSave(ocp.args.CheckpointArgs):
  arrays: dict[str, jax.Array]  # Name -> this process's [L, rows, ...] array (its local devices' shards).


@ocp.args.register_with_handler(RowBlockHandler, for_restore=True)
@dataclasses.dataclass
class RowBlockRestore(ocp.args.CheckpointArgs):
  abstract: dict[str, jax.ShapeDtypeStruct]  # Name -> shape, dtype and sharding of the array to restore.


def _local_shards(array: jax.Array) -> list[jax.Array]:
  """The array's shards on this process's devices, in the order of the leading (device) axis, each [1, rows, ...]."""
  return [shard.data for shard in sorted(array.addressable_shards, key=lambda s: s.index[0].start or 0)]


def _local_devices(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> list[jax.Device]:
  """This process's devices of `sharding`, in the order of the leading axis they hold."""
  index = sharding.addressable_devices_indices_map(shape)
  return [device for device, _ in sorted(index.items(), key=lambda item: item[1][0].start or 0)]


def _spec(directory: epath.Path, name: str, local: int) -> dict[str, Any]:
  path = pathlib.Path(directory) / name / f'process_{jax.process_index()}' / f'device_{local}'
  return {'driver': 'zarr3', 'kvstore': {'driver': 'file', 'path': str(path)}}


def _write(spec: dict[str, Any], shard_1xR: jax.Array) -> None:
  rows, row_shape, dtype = shard_1xR.shape[1], shard_1xR.shape[2:], shard_1xR.dtype
  step = block_rows(row_shape, dtype.itemsize)
  store = ts.open(
    spec,
    create=True,
    delete_existing=True,
    dtype=ts.dtype(np.dtype(dtype).name),
    shape=(rows, *row_shape),
    chunk_layout=ts.ChunkLayout(chunk_shape=(min(step, rows), *row_shape)),
  ).result()
  on_cpu = next(iter(shard_1xR.devices())).platform == 'cpu'
  host = np.asarray(shard_1xR)[0] if on_cpu else None  # On a CPU, a view of the device buffer: no copy.
  for start in range(0, rows, step):
    block = host[start : start + step] if host is not None else np.asarray(shard_1xR[0, start : start + step])
    store[start : start + len(block)].write(block).result()


def _read(spec: dict[str, Any], device: jax.Device) -> jax.Array:
  store = ts.open(spec).result()
  rows, row_shape = store.shape[0], tuple(store.shape[1:])
  dtype = np.dtype(store.dtype.numpy_dtype)
  shard = jax.jit(
    lambda: jnp.zeros((1, rows, *row_shape), dtype), out_shardings=jax.sharding.SingleDeviceSharding(device)
  )()
  step = block_rows(row_shape, dtype.itemsize)
  for start in range(0, rows, step):
    block = store[start : min(rows, start + step)].read().result()
    shard = _put_rows(shard, jax.device_put(block[None], device), start)
  return shard


@functools.partial(jax.jit, donate_argnums=0)
def _put_rows(shard_1xR: jax.Array, block_1xK: jax.Array, start: int) -> jax.Array:
  return lax.dynamic_update_slice_in_dim(shard_1xR, block_1xK, start, axis=1)
