"""The one-pass training stream, split across replicas, and the held-out set, read through grain.

  train_source, eval_source = input_pipeline.make_sources(config.data, seed=config.seed)
  for batch_R in input_pipeline.train_batches(train_source, num_replicas=8, batch_size=1024,
                                              num_train_examples=config.data.num_train_examples, start_step=0):
    ...  # Batch with shapes [R, B, ...]: replica r's slice of global step s
  eval_set = input_pipeline.eval_batch(eval_source, config.data.num_eval_examples)
  p_true = input_pipeline.eval_true_probability(eval_source, config.data.num_eval_examples)  # None for Criteo

Layout (DESIGN §5): the training stream holds N examples in order. Global step s covers examples
[s R B, (s + 1) R B), and replica r reads [s R B + r B, s R B + (r + 1) B): disjoint, in stream order and aligned in
time across replicas. There are N // (R B) steps; a leftover shorter than a global step is not trained on. The
position in the stream is the step, so a run resumed from a checkpoint at step k passes `start_step=k`.
Held-out examples are the M that follow the training stream (or the first M rows of a given eval file).
"""

from collections.abc import Iterator
import functools
from typing import Protocol

import grain
import ml_collections
import numpy as np

from shadowsync_jax.data import criteo
from shadowsync_jax.data import synthetic
from shadowsync_jax.data.batch import Batch


class Source(Protocol):
  """Anything that reads examples [start, start + count) of a stream: SyntheticSource, CriteoSource, StreamSlice."""

  def read(self, start: int, count: int) -> Batch: ...


class StreamSlice:
  """Examples [offset, offset + length) of `source`, renumbered from 0 (the training stream, the held-out set)."""

  def __init__(self, source: Source, offset: int, length: int):
    self.source, self.offset, self.length = source, offset, length

  def __len__(self) -> int:
    return self.length

  def read(self, start: int, count: int) -> Batch:
    self._check_range(start, count)
    return self.source.read(self.offset + start, count)

  def true_probability(self, start: int, count: int) -> np.ndarray | None:
    """The true click probabilities where the source knows them (synthetic data), else None."""
    if not hasattr(self.source, 'true_probability'):
      return None
    self._check_range(start, count)
    return self.source.true_probability(self.offset + start, count)

  def _check_range(self, start: int, count: int) -> None:
    if start < 0 or count < 0 or start + count > self.length:
      raise ValueError(f'cannot read examples [{start}, {start + count}) of a stream of {self.length}.')


def num_steps(num_train_examples: int, num_replicas: int, batch_size: int) -> int:
  """Global steps in one pass: N // (R B)."""
  return num_train_examples // (num_replicas * batch_size)


def read_global_batch(
  source: Source, num_replicas: int, batch_size: int, step: int, replicas: range | None = None
) -> Batch:
  """Global step `step` for the replicas in `replicas` (default: all R, in order): one contiguous read, reshaped so
  that row i is the slice of replica `replicas[i]`."""
  replicas = range(num_replicas) if replicas is None else replicas
  flat = source.read((step * num_replicas + replicas.start) * batch_size, len(replicas) * batch_size)
  return Batch(*(field.reshape(len(replicas), batch_size, *field.shape[1:]) for field in flat))


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
  of the consumer (0 = synchronously in the caller's thread). Errors in the threads are raised by `next`.

  `replicas` (a contiguous range, default all R) keeps only those replicas' rows: a process of a multi-process job
  reads its own replicas' slices and nothing else.
  """
  steps = num_steps(num_train_examples, num_replicas, batch_size)
  if not 0 <= start_step <= steps:
    raise ValueError(f'start_step={start_step} is outside the {steps} steps of the training stream.')
  if replicas is not None and not (replicas.step == 1 and 0 <= replicas.start < replicas.stop <= num_replicas):
    raise ValueError(f'replicas={replicas} must be a non-empty contiguous range within the {num_replicas} replicas.')
  read_step = functools.partial(read_global_batch, source, num_replicas, batch_size, replicas=replicas)
  dataset = grain.MapDataset.range(start_step, steps).map(read_step)
  return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=prefetch, prefetch_buffer_size=prefetch)))


def make_sources(data_config: ml_collections.ConfigDict, seed: int) -> tuple[StreamSlice, StreamSlice]:
  """(training stream of N examples, held-out set of M) from the `data` config; `seed` seeds the synthetic teacher.

  Raises ValueError naming the config key when a Criteo file has fewer rows than asked for.
  """
  num_train, num_eval = data_config.num_train_examples, data_config.num_eval_examples
  cardinalities = tuple(int(c) for c in data_config.cardinalities)
  if data_config.source == 'synthetic':
    spec = synthetic.SyntheticSpec(
      seed=seed, cardinalities=cardinalities, zipf_exponent=data_config.zipf_exponent, drift=data_config.drift
    )
    stream = synthetic.SyntheticSource(spec)
    return StreamSlice(stream, 0, num_train), StreamSlice(stream, num_train, num_eval)
  if data_config.source == 'criteo':
    return _criteo_sources(data_config.train_path, data_config.eval_path, num_train, num_eval, cardinalities)
  raise ValueError(f"data.source={data_config.source!r} must be 'synthetic' or 'criteo'.")


def _criteo_sources(
  train_path: str, eval_path: str, num_train: int, num_eval: int, cardinalities: tuple[int, ...]
) -> tuple[StreamSlice, StreamSlice]:
  train_file = criteo.CriteoSource(train_path, cardinalities)
  needed = num_train if eval_path else num_train + num_eval
  if len(train_file) < needed:
    what = '' if eval_path else ' + data.num_eval_examples (data.eval_path is empty: eval follows training)'
    raise ValueError(
      f'data.num_train_examples{what} = {needed} exceeds the {len(train_file)} rows of data.train_path={train_path!r}.'
    )
  if not eval_path:
    return StreamSlice(train_file, 0, num_train), StreamSlice(train_file, num_train, num_eval)
  eval_file = criteo.CriteoSource(eval_path, cardinalities)
  if len(eval_file) < num_eval:
    raise ValueError(
      f'data.num_eval_examples={num_eval} exceeds the {len(eval_file)} rows of data.eval_path={eval_path!r}.'
    )
  return StreamSlice(train_file, 0, num_train), StreamSlice(eval_file, 0, num_eval)


def eval_batch(eval_source: Source, num_eval_examples: int) -> Batch:
  """The whole held-out set in memory (numpy), in one Batch of shapes [M, ...]."""
  return eval_source.read(0, num_eval_examples)


def eval_true_probability(eval_source: Source, num_eval_examples: int) -> np.ndarray | None:
  """The teacher's click probabilities of the held-out set (synthetic data), or None (real data)."""
  if not hasattr(eval_source, 'true_probability'):
    return None
  return eval_source.true_probability(0, num_eval_examples)
