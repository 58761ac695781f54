"""DLRM-DCNv2: the low-rank cross layers against a float64 numpy loop, their init, and the sparse train step."""

import functools

import jax
import numpy as np
import optax

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.model import dcn
from shadowsync_jax.model import embedding
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.model.dlrm import DLRM

B, T, D, LAYERS, RANK = 6, 26, 4, 3, 7
CARDS = [7, 3, 11, 5]  # Few tables: the step compiles fast; ids repeat within the batch.


def _numpy_cross_net(x0_BxN, params, num_layers):
  """x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l, one example at a time, with the matrices as the paper writes them
  (V_l: N -> r, U_l: r -> N)."""
  x0_BxN = np.asarray(x0_BxN, np.float64)
  out = np.empty_like(x0_BxN)
  for i, x0 in enumerate(x0_BxN):
    x = x0.copy()
    for layer in range(num_layers):
      v_RxN = np.asarray(params[f'V_{layer}'], np.float64).T
      u_NxR = np.asarray(params[f'U_{layer}'], np.float64).T
      x = x0 * (u_NxR @ (v_RxN @ x) + np.asarray(params[f'b_{layer}'], np.float64)) + x
    out[i] = x
  return out


def _random(shape, seed):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _perturbed(params, seed):
  """Non-zero biases and weights away from their init, so every term of a layer counts."""
  leaves, tree = jax.tree.flatten(params)
  return jax.tree.unflatten(tree, [p + 0.1 * _random(p.shape, seed + k) for k, p in enumerate(leaves)])


def test_cross_net_matches_numpy():
  x0_BxN = dcn.cross_input(_random((B, D), 0), _random((B, T, D), 1))
  net = dcn.LowRankCrossNet(num_layers=LAYERS, rank=RANK)
  params = _perturbed(net.init(jax.random.key(0), x0_BxN)['params'], 10)
  got = np.asarray(jax.jit(net.apply)({'params': params}, x0_BxN))
  want = _numpy_cross_net(x0_BxN, params, LAYERS)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_cross_input_puts_the_bottom_output_first_then_the_tables_in_order():
  bottom_BxD, emb_BxTxD = _random((B, D), 2), _random((B, T, D), 3)
  x0_BxN = np.asarray(dcn.cross_input(bottom_BxD, emb_BxTxD))
  assert x0_BxN.shape == (B, (T + 1) * D)
  np.testing.assert_array_equal(x0_BxN[:, :D], bottom_BxD)
  np.testing.assert_array_equal(x0_BxN[:, D + 2 * D : D + 3 * D], emb_BxTxD[:, 2])


def test_init_is_torchrec_xavier_normal_with_zero_bias():
  """TorchRec's xavier_normal_: std sqrt(2 / (N + r)), not truncated (JAX's glorot_normal truncates at 2 std)."""
  n, rank = 27 * 32, 256
  params = dcn.LowRankCrossNet(num_layers=1, rank=rank).init(jax.random.key(1), np.zeros((1, n), np.float32))['params']
  assert params['V_0'].shape == (n, rank) and params['U_0'].shape == (rank, n)
  np.testing.assert_allclose(np.std(params['V_0']), np.sqrt(2 / (n + rank)), rtol=0.02)
  assert np.abs(params['U_0']).max() > 2.5 * np.sqrt(2 / (n + rank))  # Tails beyond 2 std: not truncated.
  np.testing.assert_array_equal(params['b_0'], 0.0)


def test_dlrm_dcn_is_the_top_mlp_over_the_cross_net():
  model = DLRM(bottom_mlp=(8, D), top_mlp=(8, 1), interaction='dcn', cross_layers=2, cross_rank=5)
  dense_BxF, emb_BxTxD = _random((B, 13), 4), _random((B, T, D), 5)
  params = _perturbed(jax.jit(model.init)(jax.random.key(2), dense_BxF, emb_BxTxD)['params'], 20)
  assert params['top']['Dense_0']['kernel'].shape == ((T + 1) * D, 8)
  bottom_BxD = np.maximum(
    np.maximum(dense_BxF @ params['bottom']['Dense_0']['kernel'] + params['bottom']['Dense_0']['bias'], 0)
    @ params['bottom']['Dense_1']['kernel']
    + params['bottom']['Dense_1']['bias'],
    0,
  )
  x_BxN = _numpy_cross_net(dcn.cross_input(bottom_BxD, emb_BxTxD), params['cross'], 2)
  top = params['top']
  hidden = np.maximum(x_BxN @ top['Dense_0']['kernel'] + top['Dense_0']['bias'], 0)
  want_B = (hidden @ top['Dense_1']['kernel'] + top['Dense_1']['bias'])[:, 0]
  got_B = jax.jit(model.apply)({'params': params}, dense_BxF, emb_BxTxD)
  np.testing.assert_allclose(got_B, want_B, rtol=1e-4, atol=1e-4)


def test_dcn_train_step_is_sgd_on_all_params_and_touches_only_the_looked_up_rows():
  """The sparse embedding update is unchanged by the interaction: it equals dense SGD, and rows no example looked
  up keep their values."""
  model, lr = DLRM(bottom_mlp=(8, D), top_mlp=(8, 1), interaction='dcn', cross_layers=2, cross_rank=5), 0.5
  rng = np.random.default_rng(0)
  batch = Batch(
    dense=_random((16, 13), 6),
    sparse=rng.integers(0, CARDS, (16, len(CARDS))).astype(np.int32),
    label=rng.integers(0, 2, 16).astype(np.float32),
  )
  state = step_lib.init_train_state(jax.random.key(3), model, CARDS, D, optax.sgd(lr), embedding.sparse_sgd(lr))
  offsets = embedding.table_offsets(CARDS)

  def dense_loss(params):
    logits = model.apply({'params': params['mlp']}, batch.dense, params['embedding'][batch.sparse + offsets])
    return optax.sigmoid_binary_cross_entropy(logits, batch.label).mean()

  want = jax.tree.map(lambda p, g: p - lr * g, state.params, jax.jit(jax.grad(dense_loss))(state.params))
  train_step = jax.jit(step_lib.make_train_step(model, CARDS, optax.sgd(lr), embedding.sparse_sgd(lr)))
  new_state, _ = train_step(state, batch)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), new_state.params, want)
  touched = np.zeros(sum(CARDS), bool)
  touched[(batch.sparse + offsets).ravel()] = True
  table, new_table = np.asarray(state.params['embedding']), np.asarray(new_state.params['embedding'])
  assert np.any(~touched) and np.array_equal(new_table[~touched], table[~touched])
  assert not np.array_equal(new_table[touched], table[touched])
