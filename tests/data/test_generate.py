"""Generated Criteo day files hold the synthetic stream: its ids and labels exactly, its dense features to the bit
of the parser's transform, its true probabilities beside them."""

import gzip

import numpy as np
import pytest

from shadowsync_jax.data import synthetic
from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.criteo import generate
from shadowsync_jax.data.criteo import source as criteo_source

SPEC = synthetic.SyntheticSpec(seed=3, cardinalities=(1000,) * 20 + (7, 100_000, 3, 50, 2, 1))
ROWS, DAYS = 6000, 3


@pytest.fixture(scope='module')
def plain_days(tmp_path_factory):
  return generate.write_days(str(tmp_path_factory.mktemp('plain')), ROWS, DAYS, SPEC, gzip=False, num_workers=0)


def test_the_days_are_the_stream_in_order(plain_days):
  stream = synthetic.SyntheticSource(SPEC)
  expected, p_true = stream.read_with_probability(0, ROWS)
  counts = stream.dense_counts(0, ROWS)
  read = criteo_source.CriteoSource(plain_days, SPEC.cardinalities)
  assert read.file_rows == files.day_sizes(ROWS, DAYS)
  batch = read.read(0, ROWS)
  np.testing.assert_array_equal(batch.sparse, expected.sparse)
  np.testing.assert_array_equal(batch.label, expected.label)
  np.testing.assert_array_equal(batch.dense, np.log1p(counts.astype(np.float64)).astype(np.float32))
  ulps = np.abs(batch.dense.view(np.int32) - expected.dense.view(np.int32))
  assert ulps.max() <= 1  # The stream's float32 log(count + 1) against the parser's log1p in float64.
  np.testing.assert_allclose(read.true_probability(0, ROWS), p_true, rtol=1e-6)


def test_fields_look_like_criteo(plain_days):
  lines = open(plain_days[0], 'rb').read().splitlines()
  fields = [line.split(b'\t') for line in lines]
  assert all(len(f) == 40 for f in fields)
  hex_fields = [x for f in fields for x in f[14:] if x]
  assert {len(x) for x in hex_fields} == {8}  # Real Criteo: 8 hex digits or empty.
  empty_share = np.mean([x == b'' for f in fields for x in f[1:]])
  assert 0.02 < empty_share < 0.5
  assert any(f[2] == b'-1' for f in fields)  # I2 holds negative counts.


def test_parallel_gzip_days_hold_the_same_text(plain_days, tmp_path):
  gz_days = generate.write_days(str(tmp_path), ROWS, DAYS, SPEC, gzip=True, num_workers=2, chunk_rows=700)
  for gz, plain in zip(gz_days, plain_days):
    assert gz.endswith('.gz') and gzip.open(gz).read() == open(plain, 'rb').read()
    np.testing.assert_allclose(
      np.load(files.true_probability_path(gz)), np.load(files.true_probability_path(plain)), rtol=1e-6
    )
