"""Tests of the synthetic teacher stream: determinism by index, feature distributions, labels and the Bayes floor;
the Zipf sampler, the rank -> id permutation and the per-id effects, which hold no per-row state at any table size."""

import time

import numpy as np
import pytest

from experiments.configs import criteo_terabyte
from shadowsync_jax.data import synthetic
from shadowsync_jax.data import zipf
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.metrics import ctr

MIXED_CARDINALITIES = (3, 10, 100, 1000, 5000, 200_000) + (50,) * 20  # 200_000: a head and a tail.


@pytest.fixture(scope='module')
def source() -> synthetic.SyntheticSource:
  return synthetic.SyntheticSource(synthetic.SyntheticSpec(seed=3, cardinalities=MIXED_CARDINALITIES))


@pytest.fixture(scope='module')
def sample(source) -> tuple[Batch, np.ndarray]:
  return source.read_with_probability(0, 60_000)


def _assert_batches_equal(a: Batch, b: Batch) -> None:
  for name, x, y in zip(Batch._fields, a, b):
    np.testing.assert_array_equal(x, y, err_msg=name)


def test_read_is_a_function_of_the_index_alone(source):
  whole = source.read(10, 100)
  parts = [source.read(10, 37), source.read(47, 63)]
  _assert_batches_equal(whole, Batch(*(np.concatenate(f) for f in zip(*parts))))
  # Across the internal chunk boundary (4096), and against a fresh source of the same spec.
  long = source.read(4000, 200)
  again = synthetic.SyntheticSource(source.spec).read(4090, 20)
  _assert_batches_equal(Batch(*(f[90:110] for f in long)), again)


def test_true_probability_matches_read_with_probability(source):
  batch, probability = source.read_with_probability(123, 500)
  np.testing.assert_array_equal(source.true_probability(123, 500), probability)
  _assert_batches_equal(source.read(123, 500), batch)


def test_seeds_give_different_streams():
  a = synthetic.SyntheticSource(synthetic.SyntheticSpec(seed=0)).read(0, 1000)
  b = synthetic.SyntheticSource(synthetic.SyntheticSpec(seed=1)).read(0, 1000)
  assert np.mean(a.sparse == b.sparse) < 0.2
  assert not np.array_equal(a.dense, b.dense)


def test_shapes_dtypes_and_ranges(sample):
  batch, probability = sample
  assert batch.dense.shape == (60_000, 13) and batch.dense.dtype == np.float32
  assert batch.sparse.shape == (60_000, 26) and batch.sparse.dtype == np.int32
  assert batch.label.shape == (60_000,) and batch.label.dtype == np.float32
  assert probability.shape == (60_000,) and probability.dtype == np.float32
  assert np.all(batch.sparse >= 0) and np.all(batch.sparse < np.array(MIXED_CARDINALITIES))
  assert set(np.unique(batch.label)) == {0.0, 1.0}
  assert np.all((probability > 0) & (probability < 1))


def test_dense_features_are_log1p_of_heavy_tailed_counts(sample):
  dense = sample[0].dense.astype(np.float64)
  counts = np.expm1(dense)
  np.testing.assert_allclose(counts, np.round(counts), rtol=1e-5, atol=1e-3)  # log(1 + integer count)
  assert np.all(counts >= 0)
  assert np.mean(counts == 0) > 0.02  # zeros are common, as in Criteo
  assert np.all(np.percentile(counts, 99.9, axis=0) > 10 * np.maximum(np.median(counts, axis=0), 1))  # heavy tails
  assert len(np.unique(np.round(np.median(dense, axis=0), 1))) > 5  # each feature has its own scale


def test_categorical_ids_follow_scattered_zipf(sample, source):
  sparse = sample[0].sparse
  exponent = source.spec.zipf_exponent
  for table in (3, 4):  # cardinalities 1000 and 5000
    cardinality = MIXED_CARDINALITIES[table]
    p_rank = np.arange(1, cardinality + 1, dtype=np.float64) ** -exponent
    p_rank /= p_rank.sum()
    frequency = np.sort(np.bincount(sparse[:, table], minlength=cardinality))[::-1] / len(sparse)
    np.testing.assert_allclose(frequency[:5], p_rank[:5], rtol=0.06)
    np.testing.assert_allclose(frequency[:100].sum(), p_rank[:100].sum(), rtol=0.02)
  top_ids = [np.bincount(sparse[:, t]).argmax() for t in range(3, 26)]
  assert len(set(top_ids)) > 10  # the frequent ids are permuted, not always id 0


def test_mean_ctr_and_labels_are_calibrated_to_the_probabilities(sample):
  batch, probability = sample
  assert abs(batch.label.mean() - 0.25) < 0.01
  assert abs(probability.mean() - 0.25) < 0.01
  bins = np.digitize(probability, [0.1, 0.2, 0.35, 0.5, 0.7])
  for b in np.unique(bins):
    in_bin = bins == b
    if in_bin.sum() > 1000:
      assert abs(batch.label[in_bin].mean() - probability[in_bin].mean()) < 0.03, b


def test_bayes_ne_is_the_ne_formula_on_true_probabilities(sample):
  batch, probability = sample
  y, p = batch.label.astype(np.float64), np.clip(probability.astype(np.float64), 1e-12, 1 - 1e-12)
  m = y.mean()
  expected = np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))) / -(m * np.log(m) + (1 - m) * np.log(1 - m))
  assert ctr.normalized_entropy(batch.label, probability) == pytest.approx(expected, rel=1e-9)
  assert 0.5 < expected < 0.9  # the teacher is informative, but far from deterministic


def test_scales_set_the_signal_of_each_term():
  no_signal = synthetic.SyntheticSpec(
    dense_linear_scale=0, dense_nonlinear_scale=0, first_order_scale=0, pairwise_scale=0, dense_cross_scale=0
  )
  batch, probability = synthetic.SyntheticSource(no_signal).read_with_probability(0, 2000)
  np.testing.assert_allclose(probability, 0.25, atol=1e-4)
  first_order_only = synthetic.SyntheticSpec(
    dense_linear_scale=0, dense_nonlinear_scale=0, first_order_scale=1.0, pairwise_scale=0, dense_cross_scale=0
  )
  probability = synthetic.SyntheticSource(first_order_only).true_probability(0, 20_000)
  logit = np.log(probability) - np.log1p(-probability)
  assert np.std(logit) == pytest.approx(1.0, rel=0.05)


def test_drift_changes_the_teacher_slowly_along_the_stream():
  spec = synthetic.SyntheticSpec(cardinalities=(100,) * 26)
  stationary = synthetic.SyntheticSource(spec)
  drifting = synthetic.SyntheticSource(
    synthetic.SyntheticSpec(cardinalities=(100,) * 26, drift=1.0, drift_horizon=1_000_000)
  )
  _assert_batches_equal(
    stationary.read(5_000_000, 100)._replace(label=0), drifting.read(5_000_000, 100)._replace(label=0)
  )  # features do not drift, only the teacher
  np.testing.assert_allclose(drifting.true_probability(0, 1000), stationary.true_probability(0, 1000), atol=1e-3)
  late = 1_000_000  # a quarter turn: the first-order effects are fully replaced
  p_stationary, p_drifting = stationary.true_probability(late, 5000), drifting.true_probability(late, 5000)
  assert np.corrcoef(p_stationary, p_drifting)[0, 1] < 0.9
  # The click rate stays realistic; it moves, as the new effects have their own mean (0.18-0.32 over seeds 0-7).
  assert abs(p_drifting.mean() - 0.25) < 0.1


def test_spec_rejects_wrong_table_count():
  with pytest.raises(ValueError, match='26'):
    synthetic.SyntheticSpec(cardinalities=(10,) * 25)


def _ranks_of_draws(tables: zipf.ZipfTables, ranks: zipf.Ranks) -> np.ndarray:
  """int64 [N * T]: the rank within its table of every draw, head and tail."""
  rank = tables.entry_ranks()[1][ranks.entry_NxT.ravel()]
  rank[ranks.tail_P] = ranks.tail_rank_P
  return rank


def test_per_id_effects_and_ids_are_the_same_cached_or_hashed(source):
  """The head cache holds exactly what the on-demand hash gives, and a read uses one or the other by rank."""
  table, rank = source._zipf.entry_ranks()
  reverse = slice(None, None, -1)
  np.testing.assert_array_equal(source._head_effects[reverse], source._effects(table[reverse], rank[reverse]))
  np.testing.assert_array_equal(source._head_ids[reverse], source._permutation(table[reverse], rank[reverse]))
  _, ranks, _ = source._features(10_000, 3000)
  assert ranks.tail_P.size > 100  # Table 5 has a tail.
  all_rank, all_table = _ranks_of_draws(source._zipf, ranks), np.tile(np.arange(26), 3000)
  fresh = synthetic.SyntheticSource(source.spec)  # A pure function of (seed, table, rank).
  np.testing.assert_array_equal(source._unit_rows(ranks).reshape(-1, 6), fresh._effects(all_table, all_rank))
  np.testing.assert_array_equal(source.read(10_000, 3000).sparse.ravel(), fresh._permutation(all_table, all_rank))
  rare_then_frequent = np.concatenate([np.arange(199_000, 200_000), np.arange(1000)])
  first_order = np.abs(source._effects(np.full(2000, 5), rare_then_frequent)[:, 4])
  assert first_order[:1000].mean() < 0.2 * first_order[1000:].mean()  # Rare ids are shrunk.


def _held_bytes(value, seen=None) -> int:
  """Bytes of the numpy arrays reachable from `value`'s attributes."""
  seen = set() if seen is None else seen
  if id(value) in seen:
    return 0
  seen.add(id(value))
  if isinstance(value, np.ndarray):
    return value.nbytes
  children = vars(value).values() if hasattr(value, '__dict__') else ()
  return sum(_held_bytes(child, seen) for child in children)


def test_a_terabyte_sized_source_builds_fast_and_holds_little():
  start = time.perf_counter()
  source = synthetic.SyntheticSource(synthetic.SyntheticSpec(cardinalities=criteo_terabyte.TERABYTE_CARDINALITIES))
  assert time.perf_counter() - start < 5  # Per-id arrays took 13-18 s and 2.9 GB at Kaggle's 33.8M rows.
  assert _held_bytes(source) < 64 * 2**20
  batch, probability = source.read_with_probability(123_456_789, 4000)
  cardinalities = np.array(criteo_terabyte.TERABYTE_CARDINALITIES)
  assert np.all(batch.sparse >= 0) and np.all(batch.sparse < cardinalities)
  big = batch.sparse[:, cardinalities == 40_000_000]
  assert len(np.unique(big)) > 0.3 * big.size  # Tail ids are many and distinct, ...
  assert np.median(big) > 5_000_000  # ... and spread over the whole table.
  assert abs(probability.mean() - 0.25) < 0.03
