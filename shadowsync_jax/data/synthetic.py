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

Nothing the source holds grows with the tables (its caches are bounded), so it builds at any cardinalities. The
ranks and their ids are `zipf`'s (an exact inverse CDF for the most frequent ranks, an analytic one beyond; a
seeded bijection from ranks to ids); the teacher's per-id parameters are hashed on demand:

- Per-id effects. The teacher embedding v (K), first-order a and drifted first-order a' of rank k are K + 2
  standard normals (one of 2^16 quantiles each, picked by 16 bits of a hash of (seed, table, rank, column)), times
  sqrt(shrink) for v and shrink for a and a', shrink = m / (m + shrink_count) with m = P(rank k)
  shrink_reference_examples, times one scale per term that the calibration sets.

The ids and effects of the head ranks are cached (at most 26 (2^15 + 1) rows, whatever the cardinalities); a tail
draw computes its own, with the same functions, so the cache changes no value.
"""

from collections.abc import Callable
import dataclasses
import math
import statistics

import numpy as np

from shadowsync_jax.data import counter_hash
from shadowsync_jax.data import zipf
from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch

_WORDS_PER_EXAMPLE = 20  # 64-bit hashes per example = 40 uint32 draws: 26 categorical, 13 dense, 1 label.
_LABEL_COLUMN = NUM_SPARSE_FEATURES + NUM_DENSE_FEATURES
_CHUNK = 4096  # Examples generated at once: keeps the temporaries in cache; results do not depend on it.
_QUANTILE_BITS = 16  # A teacher normal is one of 2^16 quantiles of N(0, 1): four per 64-bit hash.
_CALIBRATION_EXAMPLES = 16384  # Examples 0..16383 set the term scales and the bias.
_TWO_32 = 2**32


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
    if max(self.cardinalities) > np.iinfo(np.int32).max:
      raise ValueError(f'ids are int32: cardinalities must be below 2^31, got {max(self.cardinalities)}.')
    if self.zipf_exponent < 0 or self.drift < 0 or self.drift_horizon <= 0:
      raise ValueError(f'need zipf_exponent >= 0, drift >= 0, drift_horizon > 0; got {self}.')
    if not 0 < self.mean_ctr < 1:
      raise ValueError(f'mean_ctr={self.mean_ctr} must lie in (0, 1).')


def _random_draws(key: int, start: int, count: int) -> np.ndarray:
  """uint32 [count, 40]: the random draws of examples start..start+count-1, a pure function of (key, index)."""
  index = np.arange(start, start + count, dtype=np.uint64)
  counter = index[:, None] * np.uint64(_WORDS_PER_EXAMPLE) + np.arange(_WORDS_PER_EXAMPLE, dtype=np.uint64)
  return counter_hash.splitmix64(counter, key).view(np.uint32)


def _open_unit(draws: np.ndarray) -> np.ndarray:
  """float64 uniforms in the open interval (0, 1) from uint32 draws."""
  return (draws + 0.5) * 2.0**-32


def _normal_quantiles() -> np.ndarray:
  """float32 [2^16]: the (i + 1/2) / 2^16 quantiles of N(0, 1), from which the teacher's normals are drawn."""
  normal, count = statistics.NormalDist(), 2**_QUANTILE_BITS
  return np.array([normal.inv_cdf((i + 0.5) / count) for i in range(count)], dtype=np.float32)


class _IdEffects:
  """Unit-scale per-id effects [v (K), a, a'] of any (table, rank), float32 [N, K + 2]: hashed, then shrunk."""

  def __init__(self, spec: SyntheticSpec, zipf: zipf.ZipfTables, key: int):
    self._dim, self._key, self._zipf = spec.teacher_embedding_dim, key, zipf
    self._words = math.ceil((self._dim + 2) * _QUANTILE_BITS / 64)  # 64-bit hashes per (table, rank).
    self._shrink_count, self._reference_examples = spec.shrink_count, spec.shrink_reference_examples
    self._quantiles = _normal_quantiles()

  def __call__(self, table_N: np.ndarray, rank_N: np.ndarray) -> np.ndarray:
    counter_N = (table_N.astype(np.uint64) << np.uint64(32)) + rank_N.astype(np.uint64)
    words = np.arange(self._words, dtype=np.uint64)
    hashes_NxH = counter_hash.splitmix64(counter_N[:, None] * np.uint64(self._words) + words, self._key)
    normal_NxW = np.take(self._quantiles, hashes_NxH.view(np.uint16)[:, : self._dim + 2])
    expected_N = self._zipf.probability(table_N, rank_N) * self._reference_examples
    shrink_N = (expected_N / np.maximum(expected_N + self._shrink_count, 1e-300)).astype(np.float32)
    scale_NxW = np.repeat(np.stack([np.sqrt(shrink_N), shrink_N], axis=1), [self._dim, 2], axis=1)
    return normal_NxW * scale_NxW


def _cached_or_hashed(
  head_values: np.ndarray, ranks: zipf.Ranks, on_demand: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
  """The values of every draw, [N * T, ...]: gathered from the head cache, computed on demand for the tail."""
  values = np.take(head_values, ranks.entry_NxT.ravel(), axis=0)
  if ranks.tail_P.size:
    values[ranks.tail_P] = on_demand(ranks.tail_table_P, ranks.tail_rank_P)
  return values


def _dense_counts(draws_NxF: np.ndarray, log_location_F: np.ndarray, log_scale_F: np.ndarray, xp=np) -> np.ndarray:
  """count = floor(exp(location + scale * logistic noise)) >= 0, float32: heavy-tailed like Criteo's. `xp`: numpy,
  or jax.numpy (`synthetic_device`)."""
  u = ((draws_NxF >> xp.uint32(9)).astype(xp.float32) + xp.float32(0.5)) * xp.float32(2.0**-23)  # u, 1-u exact.
  logistic = xp.log(u / (xp.float32(1.0) - u))
  return xp.floor(xp.exp(log_location_F + log_scale_F * logistic))


def _dense_features(draws_NxF: np.ndarray, log_location_F: np.ndarray, log_scale_F: np.ndarray, xp=np) -> np.ndarray:
  """log(1 + count) of `_dense_counts`."""
  counts = _dense_counts(draws_NxF, log_location_F, log_scale_F, xp)
  return xp.log(counts + xp.float32(1.0))  # Exact integers in float32: log(c + 1) is log1p, only faster.


@dataclasses.dataclass
class _Teacher:
  """The fixed random model that labels the stream. Its per-id effects are unit rows (`_IdEffects`) times
  `effect_scale_W`."""

  dense_mean_F: np.ndarray
  dense_std_F: np.ndarray
  dense_linear_F: np.ndarray
  hidden_in_FxH: np.ndarray
  hidden_bias_H: np.ndarray
  hidden_out_H: np.ndarray
  cross_HxK: np.ndarray
  effect_scale_W: np.ndarray  # [K + 2]: the scale of v (K columns), a and a'.
  bias: float = 0.0

  def logit_terms(
    self, dense_NxF: np.ndarray, unit_rows_NxTW: np.ndarray, angle_N: np.ndarray | None
  ) -> dict[str, np.ndarray]:
    """Each term of the logit (bias excluded), float32 [N], from the unit per-id rows of the N examples."""
    x_NxF = (dense_NxF - self.dense_mean_F) / self.dense_std_F
    hidden_NxH = np.tanh(x_NxF @ self.hidden_in_FxH + self.hidden_bias_H)
    width = self.effect_scale_W.size
    dim, num_tables = width - 2, unit_rows_NxTW.shape[1] // width
    # Sums over tables, and the scales, as matmuls (faster than numpy's strided sum).
    sums_NxW = unit_rows_NxTW @ np.tile(np.diag(self.effect_scale_W), (num_tables, 1))
    square_scale_W = np.where(np.arange(width) < dim, np.square(self.effect_scale_W), np.float32(0))
    squares_N = np.square(unit_rows_NxTW) @ np.tile(square_scale_W, num_tables)
    embedding_sum_NxK = sums_NxW[:, :dim]
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

  def logit(self, dense_NxF: np.ndarray, unit_rows_NxTW: np.ndarray, angle_N: np.ndarray | None) -> np.ndarray:
    return self.bias + sum(self.logit_terms(dense_NxF, unit_rows_NxTW, angle_N).values())


class SyntheticSource:
  """Random access to the infinite synthetic stream of `spec`: `read(start, count)` and its true probabilities."""

  def __init__(self, spec: SyntheticSpec = SyntheticSpec()):
    self.spec = spec
    rng = np.random.default_rng(spec.seed)
    example_key, permutation_key, effects_key = (
      int(k) for k in counter_hash.splitmix64(np.arange(3, dtype=np.uint64), spec.seed)
    )
    self._key = example_key
    self._zipf = zipf.ZipfTables(spec.cardinalities, spec.zipf_exponent)
    self._permutation = zipf.IdPermutation(spec.cardinalities, permutation_key)
    self._effects = _IdEffects(spec, self._zipf, effects_key)
    head_table, head_rank = self._zipf.entry_ranks()
    self._head_ids = self._permutation(head_table, head_rank)
    self._head_effects = self._effects(head_table, head_rank)
    self._log_location_F = rng.uniform(-1.0, 6.0, NUM_DENSE_FEATURES).astype(np.float32)
    self._log_scale_F = rng.uniform(0.5, 1.5, NUM_DENSE_FEATURES).astype(np.float32)
    self._teacher = _random_teacher(spec, rng)
    dense_NxF, ranks, _ = self._features(0, _CALIBRATION_EXAMPLES)
    _calibrate(self._teacher, spec, dense_NxF, self._unit_rows(ranks))

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

  def _features(self, start: int, count: int) -> tuple[np.ndarray, zipf.Ranks, np.ndarray]:
    """Dense features, ranks and the label draws of examples [start, start + count)."""
    draws = _random_draws(self._key, start, count)
    ranks = self._zipf.sample(draws[:, :NUM_SPARSE_FEATURES])
    dense_NxF = _dense_features(draws[:, NUM_SPARSE_FEATURES:_LABEL_COLUMN], self._log_location_F, self._log_scale_F)
    return dense_NxF, ranks, draws[:, _LABEL_COLUMN]

  def _unit_rows(self, ranks: zipf.Ranks) -> np.ndarray:
    """float32 [N, T (K + 2)]: the unit per-id effects of every draw, table after table."""
    return _cached_or_hashed(self._head_effects, ranks, self._effects).reshape(len(ranks.entry_NxT), -1)

  def _drift_angle(self, start: int, count: int) -> np.ndarray | None:
    if self.spec.drift == 0:
      return None
    index = np.arange(start, start + count, dtype=np.float64)
    return (0.5 * np.pi * self.spec.drift / self.spec.drift_horizon * index).astype(np.float32)

  def _generate_into(self, start: int, batch: Batch, probability: np.ndarray) -> None:
    """Writes examples [start, start + len(probability)) into the given views."""
    dense_NxF, ranks, label_draw_N = self._features(start, len(probability))
    logit_N = self._teacher.logit(dense_NxF, self._unit_rows(ranks), self._drift_angle(start, len(probability)))
    probability_N = 1.0 / (1.0 + np.exp(-logit_N.astype(np.float64)))
    batch.dense[:] = dense_NxF
    batch.sparse[:] = _cached_or_hashed(self._head_ids, ranks, self._permutation).reshape(batch.sparse.shape)
    batch.label[:] = _open_unit(label_draw_N) < probability_N
    probability[:] = probability_N


def _random_teacher(spec: SyntheticSpec, rng: np.random.Generator) -> _Teacher:
  """Unit-scale random dense parameters; `_calibrate` then sets every term's scale and the bias."""
  hidden, dim = spec.dense_hidden_units, spec.teacher_embedding_dim
  normal = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
  return _Teacher(
    dense_mean_F=np.zeros(NUM_DENSE_FEATURES, np.float32),
    dense_std_F=np.ones(NUM_DENSE_FEATURES, np.float32),
    dense_linear_F=normal(NUM_DENSE_FEATURES),
    hidden_in_FxH=normal(NUM_DENSE_FEATURES, hidden) * np.float32(2.0 / np.sqrt(NUM_DENSE_FEATURES)),
    hidden_bias_H=normal(hidden),
    hidden_out_H=normal(hidden),
    cross_HxK=normal(hidden, dim),
    effect_scale_W=np.ones(dim + 2, np.float32),
  )


def _calibrate(teacher: _Teacher, spec: SyntheticSpec, dense_NxF: np.ndarray, unit_rows_NxTW: np.ndarray) -> None:
  """Standardizes the dense inputs, scales each logit term to its spec std, then sets the bias for mean_ctr."""
  teacher.dense_mean_F = dense_NxF.mean(axis=0)
  teacher.dense_std_F = np.maximum(dense_NxF.std(axis=0), 1e-3)
  std = _term_stds(teacher, dense_NxF, unit_rows_NxTW)
  teacher.dense_linear_F *= np.float32(spec.dense_linear_scale / std['dense_linear'])
  teacher.hidden_out_H *= np.float32(spec.dense_nonlinear_scale / std['dense_nonlinear'])
  dim = spec.teacher_embedding_dim
  effect_scale_W = np.full(dim + 2, spec.first_order_scale / std['first_order'])
  effect_scale_W[:dim] = np.sqrt(spec.pairwise_scale / std['pairwise'])  # Pairwise is quadratic in v.
  teacher.effect_scale_W = effect_scale_W.astype(np.float32)
  cross_std = _term_stds(teacher, dense_NxF, unit_rows_NxTW)['dense_cross']
  teacher.cross_HxK *= np.float32(spec.dense_cross_scale / cross_std)
  teacher.bias = _bias_for_mean(teacher.logit(dense_NxF, unit_rows_NxTW, None).astype(np.float64), spec.mean_ctr)


def _term_stds(teacher: _Teacher, dense_NxF: np.ndarray, unit_rows_NxTW: np.ndarray) -> dict[str, float]:
  terms = teacher.logit_terms(dense_NxF, unit_rows_NxTW, None)
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
