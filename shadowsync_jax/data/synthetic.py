"""A Criteo-shaped click stream drawn from a fixed random teacher, so every example's true click probability is known.

  spec = synthetic.SyntheticSpec(seed=0, cardinalities=(1000,) * 26)
  source = synthetic.SyntheticSource(spec)
  batch = source.read(start=0, count=1024)          # Batch of numpy arrays: examples 0..1023 of the stream
  p_true = source.true_probability(0, 1024)         # the teacher's click probability of the same examples
  floor = ctr.normalized_entropy(batch.label, p_true)   # the Bayes NE floor: no model beats it on these examples

Every random number is a counter-based hash (splitmix64) of (seed, example index, column), so an example depends
on its index alone: any range can be read in any order, on any host, in any split, and gives the same values.
Dense features are log(1 + count) of heavy-tailed counts (log-logistic, one scale per feature); categorical ids
follow a truncated Zipf law per table, scattered through the table by a fixed permutation. The teacher's logit is

  bias + dense linear + dense tanh layer + sum_t a_t[id_t] + sum_{t<u} v_t[id_t].v_u[id_u] + (sum_t v_t).C h(dense)

with the bias set so the mean CTR is `mean_ctr`. Each `*_scale` of the spec is the standard deviation of its term
(measured on a calibration sample), so the knobs read directly as how much signal each term carries. Per-id effects
shrink with the id's rarity (`shrink_count`), so what the teacher does can be learned from a few million examples.
With `drift > 0` the first-order effects rotate slowly with the example index, like changing ad traffic.
"""

import dataclasses

import numpy as np

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch

_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_WORDS_PER_EXAMPLE = 20  # 64-bit hashes per example = 40 uint32 draws: 26 categorical, 13 dense, 1 label.
_LABEL_COLUMN = NUM_SPARSE_FEATURES + NUM_DENSE_FEATURES
_CHUNK = 4096  # Examples generated at once: keeps the temporaries in cache; results do not depend on it.
_GUIDE_BUCKETS_PER_ID = 8  # Guide-table entries per table row: the inverse-CDF search then needs ~1 step.
_MAX_GUIDE_BITS = 18  # At most 2^18 guide entries per table (1 MiB); larger tables search a little longer.
_GUIDE_STEPS = 3  # Linear search steps after the guide lookup before falling back to binary search.
_CALIBRATION_EXAMPLES = 16384  # Examples 0..16383 set the term scales and the bias.


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
  """What the stream looks like and how hard its teacher is to learn. Defaults: the project's default problem."""

  seed: int = 0  # Seeds the teacher, the id permutations and the example hashes.
  cardinalities: tuple[int, ...] = (1000,) * NUM_SPARSE_FEATURES  # Rows of each of the 26 categorical tables.
  zipf_exponent: float = 1.05  # P(rank r) ~ r^-s within each table: larger = fewer distinct ids matter.
  mean_ctr: float = 0.25  # The teacher's bias is set for this click rate (Criteo Kaggle: 0.256).
  dense_linear_scale: float = 0.5  # Std of the logit term linear in the (standardized) dense features.
  dense_nonlinear_scale: float = 0.5  # Std of the term from a random tanh layer over the dense features.
  dense_hidden_units: int = 8  # Width of that tanh layer.
  first_order_scale: float = 1.0  # Std of sum_t a_t[id_t], the per-id click propensities.
  pairwise_scale: float = 0.25  # Std of the sum over all table pairs of teacher-embedding dot products.
  dense_cross_scale: float = 0.15  # Std of (sum_t v_t[id_t]) . C h(dense): dense-categorical interactions.
  teacher_embedding_dim: int = 4  # Width of the teacher embeddings v_t (a DLRM student is wider).
  shrink_count: float = 10.0  # An id expected n times in `shrink_reference_examples` has its effects scaled by
  shrink_reference_examples: float = 1e6  # n / (n + shrink_count): rare ids matter little, as in real data.
  drift: float = 0.0  # 0 = stationary; 1 = first-order effects fully replaced by new ones after drift_horizon.
  drift_horizon: int = 10_000_000  # Examples over which `drift` is measured (rotation angle drift * pi/2).

  def __post_init__(self):
    if len(self.cardinalities) != NUM_SPARSE_FEATURES or min(self.cardinalities) < 1:
      raise ValueError(f'cardinalities must be {NUM_SPARSE_FEATURES} positive ints, got {self.cardinalities}.')
    if self.zipf_exponent < 0 or self.drift < 0 or self.drift_horizon <= 0:
      raise ValueError(f'need zipf_exponent >= 0, drift >= 0, drift_horizon > 0; got {self}.')
    if not 0 < self.mean_ctr < 1:
      raise ValueError(f'mean_ctr={self.mean_ctr} must lie in (0, 1).')


def splitmix64(counter: np.ndarray, key: int) -> np.ndarray:
  """Output number `counter` of the splitmix64 generator seeded with `key` (uint64, vectorized, stateless)."""
  z = (counter.astype(np.uint64) + np.uint64(1)) * _GOLDEN_GAMMA + np.uint64(key)
  z ^= z >> np.uint64(30)
  z *= _MIX_1
  z ^= z >> np.uint64(27)
  z *= _MIX_2
  z ^= z >> np.uint64(31)
  return z


def _random_draws(key: int, start: int, count: int) -> np.ndarray:
  """uint32 [count, 40]: the random draws of examples start..start+count-1, a pure function of (key, index)."""
  index = np.arange(start, start + count, dtype=np.uint64)
  counter = index[:, None] * np.uint64(_WORDS_PER_EXAMPLE) + np.arange(_WORDS_PER_EXAMPLE, dtype=np.uint64)
  return splitmix64(counter, key).view(np.uint32)


def _open_unit(draws: np.ndarray) -> np.ndarray:
  """float64 uniforms in the open interval (0, 1) from uint32 draws."""
  return (draws + 0.5) * 2.0**-32


class _ZipfTables:
  """Truncated Zipf id samplers for all tables: an exact inverse CDF over uint32 draws, sped up by a guide table.

  Ranks of all tables are numbered in one flat range (table t starts at `offsets[t]`). Rank r is drawn for the
  uint32 draw d when last_draw[r - 1] < d <= last_draw[r], last_draw = round(2^32 cdf) - 1 within each table.
  The guide table maps the top bits of d to the first rank that can match; a few vectorized steps finish.
  """

  def __init__(self, cardinalities: tuple[int, ...], exponent: float, rng: np.random.Generator):
    sizes = np.asarray(cardinalities, dtype=np.int64)
    self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    guide_bits = np.minimum(np.ceil(np.log2(sizes * _GUIDE_BUCKETS_PER_ID)), _MAX_GUIDE_BITS).astype(np.int64)
    self.guide_shift = (32 - guide_bits).astype(np.uint32)
    self.guide_offsets = np.concatenate([[0], np.cumsum(2**guide_bits)[:-1]]).astype(np.uint32)
    last_draws, guides, probabilities, ids = [], [], [], []
    for table, size in enumerate(sizes):
      p = np.arange(1, size + 1, dtype=np.float64) ** -exponent
      p /= p.sum()
      threshold = np.round(np.cumsum(p) * 2.0**32).astype(np.int64)
      threshold[-1] = 2**32  # Every draw stops inside its own table.
      bucket_start = np.arange(2 ** guide_bits[table], dtype=np.int64) << int(self.guide_shift[table])
      guides.append(np.searchsorted(threshold, bucket_start, side='right') + self.offsets[table])
      last_draws.append(threshold - 1)
      probabilities.append(np.diff(threshold, prepend=0) * 2.0**-32)
      ids.append(rng.permutation(size).astype(np.int32))  # Frequent ranks land anywhere in the table.
    self.last_draw = np.concatenate(last_draws).astype(np.uint32)
    self.guide = np.concatenate(guides).astype(np.intp)  # intp: numpy gathers need no index conversion.
    self.probability = np.concatenate(probabilities)  # P(rank) within its table, by flat rank.
    self.id_of_rank = np.concatenate(ids)
    # Thresholds made increasing over all tables, for the binary-search fallback.
    self._flat_threshold = np.concatenate([last + 1 + (table << 32) for table, last in enumerate(last_draws)])

  def sample(self, draws_NxT: np.ndarray) -> np.ndarray:
    """Flat ranks (intp) [N, T] of the draws (column t is table t)."""
    draws = np.ascontiguousarray(draws_NxT).ravel()
    rank = np.take(self.guide, ((draws_NxT >> self.guide_shift) + self.guide_offsets).ravel())
    pending = np.flatnonzero(np.take(self.last_draw, rank) < draws)
    for _ in range(_GUIDE_STEPS):
      if not pending.size:
        break
      rank[pending] += 1
      pending = pending[np.take(self.last_draw, rank[pending]) < draws[pending]]
    if pending.size:  # Long tails of huge tables: finish by binary search.
      table = pending % draws_NxT.shape[1]
      rank[pending] = np.searchsorted(self._flat_threshold, draws[pending] + (table << 32), side='right')
    return rank.reshape(draws_NxT.shape)


def _dense_counts(draws_NxF: np.ndarray, log_location_F: np.ndarray, log_scale_F: np.ndarray) -> np.ndarray:
  """count = floor(exp(location + scale * logistic noise)) >= 0, float32: heavy-tailed like Criteo's."""
  u = ((draws_NxF >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-23)  # u, 1-u exact.
  logistic = np.log(u / (np.float32(1.0) - u))
  return np.floor(np.exp(log_location_F + log_scale_F * logistic))


def _dense_features(draws_NxF: np.ndarray, log_location_F: np.ndarray, log_scale_F: np.ndarray) -> np.ndarray:
  """log(1 + count) of `_dense_counts`."""
  counts = _dense_counts(draws_NxF, log_location_F, log_scale_F)
  return np.log(counts + np.float32(1.0))  # Exact integers in float32: log(c + 1) is log1p, only faster.


@dataclasses.dataclass
class _Teacher:
  """The fixed random model that labels the stream. `rows` is indexed by flat rank (see `_ZipfTables`)."""

  dense_mean_F: np.ndarray
  dense_std_F: np.ndarray
  dense_linear_F: np.ndarray
  hidden_in_FxH: np.ndarray
  hidden_bias_H: np.ndarray
  hidden_out_H: np.ndarray
  cross_HxK: np.ndarray
  rows: np.ndarray  # [sum cardinalities, K + 2]: per id, embedding v (K), first-order a, drifted first-order a'.
  bias: float = 0.0

  def logit_terms(
    self, dense_NxF: np.ndarray, rank_NxT: np.ndarray, angle_N: np.ndarray | None
  ) -> dict[str, np.ndarray]:
    """Each term of the logit (bias excluded), float32 [N]."""
    x_NxF = (dense_NxF - self.dense_mean_F) / self.dense_std_F
    hidden_NxH = np.tanh(x_NxF @ self.hidden_in_FxH + self.hidden_bias_H)
    (n, num_tables), width = rank_NxT.shape, self.rows.shape[1]
    dim = width - 2
    # One gather for all per-id parameters; sums over tables as a matmul (faster than numpy's strided sum).
    rows_NxTW = np.take(self.rows, rank_NxT.ravel(), axis=0).reshape(n, num_tables * width)
    sums_NxW = rows_NxTW @ np.tile(np.eye(width, dtype=np.float32), (num_tables, 1))
    embedding_sum_NxK = sums_NxW[:, :dim]
    is_embedding_TW = np.tile(np.arange(width) < dim, num_tables).astype(np.float32)
    squares_N = np.square(rows_NxTW) @ is_embedding_TW
    first_order_N = sums_NxW[:, dim]
    if angle_N is not None:
      first_order_N = np.cos(angle_N) * first_order_N + np.sin(angle_N) * sums_NxW[:, dim + 1]
    return {
      'dense_linear': x_NxF @ self.dense_linear_F,
      'dense_nonlinear': hidden_NxH @ self.hidden_out_H,
      'first_order': first_order_N,
      'pairwise': 0.5 * (np.einsum('nk,nk->n', embedding_sum_NxK, embedding_sum_NxK) - squares_N),
      'dense_cross': np.einsum('nk,nk->n', embedding_sum_NxK, hidden_NxH @ self.cross_HxK),
    }

  def logit(self, dense_NxF: np.ndarray, rank_NxT: np.ndarray, angle_N: np.ndarray | None) -> np.ndarray:
    return self.bias + sum(self.logit_terms(dense_NxF, rank_NxT, angle_N).values())


class SyntheticSource:
  """Random access to the infinite synthetic stream of `spec`: `read(start, count)` and its true probabilities."""

  def __init__(self, spec: SyntheticSpec = SyntheticSpec()):
    self.spec = spec
    rng = np.random.default_rng(spec.seed)
    self._key = int(splitmix64(np.zeros(1, np.uint64), spec.seed)[0])
    self._zipf = _ZipfTables(spec.cardinalities, spec.zipf_exponent, rng)
    self._log_location_F = rng.uniform(-1.0, 6.0, NUM_DENSE_FEATURES).astype(np.float32)
    self._log_scale_F = rng.uniform(0.5, 1.5, NUM_DENSE_FEATURES).astype(np.float32)
    self._teacher = _random_teacher(spec, self._zipf.probability, rng)
    _calibrate(self._teacher, spec, *self._features(0, _CALIBRATION_EXAMPLES)[:2])

  def read(self, start: int, count: int) -> Batch:
    """Examples with stream indices [start, start + count), as numpy float32 / int32."""
    return self.read_with_probability(start, count)[0]

  def true_probability(self, start: int, count: int) -> np.ndarray:
    """float32 [count]: the teacher's click probability of the examples [start, start + count)."""
    return self.read_with_probability(start, count)[1]

  def dense_counts(self, start: int, count: int) -> np.ndarray:
    """float32 [count, 13]: the integer counts whose log(1 + count) are the dense features (the Criteo-format
    generator writes them; `np.log1p(float64(count))` can differ from the dense feature in the last bit)."""
    draws = _random_draws(self._key, start, count)
    return _dense_counts(draws[:, NUM_SPARSE_FEATURES:_LABEL_COLUMN], self._log_location_F, self._log_scale_F)

  def read_with_probability(self, start: int, count: int) -> tuple[Batch, np.ndarray]:
    """`read` and `true_probability` in one pass."""
    if start < 0 or count < 0:
      raise ValueError(f'need start >= 0 and count >= 0, got start={start}, count={count}.')
    batch = Batch(
      dense=np.empty((count, NUM_DENSE_FEATURES), np.float32),
      sparse=np.empty((count, NUM_SPARSE_FEATURES), np.int32),
      label=np.empty(count, np.float32),
    )
    probability = np.empty(count, np.float32)
    for offset in range(0, count, _CHUNK):
      end = min(offset + _CHUNK, count)
      self._generate_into(start + offset, Batch(*(field[offset:end] for field in batch)), probability[offset:end])
    return batch, probability

  def _features(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense features, flat ranks and the label draws of examples [start, start + count)."""
    draws = _random_draws(self._key, start, count)
    rank_NxT = self._zipf.sample(draws[:, :NUM_SPARSE_FEATURES])
    dense_NxF = _dense_features(draws[:, NUM_SPARSE_FEATURES:_LABEL_COLUMN], self._log_location_F, self._log_scale_F)
    return dense_NxF, rank_NxT, draws[:, _LABEL_COLUMN]

  def _drift_angle(self, start: int, count: int) -> np.ndarray | None:
    if self.spec.drift == 0:
      return None
    index = np.arange(start, start + count, dtype=np.float64)
    return (0.5 * np.pi * self.spec.drift / self.spec.drift_horizon * index).astype(np.float32)

  def _generate_into(self, start: int, batch: Batch, probability: np.ndarray) -> None:
    """Writes examples [start, start + len(probability)) into the given views."""
    dense_NxF, rank_NxT, label_draw_N = self._features(start, len(probability))
    logit_N = self._teacher.logit(dense_NxF, rank_NxT, self._drift_angle(start, len(probability)))
    probability_N = 1.0 / (1.0 + np.exp(-logit_N.astype(np.float64)))
    batch.dense[:] = dense_NxF
    np.take(self._zipf.id_of_rank, rank_NxT, out=batch.sparse)
    batch.label[:] = _open_unit(label_draw_N) < probability_N
    probability[:] = probability_N


def _random_teacher(spec: SyntheticSpec, rank_probability: np.ndarray, rng: np.random.Generator) -> _Teacher:
  """Unit-scale random parameters; `_calibrate` then sets every term's scale and the bias."""
  num_rows, hidden, dim = rank_probability.size, spec.dense_hidden_units, spec.teacher_embedding_dim
  expected_count = rank_probability * spec.shrink_reference_examples
  shrink = (expected_count / (expected_count + spec.shrink_count)).astype(np.float32)
  normal = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
  return _Teacher(
    dense_mean_F=np.zeros(NUM_DENSE_FEATURES, np.float32),
    dense_std_F=np.ones(NUM_DENSE_FEATURES, np.float32),
    dense_linear_F=normal(NUM_DENSE_FEATURES),
    hidden_in_FxH=normal(NUM_DENSE_FEATURES, hidden) * np.float32(2.0 / np.sqrt(NUM_DENSE_FEATURES)),
    hidden_bias_H=normal(hidden),
    hidden_out_H=normal(hidden),
    cross_HxK=normal(hidden, dim),
    rows=np.concatenate(
      [normal(num_rows, dim) * np.sqrt(shrink)[:, None], normal(num_rows, 2) * shrink[:, None]], axis=1
    ),
  )


def _calibrate(teacher: _Teacher, spec: SyntheticSpec, dense_NxF: np.ndarray, rank_NxT: np.ndarray) -> None:
  """Standardizes the dense inputs, scales each logit term to its spec std, then sets the bias for mean_ctr."""
  teacher.dense_mean_F = dense_NxF.mean(axis=0)
  teacher.dense_std_F = np.maximum(dense_NxF.std(axis=0), 1e-3)
  std = _term_stds(teacher, dense_NxF, rank_NxT)
  teacher.dense_linear_F *= np.float32(spec.dense_linear_scale / std['dense_linear'])
  teacher.hidden_out_H *= np.float32(spec.dense_nonlinear_scale / std['dense_nonlinear'])
  dim = spec.teacher_embedding_dim
  teacher.rows[:, dim:] *= np.float32(spec.first_order_scale / std['first_order'])
  teacher.rows[:, :dim] *= np.float32(np.sqrt(spec.pairwise_scale / std['pairwise']))  # Pairwise is quadratic in v.
  teacher.cross_HxK *= np.float32(spec.dense_cross_scale / _term_stds(teacher, dense_NxF, rank_NxT)['dense_cross'])
  teacher.bias = _bias_for_mean(teacher.logit(dense_NxF, rank_NxT, None).astype(np.float64), spec.mean_ctr)


def _term_stds(teacher: _Teacher, dense_NxF: np.ndarray, rank_NxT: np.ndarray) -> dict[str, float]:
  terms = teacher.logit_terms(dense_NxF, rank_NxT, None)
  return {name: max(float(np.std(term, dtype=np.float64)), 1e-12) for name, term in terms.items()}


def _bias_for_mean(logit_N: np.ndarray, mean_ctr: float) -> float:
  """The b with mean(sigmoid(logit + b)) = mean_ctr, by bisection (the mean is increasing in b)."""
  low, high = -30.0, 30.0
  for _ in range(60):
    middle = 0.5 * (low + high)
    if np.mean(1.0 / (1.0 + np.exp(-(logit_N + middle)))) < mean_ctr:
      low = middle
    else:
      high = middle
  return 0.5 * (low + high)
