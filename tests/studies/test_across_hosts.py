"""The across-hosts study's reading: each row's paired ratio and eval NE as the mean and range of its runs."""

import pytest

from shadowsync_jax.studies import across_hosts


def _summary(ne, speed):
  return {
    'eval_ne': ne,
    'examples_per_sec_per_process': [speed, speed],
    'sync_rounds': 10,
    'mean_sync_gap': 40.0,
    'sync_job_interval_s': 0.1,
    'net_bytes_sent': [1e6, 1e6],
    'train_steps': 100,
  }


def test_a_row_of_several_runs_gives_mean_and_range_one_run_its_value():
  shadow = across_hosts.row([_summary(0.836, 60.0), _summary(0.838, 66.0)], [60.0, 66.0], [0.9, 1.0])
  assert shadow['vs_none_paired'] == pytest.approx(0.95) and shadow['vs_none_paired_range'] == [0.9, 1.0]
  assert shadow['eval_ne_mean'] == pytest.approx(0.837)
  sync = across_hosts.row([_summary(0.840, 6.0)], [6.0], [0.1])
  none = across_hosts.row([_summary(0.85, 64.0)] * 2, [64.0] * 2, [1.0, 1.0])
  text = across_hosts.table({('1gbit', 'none'): none, ('1gbit', 'sync_sgd'): sync, ('1gbit', 'shadow_ma'): shadow})
  assert '| 1gbit | none | 64 | 64 | 1.00 | 0.8500 (0.8500 to 0.8500) |' in text
  assert '| 1gbit | sync_sgd | 6 | 6 | 0.10 | 0.8400 | +0.00% |' in text
  assert '| 1gbit | shadow_ma | 63 | 63 | 0.95 (0.90 to 1.00) | 0.8370 (0.8360 to 0.8380) | -0.36% |' in text


def test_a_study_without_sync_sgd_tables_no_ne_gap():
  """`sync_sgd` is the NE reference; a study run without it (`--algorithms`) writes '-' where the gap would be."""
  shadow = across_hosts.row([_summary(0.836, 60.0)], [60.0], [0.9])
  none = across_hosts.row([_summary(0.85, 64.0)], [64.0], [1.0])
  text = across_hosts.table({('1gbit', 'none'): none, ('1gbit', 'shadow_ma'): shadow})
  assert '| 1gbit | shadow_ma | 60 | 60 | 0.90 | 0.8360 | - |' in text
