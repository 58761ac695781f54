"""The categorical ids: the Zipf sampler against its own probabilities and the Zipf law, head and tail, and the
rank-to-id bijection."""

import numpy as np
import pytest

from shadowsync_jax.data import counter_hash
from shadowsync_jax.data import zipf


def _ranks_of_draws(tables: zipf.ZipfTables, ranks: zipf.Ranks) -> np.ndarray:
  """int64 [N * T]: the rank within its table of every draw, head and tail."""
  rank = tables.entry_ranks()[1][ranks.entry_NxT.ravel()]
  rank[ranks.tail_P] = ranks.tail_rank_P
  return rank


def _uint32_draws(count: int, num_tables: int) -> np.ndarray:
  """uint32 [count, num_tables] uniform draws (num_tables even), like the stream's but only the categorical ones."""
  hashes = counter_hash.splitmix64(np.arange(count * num_tables // 2, dtype=np.uint64), 17)
  return hashes.view(np.uint32).reshape(count, num_tables)


@pytest.mark.parametrize('exponent', [1.05, 1.0, 0.5])
def test_sampler_is_the_inverse_cdf_of_its_probabilities(exponent):
  """P(rank) is exactly what the sampler draws: each uint32 draw lands in the rank whose interval of cumulative
  P * 2^32 holds it, in the guide-table head, its binary-search fallback and the analytic tail alike."""
  sizes = (2_000_000, 7, 40_000, 1000)
  tables = zipf.ZipfTables(sizes, exponent)
  draws = _uint32_draws(40_000, len(sizes))
  draws[:64] = np.uint32(2**32 - 1) - np.arange(64, dtype=np.uint32)[:, None]  # The last draws of every table.
  rank = _ranks_of_draws(tables, tables.sample(draws)).reshape(draws.shape)
  for table, size in enumerate(sizes):
    probability = tables.probability(np.full(size, table), np.arange(size))
    boundary = np.cumsum(np.round(probability * 2.0**32).astype(np.int64))
    assert boundary[-1] == 2**32  # The ranks share all draws.
    expected = np.searchsorted(boundary, draws[:, table].astype(np.int64), side='right')
    np.testing.assert_array_equal(rank[:, table], expected, err_msg=f'table {table}')
  assert rank[:, 0].max() >= zipf.HEAD_RANKS  # The tail was exercised.


def test_rank_frequencies_follow_zipf_across_head_and_tail():
  """The sampled ranks of a 2M-row table match the P(rank) the code computes, which is the normalized Zipf law:
  (k + 1)^-s / W for the head, the integral of x^-s over the rank's unit interval / W for the tail."""
  size, exponent, count = 2_000_000, 1.05, 2_000_000
  tables = zipf.ZipfTables((size,), exponent)
  head = zipf.HEAD_RANKS
  probability = tables.probability(np.zeros(size, np.intp), np.arange(size))
  integral = lambda low, high: (high ** (1 - exponent) - low ** (1 - exponent)) / (1 - exponent)
  weight = np.arange(1, size + 1, dtype=np.float64) ** -exponent
  weight[head:] = integral(np.arange(head, size) + 0.5, np.arange(head, size) + 1.5)
  ideal = weight / (weight[:head].sum() + integral(head + 0.5, size + 0.5))
  np.testing.assert_allclose(probability, ideal, rtol=0, atol=1.01 * 2.0**-32)  # One uint32 draw of rounding.
  rank = _ranks_of_draws(tables, tables.sample(_uint32_draws(count, 2)[:, :1]))
  edges = np.unique(np.geomspace(1, size, 40).astype(np.int64) - 1)
  edges = np.unique(np.concatenate([edges, [head, size]]))
  observed = np.histogram(rank, bins=edges)[0]
  expected = np.add.reduceat(probability, edges[:-1]) * count
  sigma = np.sqrt(expected * (1 - expected / count))
  assert np.all(np.abs(observed - expected) < 5 * sigma + 1), np.c_[edges[:-1], observed, expected]
  assert observed[edges[:-1] >= head].sum() > 0.15 * count  # About a fifth of the draws land in the tail.
  top = np.bincount(rank[rank < 5], minlength=5)
  np.testing.assert_allclose(top / count, probability[:5], rtol=0.02)


@pytest.mark.parametrize('size', [1, 2, 3, 7, 97, 1024, 4096, 65_536, 65_537, 1_000_003, 2**20])
def test_rank_to_id_is_a_bijection(size):
  permutation = zipf.IdPermutation((size, 5), key=11)
  ids = permutation(np.zeros(size, np.intp), np.arange(size))
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(np.sort(ids), np.arange(size))
  if size >= 1024:  # The frequent ranks are scattered through the table, not packed at its start.
    assert ids[:16].max() - ids[:16].min() > size // 4
    assert not np.array_equal(ids, zipf.IdPermutation((size, 5), key=12)(np.zeros(size, np.intp), np.arange(size)))
