"""DCN-V2's low-rank cross layers (Wang et al. 2021, arXiv:2008.13535), the interaction of MLPerf's DLRM-DCNv2.

  cross = LowRankCrossNet(num_layers=3, rank=64)
  x0_BxN = jnp.concatenate([bottom_BxD, emb_BxTxD.reshape(B, T * D)], axis=1)     # N = (T + 1) D
  params = cross.init(key, x0_BxN)['params']        # V_l [N, r], U_l [r, N], b_l [N] for l < num_layers
  xL_BxN = cross.apply({'params': params}, x0_BxN)  # what the top MLP reads in place of the pairwise dots

Each layer is x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l: a full-rank cross layer's N x N matrix factored into
rank r, which costs 2 N r instead of N^2 per example. TorchRec's `LowRankCrossNet` (used by the MLPerf reference,
torchrec/modules/crossnet.py) is the model followed: the bottom output first, then the embeddings in table order;
U and V Xavier-normal (plain, not truncated: JAX's `glorot_normal` truncates), b zero. TorchRec's guidance is
r < N / 2 to save compute and r ~ N / 4 to keep accuracy; MLPerf uses N = 27 x 128 = 3456, r = 512, 3 layers.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

_XAVIER_NORMAL = nn.initializers.variance_scaling(1.0, 'fan_avg', 'normal')


class LowRankCrossNet(nn.Module):
  """`num_layers` cross layers of rank `rank` over x_0 [B, N]; returns x_L [B, N]."""

  num_layers: int
  rank: int

  @nn.compact
  def __call__(self, x0_BxN: jax.Array) -> jax.Array:
    width = x0_BxN.shape[-1]
    x_BxN = x0_BxN
    for layer in range(self.num_layers):
      v_NxR = self.param(f'V_{layer}', _XAVIER_NORMAL, (width, self.rank))
      u_RxN = self.param(f'U_{layer}', _XAVIER_NORMAL, (self.rank, width))
      b_N = self.param(f'b_{layer}', nn.initializers.zeros, (width,))
      x_BxN = x0_BxN * ((x_BxN @ v_NxR) @ u_RxN + b_N) + x_BxN
    return x_BxN


def cross_input(bottom_BxD: jax.Array, emb_BxTxD: jax.Array) -> jax.Array:
  """x_0 = [bottom output, embedding 1, ..., embedding T] flattened: [B, (T + 1) D]."""
  return jnp.concatenate([bottom_BxD, emb_BxTxD.reshape(emb_BxTxD.shape[0], -1)], axis=1)
