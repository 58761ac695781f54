"""The one-pass training stream, split across replicas, and the held-out set, read through grain.

  train_source, eval_source = input_pipeline.make_sources(config.data, seed=config.seed)
  for batch_R in input_pipeline.train_batches(train_source, num_replicas=8, batch_size=1024,
                                              num_train_examples=config.data.num_train_examples, start_step=0):
    ...  # Batch with shapes [R, B, ...]: replica r's slice of global step s
  eval_set = input_pipeline.eval_batch(eval_source, config.data.num_eval_examples)
  p_true = input_pipeline.eval_true_probability(eval_source, config.data.num_eval_examples)  # None for real data

Layout (docs/design.md §5): the training stream holds N examples in order. Global step s covers examples
[s R B, (s + 1) R B), and replica r reads [s R B + r B, s R B + (r + 1) B): disjoint, in stream order and aligned in
time across replicas. There are N // (R B) steps; a leftover shorter than a global step is not trained on. The
position in the stream is the step, so a run resumed from a checkpoint at step k passes `start_step=k`.
Held-out examples are the M that follow the training stream (or the first M rows of a given eval file or split).
Sources: the synthetic stream, Criteo TSV files parsed as they are read (`criteo.source`), or a prepared dataset
read through grain (`prepared.source`); lengths of 0 in the config mean all of the data (`lengths`).
"""

from collections.abc import Callable, Iterator
from concurrent import futures
import functools
from typing import Any, NamedTuple

import grain
import ml_collections
import numpy as np
import threadpoolctl

from shadowsync_jax.data import batch as batch_lib
from shadowsync_jax.data import lengths
from shadowsync_jax.data import readers as readers_lib
from shadowsync_jax.data import stream_slice
from shadowsync_jax.data import synthetic
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.criteo import files as criteo_files
from shadowsync_jax.data.criteo import source as criteo_source
from shadowsync_jax.data.prepared import manifest as prepared_manifest
from shadowsync_jax.data.stream_slice import Source  # Also names of this module (`input_pipeline.StreamSlice`).
from shadowsync_jax.data.stream_slice import StreamSlice

_GROUP_ROWS = 4096


def num_steps(num_train_examples: int, num_replicas: int, batch_size: int) -> int:
  """Global steps in one pass: N // (R B)."""
  return num_train_examples // (num_replicas * batch_size)


def read_global_batch(
  source: Source, num_replicas: int, batch_size: int, step: int, replicas: range | None = None
) -> Batch:
  """Global step `step` for the replicas in `replicas` (default: all R, in order): one contiguous read, reshaped so
  that row i is the slice of replica `replicas[i]`."""
  replicas = range(num_replicas) if replicas is None else replicas
  flat = source.read(*_step_range(num_replicas, batch_size, step, replicas))
  return Batch(*(field.reshape(len(replicas), batch_size, *field.shape[1:]) for field in flat))


def _step_range(num_replicas: int, batch_size: int, step: int, replicas: range) -> tuple[int, int]:
  """(start, count) of the examples of `replicas` at global step `step`: contiguous in the stream."""
  return (step * num_replicas + replicas.start) * batch_size, len(replicas) * batch_size


def train_batches(
  source: Source,
  num_replicas: int,
  batch_size: int,
  num_train_examples: int,
  start_step: int = 0,
  prefetch: int = 2,
  replicas: range | None = None,
) -> Iterator[Batch]:
  """Global batches [R, B, ...] for steps start_step .. N // (R B) - 1, produced by `prefetch` grain threads ahead
  of the consumer (0 = synchronously in the caller's thread). Errors in the threads are raised by `next`, after the
  steps before the failing one.

  `replicas` (a contiguous range, default all R) keeps only those replicas' rows: a process of a multi-process job
  reads its own replicas' slices and nothing else. Steps are read in groups of about `_GROUP_ROWS` of this process's
  rows, one grain element a group: grain's cost per element (its threads' hand-offs) is then paid once a group,
  which at small batches is most of the cost of reading prepared data.
  """
  steps = num_steps(num_train_examples, num_replicas, batch_size)
  if not 0 <= start_step <= steps:
    raise ValueError(f'start_step={start_step} is outside the {steps} steps of the training stream.')
  if replicas is not None and not (replicas.step == 1 and 0 <= replicas.start < replicas.stop <= num_replicas):
    raise ValueError(f'replicas={replicas} must be a non-empty contiguous range within the {num_replicas} replicas.')
  rows_per_step = (num_replicas if replicas is None else len(replicas)) * batch_size
  group = max(1, _GROUP_ROWS // rows_per_step)
  read = functools.partial(_read_steps, source, num_replicas, batch_size, replicas, steps, group)
  dataset = grain.MapDataset.range(start_step, steps, group).map(read)
  groups = iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=prefetch, prefetch_buffer_size=prefetch)))
  return _steps_of(groups)  # The groups' iterator exists already: its threads read ahead from now on.


def read_block(
  source: Source,
  num_replicas: int,
  batch_size: int,
  first_step: int,
  num_steps: int,
  block_steps: int,
  replicas: range | None = None,
  readers: readers_lib.Serial | None = None,
) -> Batch:
  """Global steps [first_step, first_step + num_steps) for the replicas in `replicas` (default all R) as one block
  [L, block_steps, B, ...]: replica first, step second (the layout `replicas.make_replicated_block` reads); the
  steps past `num_steps` are zeros (a block cut short runs the same compiled program, which never reads them).

  All R replicas: the block's examples are one contiguous range of the stream; a process's own replicas: one range
  a step, its replicas' contiguous slice. `readers` (default: `source.read` in the caller) read them, side by side
  where they are threads or processes (`BlockReader`); the block does not depend on how it was read.
  """
  replicas = range(num_replicas) if replicas is None else replicas
  readers = readers or readers_lib.Serial(source)
  if not 1 <= num_steps <= block_steps:
    raise ValueError(f'num_steps={num_steps} must be in [1, block_steps={block_steps}].')
  if len(replicas) == num_replicas:
    flat = readers.read_range(first_step * num_replicas * batch_size, num_steps * num_replicas * batch_size)
    stepwise = Batch(*(f.reshape(num_steps, num_replicas, batch_size, *f.shape[1:]) for f in flat))
  else:
    steps = range(first_step, first_step + num_steps)
    each = readers.read_ranges([_step_range(num_replicas, batch_size, step, replicas) for step in steps])
    stepwise = Batch(
      *(np.stack([f.reshape(len(replicas), batch_size, *f.shape[1:]) for f in fields]) for fields in zip(*each))
    )
  block = batch_lib.zeros(len(replicas), block_steps, batch_size)
  for into, field in zip(block, stepwise):
    into[:, :num_steps] = np.swapaxes(field, 0, 1)  # A copy: readers' buffers are theirs again after this.
  return block


@functools.cache
def pin_blas_threads() -> None:
  """numpy's BLAS runs one thread in this process from now on. The readers' matmuls are narrow (a block of examples
  by 13 or 26 x 6 columns), and OpenBLAS's pool of threads, which spin a while after each call, takes the cores the
  device's steps run on (on a CPU backend, XLA's): `benchmarks.loop` measures what that costs."""
  threadpoolctl.threadpool_limits(limits=1, user_api='blas')


class BlockReader:
  """Blocks of the training stream (`read_block`) read one ahead and put on the devices, in a thread of their own,
  while the current block trains (docs/design.md §13: double buffering).

    reader = BlockReader(source, num_replicas, batch_size, block_steps=8, replicas=range(0, 4), readers=4,
                         place=lambda block: replicas.shard(block, mesh))
    reader.prefetch(step, n)            # starts reading steps [step, step + n)
    block, placed = reader.take(step, n)   # [L, 8, B, ...] on the host and as `place` put it: the prefetched block
                                           # if it holds these steps, else read (and placed) now

  A block is read by `readers` readers side by side (`readers.make`: processes where the source can be sent to one,
  as the synthetic stream can, else threads; `processes` forces either). Errors are raised by `take`. A reader pins
  numpy's BLAS to one thread (`pin_blas_threads`). Placing the block in the reading thread keeps its copy to the
  devices off the loop's thread (on the 2-core CPU, 0.6 ms a block of 4,096 Criteo rows: a quarter of the loop's
  time a block around a step that does no work).
  """

  def __init__(
    self,
    source: Source,
    num_replicas: int,
    batch_size: int,
    block_steps: int,
    replicas: range | None = None,
    readers: int = 1,
    processes: bool | str = 'auto',
    place: Callable[[Batch], Any] = lambda block: block,
  ):
    pin_blas_threads()
    self._readers = readers_lib.make(source, readers, processes)
    read = functools.partial(read_block, source, num_replicas, batch_size, replicas=replicas, readers=self._readers)
    self._read = lambda *args: (block := read(*args), place(block))
    self.block_steps = block_steps
    self._executor = futures.ThreadPoolExecutor(1, thread_name_prefix='block-reader')
    self._pending: tuple[int, int, futures.Future] | None = None

  def prefetch(self, first_step: int, num_steps: int) -> None:
    self._pending = (first_step, num_steps, self._executor.submit(self._read, first_step, num_steps, self.block_steps))

  def take(self, first_step: int, num_steps: int) -> tuple[Batch, Any]:
    """Steps [first_step, first_step + num_steps) as a block, on the host and placed; the prefetched one if it
    starts there and holds as many steps (its steps past `num_steps` are never trained on)."""
    pending, self._pending = self._pending, None
    if pending is not None:
      block, placed = pending[2].result()
      if pending[0] == first_step and pending[1] >= num_steps and block.label.shape[1] == self.block_steps:
        return block, placed
    return self._read(first_step, num_steps, self.block_steps)

  def resize(self, block_steps: int) -> None:
    """Blocks of `block_steps` steps from now on (a prefetched block of another size is read again)."""
    self.block_steps = block_steps

  def close(self) -> None:
    """Stops reading: a block read ahead and not taken is dropped after the pieces under way (at the end of a run,
    one read past a boundary nobody reached)."""
    self._readers.close()
    self._executor.shutdown(wait=True, cancel_futures=True)


class _Steps(NamedTuple):
  """The global batches of a group of steps, up to the first that failed, and that failure."""

  batches: list[Batch]
  error: Exception | None


def _read_steps(
  source: Source, num_replicas: int, batch_size: int, replicas: range | None, steps: int, group: int, first: int
) -> _Steps:
  batches = []
  try:
    for step in range(first, min(first + group, steps)):
      batches.append(read_global_batch(source, num_replicas, batch_size, step, replicas))
  except Exception as error:  # pylint: disable=broad-except  (raised in the consumer, in stream order)
    return _Steps(batches, error)
  return _Steps(batches, None)


def _steps_of(groups: Iterator[_Steps]) -> Iterator[Batch]:
  for group in groups:
    yield from group.batches
    if group.error is not None:
      raise group.error


def make_sources(data_config: ml_collections.ConfigDict, seed: int) -> tuple[StreamSlice, StreamSlice]:
  """(training stream of N examples, held-out set of M) from the `data` config; `seed` seeds the synthetic teacher.
  Lengths of 0 mean all of the data (`lengths`). With `data.in_memory` the training stream is read whole now.

  Raises ValueError naming the config key when the files or the prepared dataset hold fewer rows than asked for.
  """
  train, held_out = _sources(data_config, seed)
  if data_config.in_memory:  # Its ids checked once, as it is read whole.
    train = StreamSlice(stream_slice.InMemory(train, len(train)), 0, len(train))
  return train, held_out


def _sources(data_config: ml_collections.ConfigDict, seed: int) -> tuple[StreamSlice, StreamSlice]:
  cardinalities = tuple(int(c) for c in data_config.cardinalities)
  num_train, num_eval = data_config.num_train_examples, data_config.num_eval_examples
  if data_config.source == 'synthetic':
    spec = synthetic.SyntheticSpec(
      seed=seed, cardinalities=cardinalities, zipf_exponent=data_config.zipf_exponent, drift=data_config.drift
    )
    stream = synthetic.SyntheticSource(spec)
    num_train, num_eval, _ = lengths.resolve(data_config)
    return StreamSlice(stream, 0, num_train, cardinalities), StreamSlice(stream, num_train, num_eval, cardinalities)
  if data_config.source == 'criteo':
    train = criteo_source.CriteoSource(criteo_files.split_paths(data_config.train_path), cardinalities)
    eval_paths = criteo_files.split_paths(data_config.eval_path)
    held_out = criteo_source.CriteoSource(eval_paths, cardinalities) if eval_paths else None
    names = (f'data.train_path={data_config.train_path!r}', f'data.eval_path={data_config.eval_path!r}')
    return _slices(train, train.file_rows, held_out, num_train, num_eval, names, cardinalities)
  if data_config.source == 'prepared':
    # Imported here: its tensorflow-datasets import costs every other run (a restart too) a few tenths of a second.
    from shadowsync_jax.data.prepared import source as prepared_source  # pylint: disable=g-import-not-at-top

    version_dir = prepared_manifest.find(data_config.prepared_dir)
    train = prepared_source.PreparedSource(version_dir, data_config.train_split)
    prepared_manifest.check_cardinalities(train.manifest, cardinalities, version_dir)
    eval_split = data_config.eval_split
    held_out = prepared_source.PreparedSource(version_dir, eval_split) if eval_split else None
    names = (f'data.train_split={data_config.train_split!r} of {version_dir}', f'data.eval_split={eval_split!r}')
    train_rows = prepared_manifest.input_rows(train.manifest, data_config.train_split)
    return _slices(train, train_rows, held_out, num_train, num_eval, names, cardinalities)
  raise ValueError(f"data.source={data_config.source!r} must be 'synthetic', 'criteo' or 'prepared'.")


def _slices(train: Source, train_rows, held_out: Source | None, num_train: int, num_eval: int, names, cardinalities):
  """The training stream and the held-out set over a file-backed source (`lengths.split_lengths`)."""
  stream = lengths.split_lengths(train_rows, None if held_out is None else len(held_out), num_train, num_eval, *names)
  train_slice = StreamSlice(train, 0, stream.num_train, cardinalities)
  if held_out is None:
    return train_slice, StreamSlice(train, stream.eval_offset, stream.num_eval, cardinalities)
  return train_slice, StreamSlice(held_out, 0, stream.num_eval, cardinalities)


def eval_batch(eval_source: Source, num_eval_examples: int) -> Batch:
  """The whole held-out set in memory (numpy), in one Batch of shapes [M, ...]."""
  return eval_source.read(0, num_eval_examples)


def eval_true_probability(eval_source: Source, num_eval_examples: int) -> np.ndarray | None:
  """The teacher's click probabilities of the held-out set (synthetic data, generated files), or None (real data)."""
  if not hasattr(eval_source, 'true_probability'):
    return None
  return eval_source.true_probability(0, num_eval_examples)
