"""The failure schedule against the Poisson process it claims to be, and embedding shards against array_split."""

import json
import math

import numpy as np
import pytest

from shadowsync_jax.model import embedding
from shadowsync_jax.recovery import failures


def _schedule(seed=0, mtbf_steps=50.0, target='replica', num_replicas=8, num_shards=4, total_steps=200_000):
  return failures.FailureSchedule(seed, mtbf_steps, target, num_replicas, num_shards, total_steps)


def test_failure_count_and_gaps_follow_an_exponential_law():
  steps = np.array([f.step for f in _schedule()])
  expected = 200_000 / 50  # Poisson count: sd = sqrt(4000) = 63
  assert abs(len(steps) - expected) < 4 * math.sqrt(expected)
  gaps = np.diff(steps)
  assert abs(gaps.mean() - 50) < 4 * 50 / math.sqrt(len(gaps))
  # Exponential tail: P(gap > x) = exp(-x / mtbf); whole steps shift it by under a step.
  for x in (25, 50, 100, 200):
    assert abs(np.mean(gaps > x) - math.exp(-x / 50)) < 0.02, x


def test_steps_see_poisson_counts_including_several_failures_in_one_step():
  """Failure time t strikes step ceil(t): per step, the count is Poisson(1 / mtbf), several at once included."""
  total = 100_000
  steps = [f.step for f in _schedule(mtbf_steps=2.0, total_steps=total)]
  per_step = np.bincount(steps, minlength=total + 1)[1:]
  for k, tolerance in ((0, 0.008), (1, 0.008), (2, 0.005)):
    poisson = math.exp(-0.5) * 0.5**k / math.factorial(k)
    assert abs(np.mean(per_step == k) - poisson) < tolerance, k
  assert min(steps) >= 1 and max(steps) <= total


def test_targets_are_uniform_over_replicas_and_shards():
  for target, parts in (('replica', 8), ('embedding_shard', 4)):
    hits = np.bincount([f.index for f in _schedule(target=target)], minlength=parts)
    assert len(hits) == parts
    expected = hits.sum() / parts
    assert np.all(np.abs(hits - expected) < 4 * math.sqrt(expected)), (target, hits)
    assert {f.kind for f in _schedule(target=target, total_steps=5_000)} == {target}


def test_deterministic_in_the_seed_and_same_times_for_every_target():
  first = list(_schedule(seed=3, total_steps=20_000))
  assert first == list(_schedule(seed=3, total_steps=20_000))
  assert [f.step for f in first] != [f.step for f in _schedule(seed=4, total_steps=20_000)]
  shard_steps = [f.step for f in _schedule(seed=3, target='embedding_shard', total_steps=20_000)]
  few_replica_steps = [f.step for f in _schedule(seed=3, num_replicas=2, total_steps=20_000)]
  assert [f.step for f in first] == shard_steps == few_replica_steps


def test_lazy_queries_in_any_order_match_the_whole_schedule():
  whole = list(_schedule(seed=1, total_steps=3_000))
  by_step = {}
  for failure in whole:
    by_step.setdefault(failure.step, []).append(failure)
  queried = _schedule(seed=1, total_steps=3_000)
  for step in np.random.default_rng(0).permutation(np.arange(0, 3_100)):
    assert queried.failures_at(int(step)) == by_step.get(int(step), []), step
  endless = failures.FailureSchedule(1, 50.0, 'replica', 8, 4)  # total_steps=None: draws as far as asked
  assert endless.failures_between(1, 3_000) == whole
  assert endless.failures_between(3_001, 6_000)  # and goes on past the finite one's end
  with pytest.raises(ValueError, match='cannot be iterated'):
    iter(endless)


def test_golden_first_failures_of_seed_0():
  """Pins the draw scheme (seed salt, spawned streams, chunked draws). Update only when changing it on purpose:
  every seeded failure study then sees different failures."""
  got = [tuple(f) for f in _schedule(seed=0, mtbf_steps=100.0, total_steps=400)]
  assert got == GOLDEN_SEED_0, got


GOLDEN_SEED_0 = [(103, 'replica', 4), (168, 'replica', 1), (169, 'replica', 7), (378, 'replica', 6)]


def test_failure_is_loggable():
  failure = failures.Failure(1234, 'embedding_shard', 3)
  assert str(failure) == 'step 1234: embedding shard 3 fails'
  assert json.loads(json.dumps(failure.to_dict())) == {'step': 1234, 'kind': 'embedding_shard', 'index': 3}


@pytest.mark.parametrize(
  'kwargs, message',
  [
    ({'mtbf_steps': 0.0}, 'mtbf_steps'),
    ({'target': 'trainer'}, 'target'),
    ({'num_replicas': 0}, 'num_replicas'),
    ({'total_steps': -1}, 'total_steps'),
  ],
)
def test_invalid_schedules_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    _schedule(**kwargs)


def test_embedding_shards_split_every_table_into_contiguous_near_equal_ranges():
  cardinalities, num_shards = [3, 10, 7, 1, 64], 3
  offsets = embedding.table_offsets(cardinalities)
  shards = [failures.embedding_shard_rows(cardinalities, num_shards, s) for s in range(num_shards)]
  np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(sum(cardinalities)))  # a partition
  for t, (offset, rows) in enumerate(zip(offsets, cardinalities)):
    parts = [shard[(shard >= offset) & (shard < offset + rows)] for shard in shards]
    sizes = [len(part) for part in parts]
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1, (t, sizes)
    for s, part in enumerate(parts):
      np.testing.assert_array_equal(part, np.arange(part[0], part[0] + len(part)) if len(part) else part)
      if s and len(part) and len(parts[s - 1]):
        assert parts[s - 1][-1] + 1 == part[0], (t, s)  # shard s continues where shard s - 1 stopped
  # The table of 10 rows (offset 3) splits as [0, 3), [3, 6), [6, 10); the 1-row table goes to the last shard.
  assert [failures.embedding_shard_row_ranges(cardinalities, num_shards, s)[1] for s in range(3)] == [
    (3, 6),
    (6, 9),
    (9, 13),
  ]
  assert [len(failures.embedding_shard_row_ranges(cardinalities, num_shards, s)) for s in range(3)] == [5, 5, 5]
  assert 20 in shards[2] and 20 not in shards[0]
  assert all(s.dtype == np.int32 for s in shards)
  with pytest.raises(ValueError, match='shard'):
    failures.embedding_shard_rows(cardinalities, num_shards, 3)


def test_the_next_failure_after_a_step_is_the_schedules_next_and_none_past_its_end():
  """The training loop ends a block at the next failure: every failure step, in order, and nothing after the end."""
  ended = failures.FailureSchedule(
    seed=4, mtbf_steps=30.0, target='replica', num_replicas=2, num_shards=1, total_steps=500
  )
  steps = sorted({f.step for f in ended})
  walked, step = [], 0
  while (step := ended.next_failure_after(step)) is not None:
    walked.append(step)
  assert walked == steps and len(steps) > 5
  endless = failures.FailureSchedule(seed=4, mtbf_steps=30.0, target='replica', num_replicas=2, num_shards=1)
  assert endless.next_failure_after(10_000) > 10_000  # Drawn as far as needed.
  assert [endless.next_failure_after(s - 1) for s in steps] == steps
