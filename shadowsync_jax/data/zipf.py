"""Categorical ids of a Criteo-shaped stream: a truncated Zipf law over each table's ranks, the ranks scattered through
the table by a seeded bijection. Nothing here grows with the tables, so any cardinalities work (Terabyte's 40M rows).

  tables = zipf.ZipfTables(cardinalities=(1000, 40_000_000, ...), exponent=1.05)
  ranks = tables.sample(draws_NxT)             # uint32 draws, column t for table t -> ranks (the head's, the tail's)
  p_N = tables.probability(table_N, rank_N)    # P(rank) within its table: exactly what `sample` draws
  ids_N = zipf.IdPermutation(cardinalities, key)(table_N, rank_N)

- Ranks. In a table of n rows, rank k (0-based, the most frequent first) has weight w_k = (k + 1)^-s for k < H =
  min(n, 2^15) (the head) and, beyond, the mass of the density x^-s over [k + 1/2, k + 3/2) (the tail, of total
  mass W_tail = ((n + 1/2)^(1-s) - (H + 1/2)^(1-s)) / (1 - s); log((n + 1/2) / (H + 1/2)) when s = 1). A uint32
  draw d below T = c_{H-1} picks the head rank k with c_{k-1} <= d < c_k, c_k = round(2^32 sum_{j<=k} w_j / W),
  W = sum_{j<H} w_j + W_tail (a guide table over the top bits of d, then a few steps); from T on, the tail rank
  k with D(k) <= d < D(k + 1), D(k) = T + ceil((2^32 - T) G(k + 1/2) - 1/2), G the tail's continuous CDF
  ((x^(1-s) - (H + 1/2)^(1-s)) / ((n + 1/2)^(1-s) - (H + 1/2)^(1-s))), found by inverting G and checking D.
  P(rank k) is the width of its draw interval over 2^32, head or tail: exactly what the sampler draws.
- Ids. Rank k becomes id (m_t k + b_t) mod n, m_t coprime with n (a bijection of the table), m_t and b_t hashed
  from the seed: the frequent ranks land anywhere in the table.
"""

import itertools
import math
from typing import NamedTuple

import numpy as np

from shadowsync_jax.data import counter_hash

HEAD_RANKS = 2**15  # Ranks per table drawn by the exact inverse CDF, whose ids and effects are cached.
_GUIDE_BUCKETS_PER_ID = 8  # Guide-table entries per head rank: the inverse-CDF search then needs ~1 step.
_MAX_GUIDE_BITS = 15  # At most 2^15 guide entries per table (64 KiB, read at random: it must stay in cache).
_GUIDE_STEPS = 3  # Linear search steps after the guide lookup before falling back to binary search.
_TWO_32 = 2**32


def _power_shape(slope: float, log_ratio: np.ndarray) -> np.ndarray:
  """((x/a)^slope - 1) / slope from log_ratio = log(x/a) (log(x/a) at slope 0): the integral of y^-s from a to x,
  over a^(1-s), with slope = 1 - s."""
  return np.expm1(slope * log_ratio) / slope if slope else log_ratio


def _power_shape_inverse(slope: float, shape: np.ndarray) -> np.ndarray:
  """The log(x/a) of which `shape` is the `_power_shape`."""
  return np.log1p(slope * shape) / slope if slope else shape


class Ranks(NamedTuple):
  """Where the draws of N examples landed: a head entry per draw; the tail draws' own ranks beside."""

  entry_NxT: np.ndarray  # intp: the head entry of each draw (for a tail draw, its table's sentinel entry).
  tail_P: np.ndarray  # intp: positions of the tail draws in entry_NxT.ravel().
  tail_table_P: np.ndarray  # intp: their tables.
  tail_rank_P: np.ndarray  # int64: their ranks within the table (0-based).


class ZipfTables:
  """Truncated Zipf rank samplers of all tables: an exact inverse CDF for the head, an analytic one for the tail.

  The head ranks of all tables are numbered in one flat range of entries (table t's from `offsets[t]`); a table
  with a tail has one more entry, its sentinel, which every tail draw reaches. Entry e is drawn for the uint32 draw
  d when last_draw[e - 1] < d <= last_draw[e]; the guide table maps the top bits of d to the first entry that can
  match, a few vectorized steps finish. The tail ranks follow from the module docstring's D(k).
  """

  def __init__(self, cardinalities: tuple[int, ...], exponent: float):
    self.sizes = np.asarray(cardinalities, dtype=np.int64)
    self.head_sizes = np.minimum(self.sizes, HEAD_RANKS)
    self.entries = self.head_sizes + (self.sizes > self.head_sizes)
    self.offsets = np.concatenate([[0], np.cumsum(self.entries)[:-1]])
    self.sentinels = np.where(self.sizes > self.head_sizes, self.offsets + self.head_sizes, -1)
    self._slope = 1.0 - exponent
    self._tail_low = self.head_sizes + 0.5
    self._tail_shape = _power_shape(self._slope, np.log((self.sizes + 0.5) / self._tail_low))  # 0: no tail.
    tail_mass = self._tail_low**self._slope * self._tail_shape
    guide_bits = np.minimum(np.ceil(np.log2(self.entries * _GUIDE_BUCKETS_PER_ID)), _MAX_GUIDE_BITS).astype(np.int64)
    self.guide_shift = (32 - guide_bits).astype(np.uint32)
    self.guide_offsets = np.concatenate([[0], np.cumsum(2**guide_bits)[:-1]]).astype(np.uint32)
    last_draws, guides, tail_starts = [], [], []
    for table, head_size in enumerate(self.head_sizes):
      cumulative = np.cumsum(np.arange(1, head_size + 1, dtype=np.float64) ** -exponent)
      threshold = np.round(cumulative / (cumulative[-1] + tail_mass[table]) * 2.0**32).astype(np.int64)
      if self.sentinels[table] < 0:
        threshold[-1] = _TWO_32  # Every draw stops inside its own table.
      else:
        threshold = np.append(threshold, _TWO_32)  # The sentinel: every tail draw reaches it.
      tail_starts.append(threshold[head_size - 1])
      bucket_start = np.arange(2 ** guide_bits[table], dtype=np.int64) << int(self.guide_shift[table])
      guides.append(np.searchsorted(threshold, bucket_start, side='right'))
      last_draws.append(threshold - 1)
    self.last_draw = np.concatenate(last_draws).astype(np.uint32)
    self.guide = np.concatenate(guides).astype(np.uint16)  # Entries within the table: a small, cache-resident guide.
    self.tail_start = np.asarray(tail_starts, dtype=np.int64)  # T: the first tail draw (2^32: no tail).

  def entry_ranks(self) -> tuple[np.ndarray, np.ndarray]:
    """(table, rank) of every head entry, intp; a sentinel's rank is its table's first tail rank."""
    table = np.repeat(np.arange(self.sizes.size), self.entries)
    return table, np.arange(table.size) - self.offsets[table]

  def sample(self, draws_NxT: np.ndarray) -> Ranks:
    """The ranks of the draws (column t is table t)."""
    draws = np.ascontiguousarray(draws_NxT).ravel()
    entry = (np.take(self.guide, (draws_NxT >> self.guide_shift) + self.guide_offsets) + self.offsets).ravel()
    pending = np.flatnonzero(np.take(self.last_draw, entry) < draws)
    for _ in range(_GUIDE_STEPS):
      if not pending.size:
        break
      entry[pending] += 1
      pending = pending[np.take(self.last_draw, entry[pending]) < draws[pending]]
    num_tables = draws_NxT.shape[1]
    for table in np.unique(pending % num_tables):  # The rarest head ranks of large tables: binary search.
      these = pending[pending % num_tables == table]
      head = self.last_draw[self.offsets[table] : self.offsets[table] + self.entries[table]]
      entry[these] = self.offsets[table] + np.searchsorted(head, draws[these], side='left')
    entry_NxT = entry.reshape(draws_NxT.shape)
    tail = np.flatnonzero(entry_NxT == self.sentinels)
    tail_table = tail % num_tables
    return Ranks(entry_NxT, tail, tail_table, self._tail_ranks(tail_table, draws[tail].astype(np.int64)))

  def probability(self, table_N: np.ndarray, rank_N: np.ndarray) -> np.ndarray:
    """float64: P(rank) within its table, the share of the uint32 draws that `sample` maps to it."""
    head_N = rank_N < self.head_sizes[table_N]
    entry_N = self.offsets[table_N] + np.minimum(rank_N, self.head_sizes[table_N] - 1)
    previous_N = np.where(rank_N > 0, self.last_draw[entry_N - 1].astype(np.int64) + 1, 0)
    width_N = np.where(head_N, self.last_draw[entry_N].astype(np.int64) + 1 - previous_N, 0)
    tail = np.flatnonzero(~head_N)
    table, rank = table_N[tail], rank_N[tail]
    width_N[tail] = self._tail_boundary(table, rank + 1) - self._tail_boundary(table, rank)
    return width_N * 2.0**-32

  def _tail_boundary(self, table_P: np.ndarray, rank_P: np.ndarray) -> np.ndarray:
    """D(k): the first draw of tail rank k (2^32 for k = n), int64."""
    start_P = self.tail_start[table_P]
    cdf_P = _power_shape(self._slope, np.log((rank_P + 0.5) / self._tail_low[table_P])) / self._tail_shape[table_P]
    return np.clip(start_P + np.ceil((_TWO_32 - start_P) * cdf_P - 0.5).astype(np.int64), start_P, _TWO_32)

  def _tail_ranks(self, table_P: np.ndarray, draw_P: np.ndarray) -> np.ndarray:
    """The tail rank k of each draw, D(k) <= draw < D(k + 1): G's inverse, then a check of D (float rounding)."""
    start_P = self.tail_start[table_P]
    cdf_P = (draw_P - start_P + 0.5) / (_TWO_32 - start_P)
    x_P = self._tail_low[table_P] * np.exp(_power_shape_inverse(self._slope, cdf_P * self._tail_shape[table_P]))
    rank_P = np.clip(np.floor(x_P - 0.5).astype(np.int64), self.head_sizes[table_P], self.sizes[table_P] - 1)
    pending = np.arange(rank_P.size)
    while pending.size:
      table, rank, draw = table_P[pending], rank_P[pending], draw_P[pending]
      step = (draw >= self._tail_boundary(table, rank + 1)).astype(np.int64) - (draw < self._tail_boundary(table, rank))
      rank_P[pending] += step
      pending = pending[step != 0]
    return rank_P


class IdPermutation:
  """Rank k of table t is id (multiplier_t k + shift_t) mod n_t: a bijection of [0, n_t), hashed from the seed."""

  def __init__(self, cardinalities: tuple[int, ...], key: int):
    self.sizes = np.asarray(cardinalities, dtype=np.int64)
    self.multipliers = np.ones_like(self.sizes)
    self.shifts = np.zeros_like(self.sizes)
    for table, size in enumerate(cardinalities):
      hashes = (int(counter_hash.splitmix64(np.uint64([counter]), key)[0]) for counter in itertools.count(table << 32))
      self.shifts[table] = next(hashes) % size
      if size > 2:  # Sizes 1 and 2 have the one multiplier 1.
        self.multipliers[table] = next(m for m in (1 + h % (size - 1) for h in hashes) if math.gcd(m, size) == 1)

  def __call__(self, table_N: np.ndarray, rank_N: np.ndarray) -> np.ndarray:
    """int32 ids. The product stays below 2^62: ranks and multipliers are below 2^31."""
    return ((self.multipliers[table_N] * rank_N + self.shifts[table_N]) % self.sizes[table_N]).astype(np.int32)
