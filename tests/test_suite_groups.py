"""The suite's own setup: jobs of real processes run one at a time (pytest.ini's `--dist loadgroup`)."""

import os

import pytest

pytestmark = pytest.mark.xdist_group('jobs')


def test_the_jobs_group_holds_under_xdist(request):
  """pytest-xdist's loadgroup sends a module marked `xdist_group('jobs')` to one worker by a suffix on each test's
  node id. pytest 9.2 reads the node id from elsewhere, so the suffix is lost and the group with it: jobs of real
  processes then ran on both workers at once (4 processes on 2 cores) and timing tests failed beside each other
  (requirements.txt pins pytest 9.1.1 for this)."""
  if not os.environ.get('PYTEST_XDIST_WORKER'):
    pytest.skip('not under pytest-xdist (-n 0): nothing runs beside this test')
  assert request.node.nodeid.endswith('@jobs'), request.node.nodeid
