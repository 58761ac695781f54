"""The synthetic stream generated on the device: the same hashes, Zipf ranks, ids and teacher as `synthetic`, in
jax.numpy, so a block of training examples is made where it trains and never crosses from the host.

  source = synthetic.SyntheticSource(spec)
  generate = synthetic_device.DeviceGenerator(source)
  batch = generate(start, count)          # Batch of jax arrays: examples start..start+count-1 of the stream
  batch, p = generate.with_probability(start, count)

Every value is a pure function of (seed, example index), computed by the host generator's formulas: ids are the
host's exactly (integer hashes, the Zipf inverse CDF's integer thresholds and its float64 tail, checked against its
integer boundaries as the host does). The float32 math (the dense features' exp and log, the teacher's sums) runs in
XLA's kernels rather than numpy's, so a dense feature may differ from the host's in its last bit and a probability
by ~1e-7; a label then differs only where its uniform draw lies that close to the probability
(tests/data/test_synthetic_device.py bounds all three). The stream's Bayes floor is the device generator's own
probabilities; the held-out set, and with it the floor a run reports, stays the host's.

The generator needs 64-bit integers and floats (splitmix64, the tail's CDF): it is traced and called under
`jax.enable_x64`, inside its own jitted functions, so nothing else of a run changes width. Its tables are the host
source's (head ids and effects, Zipf thresholds, the teacher's calibrated parameters), put on the device once:
about 26 (2^15 + 1) x (K + 4) words for the largest cardinalities.
"""

import functools
import math

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from shadowsync_jax.data import counter_hash
from shadowsync_jax.data import synthetic
from shadowsync_jax.data import zipf as zipf_lib
from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch

_TWO_32 = 2**32
# Steps of the tail rank's check against D(k) after the float64 inverse CDF. The host loops until none moves; the
# inverse is within one rank of D's (a half-draw rounding), so one step suffices; the second is a margin.
_TAIL_FIX_STEPS = 2


def _uint32_words(hashes):
  """uint32 [..., 2 H] from uint64 [..., H]: numpy's little-endian `.view(np.uint32)`."""
  low = (hashes & jnp.uint64(0xFFFFFFFF)).astype(jnp.uint32)
  high = (hashes >> jnp.uint64(32)).astype(jnp.uint32)
  return jnp.stack([low, high], axis=-1).reshape(*hashes.shape[:-1], -1)


def _uint16_words(hashes, count: int):
  """The first `count` uint16s of numpy's `.view(np.uint16)` of uint64 [..., H], as int32 [..., count]."""
  columns = [(hashes[..., k // 4] >> jnp.uint64(16 * (k % 4))) & jnp.uint64(0xFFFF) for k in range(count)]
  return jnp.stack(columns, axis=-1).astype(jnp.int32)


class DeviceGenerator:
  """Examples of `source`'s stream made by jitted jax functions, on the default device or inside a caller's jit
  (`examples(index)`, traced under `jax.enable_x64`)."""

  def __init__(self, source: synthetic.SyntheticSource):
    spec, zipf, teacher = source.spec, source._zipf, source._teacher  # pylint: disable=protected-access
    self.spec = spec
    self._key = source._key  # pylint: disable=protected-access
    self._effects_key = source._effects._key  # pylint: disable=protected-access
    self._effect_words = source._effects._words  # pylint: disable=protected-access
    self._dim = spec.teacher_embedding_dim
    self._tail_tables = tuple(int(t) for t in np.flatnonzero(zipf.sentinels >= 0))
    guide_low, guide_high = _guide_bounds(zipf)
    self._search_steps = math.ceil(math.log2(int((guide_high - guide_low).max()) + 1))
    self._slope = float(zipf._slope)  # pylint: disable=protected-access
    with _x64():
      f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))
      i64 = lambda x: jnp.asarray(np.asarray(x, np.int64))
      self._tables = {
        'last_draw': jnp.asarray(zipf.last_draw.astype(np.uint32)),
        'offsets_T': jnp.asarray(zipf.offsets.astype(np.int32)),
        'guide_low': jnp.asarray(guide_low),
        'guide_high': jnp.asarray(guide_high),
        'guide_shift_T': jnp.asarray(zipf.guide_shift.astype(np.uint32)),
        'guide_offsets_T': jnp.asarray(zipf.guide_offsets.astype(np.int32)),
        'sentinels_T': i64(zipf.sentinels),
        'sizes_T': i64(zipf.sizes),
        'head_sizes_T': i64(zipf.head_sizes),
        'tail_start_T': i64(zipf.tail_start),
        'tail_low_T': f64(zipf._tail_low),  # pylint: disable=protected-access
        'tail_shape_T': f64(np.where(zipf._tail_shape > 0, zipf._tail_shape, 1.0)),  # pylint: disable=protected-access
        'multipliers_T': i64(source._permutation.multipliers),  # pylint: disable=protected-access
        'shifts_T': i64(source._permutation.shifts),  # pylint: disable=protected-access
        'head_ids': jnp.asarray(source._head_ids.astype(np.int32)),  # pylint: disable=protected-access
        'head_effects': jnp.asarray(source._head_effects.astype(np.float32)),  # pylint: disable=protected-access
        'quantiles': jnp.asarray(source._effects._quantiles),  # pylint: disable=protected-access
        'log_location_F': jnp.asarray(source._log_location_F),  # pylint: disable=protected-access
        'log_scale_F': jnp.asarray(source._log_scale_F),  # pylint: disable=protected-access
        **{name: jnp.asarray(np.asarray(value, np.float32)) for name, value in vars(teacher).items() if name != 'bias'},
      }
    self._bias = float(teacher.bias)
    self._read = jax.jit(self._examples_from, static_argnums=1)

  def __call__(self, start: int, count: int) -> Batch:
    return self.with_probability(start, count)[0]

  def with_probability(self, start: int, count: int) -> tuple[Batch, jax.Array]:
    """Examples [start, start + count) and the teacher's click probabilities (float32), on the default device."""
    with _x64():
      return self._read(jnp.int64(start), count)

  def _examples_from(self, start, count: int):
    return self.examples(start + jnp.arange(count, dtype=jnp.int64))

  def examples(self, index_N) -> tuple[Batch, jax.Array]:
    """The examples of int64 stream indices `index_N` (any shape [...]): Batch and probabilities of that shape.
    Must be traced under `jax.enable_x64(True)`."""
    shape, index_N = index_N.shape, index_N.reshape(-1)
    t = self._tables
    counter = index_N[:, None].astype(jnp.uint64) * jnp.uint64(synthetic._WORDS_PER_EXAMPLE)  # pylint: disable=protected-access
    counter = counter + jnp.arange(synthetic._WORDS_PER_EXAMPLE, dtype=jnp.uint64)  # pylint: disable=protected-access
    draws = _uint32_words(counter_hash.splitmix64(counter, self._key, jnp))
    draws_NxT = draws[:, :NUM_SPARSE_FEATURES]
    dense_draws_NxF = draws[:, NUM_SPARSE_FEATURES : NUM_SPARSE_FEATURES + NUM_DENSE_FEATURES]
    dense_NxF = synthetic._dense_features(dense_draws_NxF, t['log_location_F'], t['log_scale_F'], jnp)  # pylint: disable=protected-access
    entry_NxT = self._head_entries(draws_NxT)
    ids_NxT = jnp.take(t['head_ids'], entry_NxT, axis=0)
    rows_NxTxW = jnp.take(t['head_effects'], entry_NxT, axis=0)
    if self._tail_tables:  # Tables with a tail: its draws' ranks, ids and effects, computed for every draw.
      tails = jnp.asarray(self._tail_tables)
      is_tail_NxU = entry_NxT[:, tails] == t['sentinels_T'][tails]
      rank_NxU, probability_NxU = self._tail_ranks(tails, draws_NxT[:, tails].astype(jnp.int64))
      tail_ids = ((t['multipliers_T'][tails] * rank_NxU + t['shifts_T'][tails]) % t['sizes_T'][tails]).astype(jnp.int32)
      tail_ids = jnp.where(is_tail_NxU, tail_ids, ids_NxT[:, tails])
      tail_rows = jnp.where(
        is_tail_NxU[..., None], self._effects(tails, rank_NxU, probability_NxU), rows_NxTxW[:, tails]
      )
      column = {table: u for u, table in enumerate(self._tail_tables)}  # Columns put back in place, not scattered.
      pick = lambda head, tail: jnp.stack(
        [tail[:, column[c]] if c in column else head[:, c] for c in range(NUM_SPARSE_FEATURES)], axis=1
      )
      ids_NxT, rows_NxTxW = pick(ids_NxT, tail_ids), pick(rows_NxTxW, tail_rows)
    angle_N = None
    if self.spec.drift:
      scale = 0.5 * np.pi * self.spec.drift / self.spec.drift_horizon
      angle_N = (scale * index_N.astype(jnp.float64)).astype(jnp.float32)
    logit_N = self._bias + self._logit(dense_NxF, rows_NxTxW.reshape(len(index_N), -1), angle_N)
    probability_N = 1.0 / (1.0 + jnp.exp(-logit_N.astype(jnp.float64)))
    label_N = (draws[:, NUM_SPARSE_FEATURES + NUM_DENSE_FEATURES].astype(jnp.float64) + 0.5) * 2.0**-32 < probability_N
    batch = Batch(
      dense=dense_NxF.reshape(*shape, NUM_DENSE_FEATURES),
      sparse=ids_NxT.reshape(*shape, NUM_SPARSE_FEATURES),
      label=label_N.astype(jnp.float32).reshape(shape),
    )
    return batch, probability_N.astype(jnp.float32).reshape(shape)

  def _head_entries(self, draws_NxT):
    """`zipf.ZipfTables.sample`'s head entries: the first entry of the draw's table whose last draw is >= it, by a
    binary search between the first and last entries the draw's guide bucket can reach (`_guide_bounds`)."""
    t = self._tables
    bucket = (draws_NxT >> t['guide_shift_T']).astype(jnp.int32) + t['guide_offsets_T']
    low = jnp.take(t['guide_low'], bucket) + t['offsets_T']
    high = jnp.take(t['guide_high'], bucket) + t['offsets_T']

    def narrow(_, bounds):
      low, high = bounds
      middle = (low + high) // 2
      below = jnp.take(t['last_draw'], middle) < draws_NxT
      return jnp.where(below, middle + 1, low), jnp.where(below, high, middle)

    return lax.fori_loop(0, self._search_steps, narrow, (low, high), unroll=True)[0]

  def _tail_boundary(self, tables, rank):
    """`ZipfTables._tail_boundary`: D(k), int64."""
    t = self._tables
    start = t['tail_start_T'][tables]
    ratio = jnp.log((rank.astype(jnp.float64) + 0.5) / t['tail_low_T'][tables])
    shape = jnp.expm1(self._slope * ratio) / self._slope if self._slope else ratio
    cdf = shape / t['tail_shape_T'][tables]
    return jnp.clip(start + jnp.ceil((_TWO_32 - start) * cdf - 0.5).astype(jnp.int64), start, _TWO_32)

  def _tail_ranks(self, tables, draw):
    """`ZipfTables._tail_ranks`: G's inverse, then `_TAIL_FIX_STEPS` steps of the check against D (the host
    loops until every rank holds its draw). Returns the ranks and P(rank), the width of their draw interval
    [D(k), D(k + 1)) over 2^32."""
    t = self._tables
    start = t['tail_start_T'][tables]
    draw = jnp.maximum(draw, start)  # A head draw (its rank unused) must not walk down into the head.
    cdf = (draw - start + 0.5) / (_TWO_32 - start)
    shape = cdf * t['tail_shape_T'][tables]
    log_ratio = jnp.log1p(self._slope * shape) / self._slope if self._slope else shape
    x = t['tail_low_T'][tables] * jnp.exp(log_ratio)
    rank = jnp.clip(jnp.floor(x - 0.5).astype(jnp.int64), t['head_sizes_T'][tables], t['sizes_T'][tables] - 1)

    def check(rank):
      first, stop = self._tail_boundary(tables, rank), self._tail_boundary(tables, rank + 1)
      return (draw >= stop).astype(jnp.int64) - (draw < first).astype(jnp.int64), stop - first

    for _ in range(_TAIL_FIX_STEPS):  # Unrolled: a while loop's test would make the host wait for the device.
      rank = rank + check(rank)[0]
    return rank, check(rank)[1].astype(jnp.float64) * 2.0**-32  # A rank still off (never seen): tests compare.

  def _effects(self, tables, rank, probability):
    """`synthetic._IdEffects` of tail ranks of the given probabilities: float32 [..., K + 2]."""
    t, words = self._tables, self._effect_words
    counter = (tables.astype(jnp.uint64) << jnp.uint64(32)) + rank.astype(jnp.uint64)
    hashes = counter_hash.splitmix64(
      counter[..., None] * jnp.uint64(words) + jnp.arange(words, dtype=jnp.uint64), self._effects_key, jnp
    )
    normal = jnp.take(t['quantiles'], _uint16_words(hashes, self._dim + 2))
    expected = probability * self.spec.shrink_reference_examples
    shrink = (expected / jnp.maximum(expected + self.spec.shrink_count, 1e-300)).astype(jnp.float32)
    scale = jnp.concatenate(
      [jnp.broadcast_to(jnp.sqrt(shrink)[..., None], (*shrink.shape, self._dim)), jnp.stack([shrink, shrink], -1)], -1
    )
    return normal * scale

  def _logit(self, dense_NxF, unit_rows_NxTW, angle_N):
    """`synthetic._Teacher.logit`, less the bias."""
    t = self._tables
    x_NxF = (dense_NxF - t['dense_mean_F']) / t['dense_std_F']
    hidden_NxH = jnp.tanh(x_NxF @ t['hidden_in_FxH'] + t['hidden_bias_H'])
    scale_W = t['effect_scale_W']
    width = scale_W.shape[0]
    dim, num_tables = width - 2, unit_rows_NxTW.shape[1] // width
    sums_NxW = unit_rows_NxTW.reshape(-1, num_tables, width).sum(axis=1) * scale_W
    square_scale_W = jnp.where(jnp.arange(width) < dim, jnp.square(scale_W), jnp.float32(0))
    squares_N = (jnp.square(unit_rows_NxTW).reshape(-1, num_tables, width).sum(axis=1) * square_scale_W).sum(axis=1)
    embedding_sum_NxK = sums_NxW[:, :dim]
    first_order_N = sums_NxW[:, dim]
    if angle_N is not None:
      first_order_N = jnp.cos(angle_N) * first_order_N + jnp.sin(angle_N) * sums_NxW[:, dim + 1]
    return (
      x_NxF @ t['dense_linear_F']
      + hidden_NxH @ t['hidden_out_H']
      + first_order_N
      + 0.5 * (jnp.sum(embedding_sum_NxK * embedding_sum_NxK, axis=1) - squares_N)
      + jnp.sum(embedding_sum_NxK * (hidden_NxH @ t['cross_HxK']), axis=1)
    )


class DeviceBlockReader:
  """`input_pipeline.BlockReader`'s interface for the synthetic training stream, its blocks generated on the
  devices of `mesh` (one replica a device, sharded over `axis` like `replicas.shard`'s), not read on the host:

    reader = DeviceBlockReader(generator, num_replicas=8, batch_size=256, block_steps=64, replicas=range(0, 4),
                               mesh=meshes.local, axis='replica')
    reader.prefetch(step, n)      # dispatches the generation of steps [step, step + n): it runs before the next block
    block = reader.take(step, n)  # [L, 64, B, ...] jax arrays; steps past n are zeros, as `read_block`'s

  The values are `read_block`'s of the host stream but for the float32 differences the module docstring bounds.
  `offset` is the stream index of the slice's example 0 (the training stream's: 0).
  """

  def __init__(
    self,
    generator: DeviceGenerator,
    num_replicas: int,
    batch_size: int,
    block_steps: int,
    replicas: range,
    mesh: jax.sharding.Mesh,
    axis: str,
    offset: int = 0,
  ):
    self._first_replica, self._offset = replicas.start, offset
    self.block_steps = block_steps
    spec = jax.sharding.PartitionSpec(axis)

    def per_device(first_step, num_steps, block_steps):
      replica = self._first_replica + lax.axis_index(axis)
      step_K = first_step + jnp.arange(block_steps, dtype=jnp.int64)
      row_KxB = (step_K[:, None] * num_replicas + replica) * batch_size + jnp.arange(batch_size, dtype=jnp.int64)
      batch, _ = generator.examples(self._offset + row_KxB)
      trained_K = jnp.arange(block_steps) < num_steps
      zeroed = lambda x: jnp.where(trained_K.reshape(-1, *([1] * (x.ndim - 1))), x, jnp.zeros_like(x))
      return jax.tree.map(lambda x: zeroed(x)[None], batch)

    def block(first_step, num_steps, block_steps: int):
      generate = functools.partial(per_device, block_steps=block_steps)
      return jax.shard_map(
        generate, mesh=mesh, in_specs=(jax.sharding.PartitionSpec(),) * 2, out_specs=spec, check_vma=False
      )(first_step, num_steps)

    self._block = jax.jit(block, static_argnums=2, out_shardings=jax.sharding.NamedSharding(mesh, spec))
    self._pending: tuple[int, int, int, Batch] | None = None

  def _generate(self, first_step: int, num_steps: int) -> Batch:
    with _x64():
      return self._block(jnp.int64(first_step), jnp.int64(num_steps), self.block_steps)

  def prefetch(self, first_step: int, num_steps: int) -> None:
    self._pending = (first_step, num_steps, self.block_steps, self._generate(first_step, num_steps))

  def take(self, first_step: int, num_steps: int) -> tuple[Batch, Batch]:
    """Steps [first_step, first_step + num_steps): the prefetched block if it starts there and holds as many; twice,
    as `input_pipeline.BlockReader.take` gives a block on the host and placed (this one is made where it trains)."""
    pending, self._pending = self._pending, None
    if pending is not None and pending[0] == first_step and pending[1] >= num_steps and pending[2] == self.block_steps:
      return pending[3], pending[3]
    block = self._generate(first_step, num_steps)
    return block, block

  def resize(self, block_steps: int) -> None:
    """Blocks of `block_steps` from now on; their program compiled now (a block of no step), not in the first
    block's time."""
    self.block_steps = block_steps
    jax.block_until_ready(self._generate(0, 0))

  def close(self) -> None:
    self._pending = None


def _x64():
  """64-bit types inside the block: `jax.enable_x64` (a context manager since jax 0.7), or its older name."""
  enable = getattr(jax, 'enable_x64', None)
  return enable(True) if enable is not None else jax.experimental.enable_x64()  # pylint: disable=no-member


def _guide_bounds(zipf: zipf_lib.ZipfTables) -> tuple[np.ndarray, np.ndarray]:
  """int32 (first, last) entry within its table that a draw of each guide bucket can land on: the host's guide, and
  the entry of the bucket's last draw. At Criteo Kaggle's cardinalities a bucket spans at most 21 entries."""
  highs = []
  for table in range(zipf.sizes.size):
    head = zipf.last_draw[zipf.offsets[table] : zipf.offsets[table] + zipf.entries[table]].astype(np.int64)
    shift, bits = int(zipf.guide_shift[table]), 32 - int(zipf.guide_shift[table])
    last_draws = ((np.arange(2**bits, dtype=np.int64) + 1) << shift) - 1
    highs.append(np.searchsorted(head, last_draws, side='left'))
  return zipf.guide.astype(np.int32), np.concatenate(highs).astype(np.int32)
