"""Emulated failures (docs/design.md §7): when they strike (exponential gaps of mean MTBF) and what they hit.

  schedule = failures.FailureSchedule(seed=0, mtbf_steps=500, target='embedding_shard', num_replicas=8,
                                      num_shards=4, total_steps=10_000)
  for failure in schedule.failures_at(executed_steps):  # at a step boundary, before a checkpoint due there
    print(failure)                                         # 'step 1234: embedding shard 3 fails'
    log(failure.to_dict())                                 # {'step': 1234, 'kind': 'embedding_shard', 'index': 3}
    rows_K = failures.embedding_shard_rows(cardinalities, num_shards=4, shard=failure.index)

The clock counts training steps executed, re-trained ones included (full recovery rewinds the data, not the
clock); saves and restores do not advance it, so a schedule is a pure function of the seed. Failure times are a
Poisson process: gaps exponential with mean `mtbf_steps`, continuous. A failure at time t strikes while step
`ceil(t)` runs (steps count from 1), so that step's work is lost too; the loop handles it at the boundary where
`ceil(t)` steps have run, before saving a checkpoint due at that boundary. Each failure hits one part, uniformly
at random: a replica (one of R) or an embedding shard (one of S). Times and targets come from separate streams of
the seed, so the same seed gives the same failure steps whatever the target and the replica or shard count.

An embedding shard is a parameter-server shard in CPR's sense (Maeng et al., "CPR: Understanding and Improving
Failure Tolerant Training for Deep Learning Recommendation with Partial Recovery", MLSys 2021,
arXiv:2011.02999): shard s holds the s-th of S contiguous, near-equal row ranges of EVERY table (row-wise
sharding), so each shard holds about 1/S of every table and sees about 1/S of the lookups when a table's ids are
spread over its rows (the synthetic stream scatters Zipf ranks by a permutation; Criteo ids are hashed). A
table with fewer than S rows leaves some shards without rows of it.
"""

import bisect
from collections.abc import Iterator, Sequence
import math
from typing import NamedTuple

import numpy as np

from shadowsync_jax.model import embedding

TARGETS = ('replica', 'embedding_shard')
_DRAWS_PER_CHUNK = 256  # Gaps (and targets) drawn at a time; fixed, so the draws depend on the seed alone.
_SEED_SALT = 0x5EED_FA11  # Keeps these streams apart from other users of the same config seed.


class Failure(NamedTuple):
  """One emulated failure: it strikes while step `step` runs and takes down part `index` of kind `kind`."""

  step: int
  kind: str  # 'replica' or 'embedding_shard'
  index: int  # Which replica (0..R-1) or shard (0..S-1).

  def __str__(self) -> str:
    return f'step {self.step}: {self.kind.replace("_", " ")} {self.index} fails'

  def to_dict(self) -> dict[str, int | str]:
    return {'step': self.step, 'kind': self.kind, 'index': self.index}


class FailureSchedule:
  """Seeded failures at exponentially distributed times; deterministic in (seed, mtbf_steps, target, part count).

  Failures are drawn lazily as later steps are asked for; with `total_steps` the schedule ends there (failures
  strike only while steps 1..total_steps run) and can be iterated. Full recovery executes more steps than the
  data holds (lost work is re-trained), so give it no `total_steps`, or one with room for the re-trained steps.
  `num_parts` is what a failure picks from (R replicas or S shards): the N of `checkpoint_interval`'s PLS.
  """

  def __init__(
    self, seed: int, mtbf_steps: float, target: str, num_replicas: int, num_shards: int, total_steps: int | None = None
  ):
    if not mtbf_steps > 0:
      raise ValueError(f'mtbf_steps={mtbf_steps} must be positive.')
    if target not in TARGETS:
      raise ValueError(f'target={target!r} is not one of {", ".join(TARGETS)}.')
    if num_replicas < 1 or num_shards < 1:
      raise ValueError(f'num_replicas={num_replicas} and num_shards={num_shards} must be >= 1.')
    if total_steps is not None and total_steps < 0:
      raise ValueError(f'total_steps={total_steps} must be >= 0 (or None: no end).')
    self.mtbf_steps = float(mtbf_steps)
    self.target = target
    self.num_parts = num_replicas if target == 'replica' else num_shards
    self.total_steps = total_steps
    time_seed, target_seed = np.random.SeedSequence([_SEED_SALT, seed]).spawn(2)
    self._time_rng = np.random.default_rng(time_seed)
    self._target_rng = np.random.default_rng(target_seed)
    self._time = 0.0  # Time of the last failure drawn, in steps.
    self._failures: list[Failure] = []
    self._steps: list[int] = []  # self._failures' steps, nondecreasing.

  def failures_at(self, step: int) -> list[Failure]:
    """The failures that strike while step `step` runs (usually none, rarely several), in the order drawn."""
    self._draw_through(step)
    return self._failures[bisect.bisect_left(self._steps, step) : bisect.bisect_right(self._steps, step)]

  def next_failure_after(self, step: int) -> int | None:
    """The step of the first failure after `step` (None: the schedule ends before one)."""
    horizon = step + 1
    while True:
      self._draw_through(horizon)
      later = bisect.bisect_right(self._steps, step)
      if later < len(self._steps):
        return self._steps[later]
      if self._time == math.inf or (self.total_steps is not None and horizon >= self.total_steps):
        return None
      horizon = max(2 * horizon, math.ceil(self._time) + 1)

  def failures_between(self, first_step: int, last_step: int) -> list[Failure]:
    """The failures striking while steps first_step..last_step (inclusive) run."""
    self._draw_through(last_step)
    return self._failures[bisect.bisect_left(self._steps, first_step) : bisect.bisect_right(self._steps, last_step)]

  def __iter__(self) -> Iterator[Failure]:
    if self.total_steps is None:
      raise ValueError('An endless schedule (total_steps=None) cannot be iterated; use failures_between.')
    return iter(self.failures_between(1, self.total_steps))

  def __len__(self) -> int:
    return len(list(iter(self)))

  def _draw_through(self, step: int) -> None:
    """Draws failures until one lies beyond `step` (or beyond the end of the schedule)."""
    horizon = step if self.total_steps is None else min(step, self.total_steps)
    while self._time < horizon:
      gaps = self._time_rng.exponential(self.mtbf_steps, _DRAWS_PER_CHUNK)
      parts = self._target_rng.integers(0, self.num_parts, _DRAWS_PER_CHUNK)
      for time, part in zip(self._time + np.cumsum(gaps), parts):
        if self.total_steps is not None and time >= self.total_steps:
          self._time = math.inf  # The schedule ends: nothing more strikes.
          break
        failure_step = max(1, math.ceil(time))
        self._failures.append(Failure(failure_step, self.target, int(part)))
        self._steps.append(failure_step)
        self._time = float(time)


def embedding_shard_row_ranges(cardinalities: Sequence[int], num_shards: int, shard: int) -> list[tuple[int, int]]:
  """Shard `shard`'s rows of the concatenated table: one [start, stop) range per table (possibly empty)."""
  if not 0 <= shard < num_shards:
    raise ValueError(f'shard={shard} must be in [0, {num_shards}).')
  ranges = []
  for offset, rows in zip(embedding.table_offsets(cardinalities), cardinalities):
    start, stop = (rows * shard) // num_shards, (rows * (shard + 1)) // num_shards
    ranges.append((int(offset) + start, int(offset) + stop))
  return ranges


def embedding_shard_rows(cardinalities: Sequence[int], num_shards: int, shard: int) -> np.ndarray:
  """Shard `shard`'s rows of the concatenated table, ascending: int32 [about sum(cardinalities) / S]."""
  ranges = embedding_shard_row_ranges(cardinalities, num_shards, shard)
  return np.concatenate([np.arange(start, stop, dtype=np.int32) for start, stop in ranges])
