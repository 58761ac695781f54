"""DLRM forward and dot interaction against a numpy implementation of the same math."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shadowsync_jax.model import dlrm as model_lib

B, T, D = 5, 6, 4


def _numpy_dot_interaction(bottom_BxD, emb_BxTxD):
  """DLRM's order: for i in 1..N-1, for j in 0..i-1, z_i . z_j (z_0 = bottom output)."""
  z_BxNxD = np.concatenate([bottom_BxD[:, None], emb_BxTxD], axis=1).astype(np.float64)
  n = z_BxNxD.shape[1]
  return np.stack([np.einsum('bd,bd->b', z_BxNxD[:, i], z_BxNxD[:, j]) for i in range(n) for j in range(i)], axis=1)


def _numpy_mlp(layers, x, final_activation):
  for k in range(len(layers)):
    x = x @ np.asarray(layers[f'Dense_{k}']['kernel'], np.float64) + np.asarray(layers[f'Dense_{k}']['bias'])
    if final_activation or k < len(layers) - 1:
      x = np.maximum(x, 0.0)
  return x


def _numpy_dlrm(params, dense_BxF, emb_BxTxD):
  bottom_BxD = _numpy_mlp(params['bottom'], dense_BxF.astype(np.float64), final_activation=True)
  top_in = np.concatenate([bottom_BxD, _numpy_dot_interaction(bottom_BxD, emb_BxTxD)], axis=1)
  return _numpy_mlp(params['top'], top_in, final_activation=False)[:, 0]


def _random(shape, seed):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_dot_interaction_matches_numpy_in_dlrm_order():
  bottom_BxD, emb_BxTxD = _random((B, D), 0), _random((B, T, D), 1)
  got = np.asarray(model_lib.dot_interaction(jnp.asarray(bottom_BxD), jnp.asarray(emb_BxTxD)))
  assert got.shape == (B, (T + 1) * T // 2)
  np.testing.assert_allclose(got, _numpy_dot_interaction(bottom_BxD, emb_BxTxD), rtol=1e-5, atol=1e-5)
  # First pairs spelled out: (emb0, bottom), (emb1, bottom), (emb1, emb0).
  np.testing.assert_allclose(got[:, 2], np.sum(emb_BxTxD[:, 1] * emb_BxTxD[:, 0], -1), rtol=1e-5)


def test_dot_interaction_gradient_matches_numpy():
  """d/dz of sum_p c_p <z_i, z_j> is sum over pairs of c_p z_j (for z_i) and c_p z_i (for z_j)."""
  bottom_BxD, emb_BxTxD = _random((B, D), 2), _random((B, T, D), 3)
  c_BxP = _random((B, (T + 1) * T // 2), 4)
  grads = jax.jit(jax.grad(lambda b, e: jnp.sum(c_BxP * model_lib.dot_interaction(b, e)), argnums=(0, 1)))(
    jnp.asarray(bottom_BxD), jnp.asarray(emb_BxTxD)
  )
  z_BxNxD = np.concatenate([bottom_BxD[:, None], emb_BxTxD], axis=1).astype(np.float64)
  want_BxNxD = np.zeros_like(z_BxNxD)
  i_P, j_P = np.tril_indices(T + 1, k=-1)
  for p, (i, j) in enumerate(zip(i_P, j_P)):
    want_BxNxD[:, i] += c_BxP[:, p, None] * z_BxNxD[:, j]
    want_BxNxD[:, j] += c_BxP[:, p, None] * z_BxNxD[:, i]
  np.testing.assert_allclose(np.asarray(grads[0]), want_BxNxD[:, 0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(grads[1]), want_BxNxD[:, 1:], rtol=1e-5, atol=1e-5)


def test_dlrm_forward_matches_numpy():
  model = model_lib.DLRM(bottom_mlp=(8, D), top_mlp=(16, 8, 1))
  dense_BxF, emb_BxTxD = _random((B, 13), 5), _random((B, T, D), 6)
  params = jax.jit(model.init)(jax.random.key(0), dense_BxF, emb_BxTxD)['params']
  got = np.asarray(jax.jit(model.apply)({'params': params}, dense_BxF, emb_BxTxD))
  assert got.shape == (B,)
  np.testing.assert_allclose(got, _numpy_dlrm(params, dense_BxF, emb_BxTxD), rtol=1e-4, atol=1e-5)


def test_reference_configuration_shapes():
  model = model_lib.DLRM(bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1))
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((2, 13)), jnp.zeros((2, 26, 16)))
  widths = [
    params['params'][part][f'Dense_{k}']['kernel'].shape for part, n in (('bottom', 4), ('top', 3)) for k in range(n)
  ]
  assert widths == [(13, 512), (512, 256), (256, 64), (64, 16), (367, 512), (512, 256), (256, 1)]


def test_dlrm_init_follows_dlrm_scales():
  model = model_lib.DLRM(bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1))
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((2, 13)), jnp.zeros((2, 26, 16)))['params']
  kernel, bias = params['top']['Dense_0']['kernel'], params['top']['Dense_0']['bias']
  np.testing.assert_allclose(np.std(kernel), np.sqrt(2 / (367 + 512)), rtol=0.05)
  np.testing.assert_allclose(np.std(bias), np.sqrt(1 / 512), rtol=0.15)


def test_bottom_width_must_equal_embedding_dim():
  model = model_lib.DLRM(bottom_mlp=(8, 5), top_mlp=(4, 1))
  with pytest.raises(ValueError, match='embedding'):
    model.init(jax.random.key(0), jnp.zeros((2, 13)), jnp.zeros((2, T, D)))
