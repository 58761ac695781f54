"""The stragglers study's reading: each straggler run against its own repeat's run without, over the repeats."""

import pytest

from shadowsync_jax.studies import stragglers


def _summary(fast, slow, ne=0.84, achieved=None):
  return {
    'examples_per_sec_per_process': [fast, slow],
    'eval_ne': ne,
    'eval_auc': 0.77,
    'sync_rounds': 10,
    'mean_sync_gap': 5.0,
    'straggler_achieved_slowdown': achieved,
  }


def test_each_straggler_run_is_read_against_its_own_repeats_run_without():
  results = {
    ('sync_sgd', 1.0, 0): _summary(100.0, 100.0),
    ('sync_sgd', 2.0, 0): _summary(50.0, 50.0, achieved=2.0),
    ('sync_sgd', 1.0, 1): _summary(80.0, 80.0),  # A slower repeat: its straggler run is read against it.
    ('sync_sgd', 2.0, 1): _summary(48.0, 48.0, achieved=2.1),
  }
  m = stragglers.by_algorithm(results)['sync_sgd']
  assert m['repeats'] == 2 and m['slowdown'] == 2.0
  assert m['fast_kept'] == pytest.approx(0.55) and m['fast_kept_range'] == pytest.approx([0.5, 0.6])
  assert m['achieved_slowdown'] == pytest.approx(2.05)
  text = stragglers.table(results)
  assert '| sync_sgd | 2 | **0.55 (0.50 to 0.60)** |' in text and '| sync_sgd | 2 | p1 2x slower | 48 |' in text


def test_raw_keys_round_trip_and_keys_written_before_repeats_read_as_repeat_0():
  assert stragglers.parse_key(stragglers.raw_key(('shadow_ma@sharded', 2.0, 2))) == ('shadow_ma@sharded', 2.0, 2)
  assert stragglers.parse_key('none x1') == ('none', 1.0, 0)
