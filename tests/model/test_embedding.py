"""Sparse embedding updates against dense references (jax.grad of the whole table, numpy Adagrad)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shadowsync_jax.model import embedding

NUM_ROWS, DIM = 50, 4


def _ids_with_duplicates(rng, n=40):
  ids_N = rng.integers(0, NUM_ROWS, n).astype(np.int32)
  ids_N[:6] = 7  # a hot row, seen many times in one step
  return ids_N


def _loss_of_rows(rows_NxD, coeffs_NxD):
  return jnp.sum(coeffs_NxD * jnp.sin(rows_NxD)) + 0.5 * jnp.sum(rows_NxD**2)


def _dense_table_grad(table_VxD, ids_N, coeffs_NxD):
  """Gradient w.r.t. the whole table, the thing the sparse update must never build."""
  return jax.grad(lambda t: _loss_of_rows(t[ids_N], coeffs_NxD))(table_VxD)


def _row_grads(table_VxD, ids_N, coeffs_NxD):
  return jax.grad(_loss_of_rows)(table_VxD[ids_N], coeffs_NxD)


def test_table_offsets():
  np.testing.assert_array_equal(embedding.table_offsets([3, 5, 2]), [0, 3, 8])
  assert embedding.table_offsets([3, 5, 2]).dtype == np.int32


def test_init_table_is_uniform_within_dlrm_bound_of_each_table():
  cards = [4, 10000, 100]
  table_VxD = np.asarray(embedding.init_table(jax.random.key(0), cards, 8))
  assert table_VxD.shape == (sum(cards), 8) and table_VxD.dtype == np.float32
  for start, card in zip(embedding.table_offsets(cards), cards):
    rows = table_VxD[start : start + card]
    bound = 1 / np.sqrt(card)
    assert np.abs(rows).max() <= bound
    assert np.abs(rows).max() > 0.9 * bound  # really spans the interval, not a smaller one


def test_lookup_of_global_ids_matches_numpy():
  cards = [3, 5, 2]
  table_VxD = np.arange(10 * 2, dtype=np.float32).reshape(10, 2)
  sparse_BxT = np.array([[0, 4, 1], [2, 0, 0]], np.int32)
  got = embedding.lookup(jnp.asarray(table_VxD), embedding.global_row_ids(sparse_BxT, embedding.table_offsets(cards)))
  want = np.stack([np.stack([table_VxD[[0, 3, 8][t] + sparse_BxT[b, t]] for t in range(3)]) for b in range(2)])
  np.testing.assert_array_equal(np.asarray(got), want)


def test_sum_duplicate_rows_matches_numpy():
  rng = np.random.default_rng(0)
  ids_N = _ids_with_duplicates(rng)
  grads_NxD = rng.standard_normal((ids_N.size, DIM)).astype(np.float32)
  scratch_V = jnp.asarray(rng.standard_normal(NUM_ROWS), jnp.float32)
  unique_N, summed_NxD, _ = map(np.asarray, embedding.sum_duplicate_rows(ids_N, grads_NxD, scratch_V))
  want_sums = np.zeros((NUM_ROWS, DIM), np.float32)
  np.add.at(want_sums, ids_N, grads_NxD)
  kept = unique_N < NUM_ROWS
  np.testing.assert_array_equal(np.sort(unique_N[kept]), np.unique(ids_N))  # each distinct row exactly once
  np.testing.assert_array_equal(unique_N[kept], ids_N[kept])  # kept at one of its own positions
  np.testing.assert_allclose(summed_NxD[kept], want_sums[unique_N[kept]], atol=1e-5)
  assert len(set(unique_N[~kept])) == np.sum(~kept)  # distinct out-of-range ids, safe for unique scatters
  np.testing.assert_array_equal(summed_NxD[~kept], 0)


def test_sparse_sgd_equals_dense_sgd_on_the_whole_table():
  rng = np.random.default_rng(1)
  table_VxD = jnp.asarray(rng.standard_normal((NUM_ROWS, DIM)), jnp.float32)
  dense_VxD = np.asarray(table_VxD)
  opt = embedding.sparse_sgd(learning_rate=0.1)
  state = opt.init(table_VxD)
  for _ in range(4):
    ids_N = _ids_with_duplicates(rng)
    coeffs_NxD = rng.standard_normal((ids_N.size, DIM)).astype(np.float32)
    dense_VxD = dense_VxD - 0.1 * np.asarray(_dense_table_grad(dense_VxD, ids_N, coeffs_NxD))
    table_VxD, state = opt.update(table_VxD, state, ids_N, _row_grads(table_VxD, ids_N, coeffs_NxD))
  np.testing.assert_allclose(np.asarray(table_VxD), dense_VxD, atol=1e-5)


@pytest.mark.parametrize('initial_accumulator', [0.0, 0.5])
def test_rowwise_adagrad_equals_dense_numpy_adagrad(initial_accumulator):
  rng = np.random.default_rng(2)
  lr, eps = 0.3, 1e-8
  table_VxD = jnp.asarray(rng.standard_normal((NUM_ROWS, DIM)), jnp.float32)
  dense_VxD = np.asarray(table_VxD, np.float64)
  acc_V = np.full(NUM_ROWS, initial_accumulator)
  opt = embedding.rowwise_adagrad(lr, eps, initial_accumulator)
  state = opt.init(table_VxD)
  for _ in range(5):
    ids_N = _ids_with_duplicates(rng)
    coeffs_NxD = rng.standard_normal((ids_N.size, DIM)).astype(np.float32)
    g_VxD = np.asarray(_dense_table_grad(dense_VxD.astype(np.float32), ids_N, coeffs_NxD), np.float64)
    acc_V += np.mean(g_VxD**2, axis=1)  # untouched rows have g = 0 and stay as they are
    dense_VxD -= lr * g_VxD / (np.sqrt(acc_V) + eps)[:, None]
    table_VxD, state = opt.update(table_VxD, state, ids_N, _row_grads(table_VxD, ids_N, coeffs_NxD))
  np.testing.assert_allclose(np.asarray(state.accumulator_V), acc_V, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(table_VxD), dense_VxD, atol=1e-5)


def test_out_of_range_ids_are_ignored():
  table_VxD = jnp.ones((NUM_ROWS, DIM))
  ids_N = np.array([3, NUM_ROWS, NUM_ROWS + 5], np.int32)
  for opt in (embedding.sparse_sgd(1.0), embedding.rowwise_adagrad(1.0)):
    new_VxD, _ = opt.update(table_VxD, opt.init(table_VxD), ids_N, jnp.ones((3, DIM)))
    changed = np.flatnonzero(np.any(np.asarray(new_VxD) != 1.0, axis=1))
    np.testing.assert_array_equal(changed, [3])
