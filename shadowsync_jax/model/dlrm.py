"""DLRM (Naumov et al. 2019, arXiv:1906.00091) in Flax linen, minus the embedding tables.

  model = DLRM(bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1))                  # dot interaction
  model = DLRM(bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1), interaction='dcn', cross_layers=3,
               cross_rank=64)                                                         # DLRM-DCNv2
  params = model.init(key, dense_BxF, emb_BxTxD)['params']
  logits_B = model.apply({'params': params}, dense_BxF, emb_BxTxD)

The embedding rows are looked up outside (see `embedding.py`) because they are updated sparsely, not by optax;
the module sees only their values `emb_BxTxD`. The last bottom layer's width must equal the embedding dim D.
The interaction is `dot` (the original DLRM: pairwise dots of the T + 1 vectors, beside the bottom output) or
`dcn` (DLRM-DCNv2, MLPerf's current DLRM: low-rank cross layers over the T + 1 vectors concatenated, `dcn.py`;
the top MLP reads their output, (T + 1) D wide).
"""

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from shadowsync_jax.model import dcn


def interaction_pairs(num_vectors: int) -> tuple[np.ndarray, np.ndarray]:
  """(i, j) of the strict lower triangle in DLRM's order: (1,0), (2,0), (2,1), (3,0), ..."""
  return np.tril_indices(num_vectors, k=-1)


def dot_interaction(bottom_BxD: jax.Array, emb_BxTxD: jax.Array) -> jax.Array:
  """Dot products of every pair of the N = T + 1 vectors (bottom output first): [B, N(N-1)/2]."""
  return _pair_dots(jnp.concatenate([bottom_BxD[:, None, :], emb_BxTxD], axis=1))


@jax.custom_vjp
def _pair_dots(z_BxNxD: jax.Array) -> jax.Array:
  """The strict lower triangle of each Gram matrix z z^T, read with one flat gather."""
  n = z_BxNxD.shape[1]
  gram_BxNN = jnp.einsum('bnd,bmd->bnm', z_BxNxD, z_BxNxD).reshape(z_BxNxD.shape[0], n * n)
  i_P, j_P = interaction_pairs(n)
  return gram_BxNN[:, i_P * n + j_P]


def _pair_dots_fwd(z_BxNxD):
  return _pair_dots(z_BxNxD), z_BxNxD


def _pair_dots_bwd(z_BxNxD, grad_BxP):
  """dz = (G + G^T) z with G the pair gradients in the lower triangle: one gather, one batched matmul.

  Autodiff would scatter into a zero [B, N, N] and run two batched matmuls, about 3x slower on CPU.
  """
  batch, n = z_BxNxD.shape[:2]
  i_P, j_P = interaction_pairs(n)
  pair_of_NN = np.full((n, n), len(i_P))  # the diagonal reads the appended zero
  pair_of_NN[i_P, j_P] = pair_of_NN[j_P, i_P] = np.arange(len(i_P))
  padded_BxP1 = jnp.concatenate([grad_BxP, jnp.zeros_like(grad_BxP[:, :1])], axis=1)
  sym_BxNxN = padded_BxP1[:, pair_of_NN.reshape(-1)].reshape(batch, n, n)
  return (jnp.einsum('bnm,bmd->bnd', sym_BxNxN, z_BxNxD),)


_pair_dots.defvjp(_pair_dots_fwd, _pair_dots_bwd)


class AlignedDense(nn.Dense):
  """nn.Dense (same params, same math) that pads the contraction to a multiple of `align` with zeros.

  XLA:CPU's matmuls are up to 2x slower at odd widths (the top MLP's 367 inputs: 2 * 16 + 351 pairs); a zero
  input column times a zero kernel row adds nothing, and its gradient is dropped by the slice.
  """

  align: int = 8

  @nn.compact
  def __call__(self, x_BxI: jax.Array) -> jax.Array:
    width_in = x_BxI.shape[-1]
    kernel_IxO = self.param('kernel', self.kernel_init, (width_in, self.features), self.param_dtype)
    bias_O = self.param('bias', self.bias_init, (self.features,), self.param_dtype)
    pad = -width_in % self.align
    if pad:
      x_BxI = jnp.pad(x_BxI, ((0, 0), (0, pad)))
      kernel_IxO = jnp.pad(kernel_IxO, ((0, pad), (0, 0)))
    return x_BxI @ kernel_IxO + bias_O


def _dlrm_dense(width: int, name: str) -> nn.Dense:
  """DLRM's init: weights N(0, 2/(fan_in + fan_out)), bias N(0, 1/fan_out)."""
  return AlignedDense(
    width,
    name=name,
    kernel_init=nn.initializers.variance_scaling(1.0, 'fan_avg', 'normal'),
    bias_init=nn.initializers.normal(stddev=float(np.sqrt(1.0 / width))),
  )


class MLP(nn.Module):
  """Dense layers with ReLU after each; `final_activation=False` leaves the last one linear."""

  widths: Sequence[int]
  final_activation: bool = True

  @nn.compact
  def __call__(self, x_BxI: jax.Array) -> jax.Array:
    for layer, width in enumerate(self.widths):
      x_BxI = _dlrm_dense(width, name=f'Dense_{layer}')(x_BxI)
      if self.final_activation or layer < len(self.widths) - 1:
        x_BxI = nn.relu(x_BxI)
    return x_BxI


INTERACTIONS = ('dot', 'dcn')


class DLRM(nn.Module):
  """Bottom MLP over dense features, interaction with the embeddings, top MLP to one logit."""

  bottom_mlp: Sequence[int]  # hidden widths, the last one = embedding dim D
  top_mlp: Sequence[int]  # hidden widths, the last one = 1
  interaction: str = 'dot'  # 'dot' or 'dcn'
  cross_layers: int = 3  # dcn: low-rank cross layers
  cross_rank: int = 64  # dcn: rank of each layer

  @nn.compact
  def __call__(self, dense_BxF: jax.Array, emb_BxTxD: jax.Array) -> jax.Array:
    if self.bottom_mlp[-1] != emb_BxTxD.shape[-1]:
      raise ValueError(f'bottom_mlp ends at {self.bottom_mlp[-1]}, embeddings have D={emb_BxTxD.shape[-1]}.')
    if self.top_mlp[-1] != 1:
      raise ValueError(f'top_mlp must end with width 1, got {self.top_mlp[-1]}.')
    bottom_BxD = MLP(self.bottom_mlp, name='bottom')(dense_BxF)
    if self.interaction == 'dot':
      top_in_BxI = jnp.concatenate([bottom_BxD, dot_interaction(bottom_BxD, emb_BxTxD)], axis=1)
    elif self.interaction == 'dcn':
      cross = dcn.LowRankCrossNet(self.cross_layers, self.cross_rank, name='cross')
      top_in_BxI = cross(dcn.cross_input(bottom_BxD, emb_BxTxD))
    else:
      raise ValueError(f'interaction={self.interaction!r} is not one of {", ".join(INTERACTIONS)}.')
    return MLP(self.top_mlp, final_activation=False, name='top')(top_in_BxI)[:, 0]


def from_config(model_config) -> DLRM:
  """The DLRM of a run's `config.model` section (`bottom_mlp`, `top_mlp`, `interaction`, `cross_*`)."""
  return DLRM(
    bottom_mlp=tuple(model_config.bottom_mlp),
    top_mlp=tuple(model_config.top_mlp),
    interaction=model_config.interaction,
    cross_layers=model_config.cross_layers,
    cross_rank=model_config.cross_rank,
  )
