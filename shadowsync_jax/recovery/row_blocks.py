"""Large arrays (tables, their optimizer state) saved and restored a block of rows at a time, where they live.

  handler = row_blocks.RowBlockHandler()            # an orbax CheckpointHandler, an item of a CheckpointManager
  manager.save(step, args=ocp.args.Composite(tables=row_blocks.RowBlockSave({'path': array_L}), ...))
  arrays = manager.restore(step, args=ocp.args.Composite(tables=row_blocks.RowBlockRestore({'path': abstract_L})))

Orbax's own array handler copies each shard whole to the host before it writes it, and reads a shard whole into
host memory before it places it on its device: a second copy of a table on the way out and on the way in. Here
each of this process's device shards [L, rows, ...] is written as rows [start, start + BLOCK_ROWS) at a time
(tensorstore, zarr3, chunks of BLOCK_ROWS rows): on a CPU the block is a view of the device buffer, on an
accelerator a transfer of one block. A restore allocates this process's part of the array where it lives and fills
it a block of every shard at a time in place (one donated update), reading the next blocks meanwhile: a process
never holds more than two blocks a device beyond its state. The caller must not change
the arrays while a save runs (`checkpointing` saves large states blocking).

Every process writes only its own shards, under `<array>/process_<p>` (no collective, no coordination).
"""

from collections.abc import Callable
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
    if args.during is not None:
      args.during()
    for name, array in args.arrays.items():
      for local, shard in enumerate(_local_shards(array)):
        _write(_spec(directory, name, local), shard)

  def restore(self, directory: epath.Path, args: 'RowBlockRestore') -> dict[str, jax.Array]:
    return {name: _read(directory, name, abstract) for name, abstract in args.abstract.items()}

  def metadata(self, directory: epath.Path) -> None:
    return None


@ocp.args.register_with_handler(RowBlockHandler, for_save=True)
@dataclasses.dataclass
class RowBlockSave(ocp.args.CheckpointArgs):
  arrays: dict[str, jax.Array]  # Name -> this process's [L, rows, ...] array (its local devices' shards).
  during: Callable[[], None] | None = None  # Called inside the save, before it can complete (`Checkpointer`).


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


def _read(directory: epath.Path, name: str, abstract: jax.ShapeDtypeStruct) -> jax.Array:
  """This process's part of an array, filled a block of rows of every local shard at a time: one compiled update
  for all of them (the last block ends at the last row, overlapping the one before, so every block has one shape),
  the next block read while the last is placed."""
  sharding, (num_local, rows, *row_shape) = abstract.sharding, _local_shape(abstract)
  stores = [ts.open(_spec(directory, name, local)).result() for local in range(num_local)]
  devices = _local_devices(sharding, abstract.shape)
  array = _zeros(abstract.shape, np.dtype(abstract.dtype), sharding)()
  step = min(rows, block_rows(tuple(row_shape), np.dtype(abstract.dtype).itemsize))
  starts = [*range(0, rows - step, step), rows - step]
  reading = [store[starts[0] : starts[0] + step].read() for store in stores]
  for i, start in enumerate(starts):
    blocks = [read.result() for read in reading]
    if i + 1 < len(starts):
      reading = [store[starts[i + 1] : starts[i + 1] + step].read() for store in stores]
    placed = [jax.device_put(block[None], device) for block, device in zip(blocks, devices)]
    block = jax.make_array_from_single_device_arrays((*abstract.shape[:1], step, *row_shape), sharding, placed)
    array = _put_rows(array, block, start)
  return array


def _local_shape(abstract: jax.ShapeDtypeStruct) -> tuple[int, ...]:
  """The shape of this process's part of a [L_job, rows, ...] array: [local devices, rows, ...]."""
  return (len(abstract.sharding.addressable_devices), *abstract.shape[1:])


@functools.cache
def _zeros(shape: tuple[int, ...], dtype: np.dtype, sharding: jax.sharding.Sharding) -> jax.Array:
  """Compiles (once per shape and placement) the program that allocates an array of zeros where it lives."""
  return jax.jit(functools.partial(jnp.zeros, shape, dtype), out_shardings=sharding)


@functools.partial(jax.jit, donate_argnums=0)
def _put_rows(array_LxR: jax.Array, block_LxK: jax.Array, start: int) -> jax.Array:
  return lax.dynamic_update_slice_in_dim(array_LxR, block_LxK, start, axis=1)
