"""The synthetic stream generated on the device is the host's: the same ids, the same labels, dense features and
probabilities within the float32 differences of XLA's kernels; blocks laid out as the host's blocks."""

import jax
from jax.sharding import Mesh
import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import config as config_lib
from shadowsync_jax import dispatch
from shadowsync_jax import train
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.data import synthetic
from shadowsync_jax.data import synthetic_device

# Tables past the Zipf head (2^15 ranks) draw tail ranks: several sizes of tail, a table of one row, a small one.
_WITH_TAILS = (40_000, 1, 3, 1000, 10_000_000, 2**15, 2**15 + 1, 500_000) + (300,) * 18


@pytest.mark.parametrize(
  'spec',
  [
    synthetic.SyntheticSpec(seed=3),
    synthetic.SyntheticSpec(seed=1, cardinalities=_WITH_TAILS, drift=0.5, zipf_exponent=1.0),
    synthetic.SyntheticSpec(seed=2, cardinalities=_WITH_TAILS, zipf_exponent=1.2, teacher_embedding_dim=6),
  ],
  ids=['default', 'tails_drift_exponent_1', 'tails_wider_teacher'],
)
def test_the_device_stream_is_the_host_stream(spec):
  host = synthetic.SyntheticSource(spec)
  start, count = 987_654_321, 16_384
  expected, expected_p = host.read_with_probability(start, count)
  batch, p = jax.tree.map(np.asarray, synthetic_device.DeviceGenerator(host).with_probability(start, count))
  np.testing.assert_array_equal(batch.sparse, expected.sparse)  # Integer math: the host's ids exactly.
  # XLA's float32 exp and log differ from numpy's in the last bits: log(1 + count) in its last bits, and a count at a
  # floor's edge by one (rarely), the logit with it.
  counts, expected_counts = (np.expm1(x.astype(np.float64)) for x in (batch.dense, expected.dense))
  off = np.abs(counts - expected_counts)
  close = off <= 1e-5 * expected_counts  # The last bits of log(1 + count), up to counts of 1e9 and more.
  assert np.all(off <= 1 + 1e-5 * expected_counts) and np.mean(~close) < 1e-3  # Or one count apart, rarely.
  np.testing.assert_allclose(batch.dense[close], expected.dense[close], rtol=1e-6)
  assert np.mean(batch.dense != expected.dense) < 0.02
  np.testing.assert_allclose(p, expected_p, atol=2e-3)
  differ = batch.label != expected.label  # Only where the label's uniform lies within the probabilities' gap.
  assert np.sum(differ) <= 2 and np.all(np.abs(expected_p[differ] - p[differ]) > 0)
  assert batch.dense.dtype == np.float32 and batch.sparse.dtype == np.int32 and batch.label.dtype == np.float32


@pytest.mark.parametrize('exponent', [1.0, 1.3])
def test_tail_ranks_are_the_hosts_on_half_a_million_draws(exponent):
  """The tail's inverse CDF takes a fixed number of check steps on the device (the host loops): the same ranks on
  draws spread over the whole tail of tables from just past the head to 40M rows."""
  cardinalities = (2**15 + 2, 100_000, 3_000_000, 40_000_000) + (10,) * 22
  host = synthetic.SyntheticSource(synthetic.SyntheticSpec(cardinalities=cardinalities, zipf_exponent=exponent))
  generator = synthetic_device.DeviceGenerator(host)
  tables = np.repeat(np.arange(4), 1 << 17)
  starts = host._zipf.tail_start[tables]
  rng = np.random.default_rng(0)
  draws = starts + (rng.random(tables.size) * (2**32 - starts)).astype(np.int64)
  # Half of them on the edges of a rank's draws, D(k) and D(k) - 1, where the inverse's rounding needs the checks.
  ranks = (host._zipf.head_sizes[tables] + rng.random(tables.size) * (host._zipf.sizes[tables] - 2**15)).astype(
    np.int64
  )
  edges = host._zipf._tail_boundary(tables, ranks) - rng.integers(0, 2, tables.size)
  draws = np.where(np.arange(tables.size) % 2 == 0, draws, np.maximum(edges, starts))
  expected = host._zipf._tail_ranks(tables, draws)
  with synthetic_device._x64():
    ranks, probability = jax.jit(generator._tail_ranks)(jax.numpy.asarray(tables), jax.numpy.asarray(draws))
  np.testing.assert_array_equal(np.asarray(ranks), expected)
  np.testing.assert_array_equal(np.asarray(probability), host._zipf.probability(tables, expected))


def test_a_generated_block_is_the_block_read_on_the_host():
  """Replica first, step second, this process's replicas only, zeros past the steps asked for; a prefetched block
  serves the steps it holds; another is generated."""
  stream = input_pipeline.StreamSlice(synthetic.SyntheticSource(synthetic.SyntheticSpec(seed=4)), 1000, 10**6)
  generator = synthetic_device.DeviceGenerator(stream.source)
  mesh = Mesh(np.array(jax.devices()[:2]), ('replica',))
  reader = synthetic_device.DeviceBlockReader(generator, 8, 64, 5, range(2, 4), mesh, 'replica', offset=1000)
  expected = input_pipeline.read_block(stream, 8, 64, 3, 4, 5, replicas=range(2, 4))
  reader.prefetch(3, 4)
  block, placed = reader.take(3, 4)
  assert placed is block  # Made where it trains.
  assert block.sparse.sharding.spec == jax.sharding.PartitionSpec('replica')
  np.testing.assert_array_equal(np.asarray(block.sparse), expected.sparse)
  # A feature is log(1 + count): its count off by one at most (at a floor's edge, XLA's exp against numpy's), or in
  # the last bits of the log (`test_the_device_stream_is_the_host_stream`).
  counts, expected_counts = (np.expm1(np.asarray(x, np.float64)) for x in (block.dense, expected.dense))
  assert np.all(np.abs(counts - expected_counts) <= 1 + 1e-5 * expected_counts)
  assert np.mean(np.asarray(block.dense) != expected.dense) < 0.02
  assert not np.asarray(block.label)[:, 4:].any() and not np.asarray(block.sparse)[:, 4:].any()
  reader.prefetch(7, 5)
  other, _ = reader.take(0, 1)  # Not the prefetched steps: generated now.
  np.testing.assert_array_equal(
    np.asarray(other.sparse), input_pipeline.read_block(stream, 8, 64, 0, 1, 5, range(2, 4)).sparse
  )
  reader.close()


def test_training_on_the_device_stream_learns_as_on_the_host(tmp_path):
  """The tiny config on 8 replicas, its stream generated on the devices: the same quality as read on the host
  (the streams differ only in float32 bits), and `auto` keeps the host on CPU."""
  config = default.get_config('tiny')
  config.num_replicas, config.batch_size, config.data.num_train_examples = 8, 32, 16_384
  assert not dispatch.generates_on_device(config)  # 'auto' on a CPU backend.
  on_host = train.train_and_evaluate(config, tmp_path / 'host')
  config.data.generator = 'device'
  on_device = train.train_and_evaluate(config, tmp_path / 'device')
  assert on_device['bayes_ne'] == on_host['bayes_ne']  # The held-out set is the host's.
  assert on_device['eval_ne'] == pytest.approx(on_host['eval_ne'], rel=2e-3)


def test_the_device_generator_makes_only_the_synthetic_stream():
  config = default.get_config('tiny')
  config.data.generator = 'gpu'
  with pytest.raises(config_lib.ConfigError, match="data.generator='gpu'"):
    config_lib.validate(config_lib.resolve(config, 1), num_devices=8, num_processes=1)
  config.data.generator, config.data.source, config.data.train_path = 'device', 'criteo', __file__
  with pytest.raises(config_lib.ConfigError, match="data.generator='device'"):
    config_lib.validate(config_lib.resolve(config, 1), num_devices=8, num_processes=1)
