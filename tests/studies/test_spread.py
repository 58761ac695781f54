"""The figures over repeated runs: mean and range, grouped by a key of the run."""

import pytest

from shadowsync_jax.studies import spread


def test_mean_and_range_leave_out_missing_values():
  figures = spread.mean_and_range({'pct': [1.0, None, 3.0], 'none': [None]})
  assert figures == {'pct': 2.0, 'pct_range': [1.0, 3.0], 'none': None, 'none_range': None}
  assert spread.span(figures, 'pct', '{:.1f}%') == '2.0% (1.0% to 3.0%)'
  assert spread.span(figures, 'none', '{:.1f}') == ''


def test_by_group_keeps_the_order_of_first_appearance_and_groups_only_its_rows():
  rows = [{'mode': 'full', 'ne': 1.0}, {'mode': 'cpr', 'ne': 4.0}, {'mode': 'full', 'ne': 2.0}]
  groups = spread.by_group(rows, lambda r: r['mode'], lambda runs: {'ne': [r['ne'] for r in runs]})
  assert list(groups) == ['full', 'cpr']
  assert groups['full']['ne'] == pytest.approx(1.5) and groups['full']['ne_range'] == [1.0, 2.0]
  assert groups['cpr'] == {'ne': 4.0, 'ne_range': [4.0, 4.0]}
