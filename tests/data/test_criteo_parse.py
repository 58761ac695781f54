"""The Criteo parser: both paths against a Python reference, structured errors, and skipping malformed lines."""

import math
import pickle
import re

import numpy as np
import pytest

from shadowsync_jax.data.criteo import generate
from shadowsync_jax.data.criteo import malformed
from shadowsync_jax.data.criteo import parse

CARDINALITIES = (1000, 7, 1, 2**31 - 1) + (100_003,) * 22
GOOD = '\t'.join(['1'] + ['5'] * 13 + ['0000000a'] * 26)


def _random_block(seed: int, rows: int, max_digits: int) -> bytes:
  """Rows with counts of 1..max_digits digits (some negative), 32-bit hex hashes, fields missing at random."""
  rng = np.random.default_rng(seed)
  digits = rng.integers(1, max_digits + 1, (rows, 13))
  counts = rng.integers(0, 10**digits, dtype=np.int64)
  counts[rng.random((rows, 13)) < 0.05] *= -1
  return generate.format_rows(
    rng.integers(0, 2, rows).astype(np.uint8),
    counts,
    rng.integers(0, 2**32, (rows, 26), dtype=np.uint64),
    rng.random((rows, 13)) < 0.2,
    rng.random((rows, 26)) < 0.2,
  )


def _reference(data: bytes):
  """The transform of one line at a time, in plain Python."""
  label, dense, sparse = [], [], []
  for line in data.decode().splitlines():
    fields = line.split('\t')
    label.append(float(fields[0]))
    dense.append([math.log1p(max(int(x or 0), 0)) for x in fields[1:14]])
    sparse.append([int(x or '0', 16) % c for x, c in zip(fields[14:], CARDINALITIES)])
  return np.float32(label), np.float32(dense), np.int32(sparse)


@pytest.mark.parametrize('max_digits', [8, 16, 18])  # Up to 16: the fast path; 18: the general one.
def test_parse_matches_a_python_reference(max_digits):
  data = _random_block(max_digits, 500, max_digits)
  batch = parse.parse_rows(data, CARDINALITIES, 'x.tsv', 1)
  label, dense, sparse = _reference(data)
  np.testing.assert_array_equal(batch.label, label)
  np.testing.assert_array_equal(batch.sparse, sparse)
  np.testing.assert_allclose(batch.dense, dense, rtol=1e-6)


def test_fast_and_general_paths_agree_bit_for_bit():
  """A 7-digit hex field sends the whole block down the general path; every other row must read the same."""
  data = _random_block(0, 2000, 16)
  fast = parse.parse_rows(data, CARDINALITIES, 'x.tsv', 1)
  odd_line = '\t'.join(['0'] + ['1'] * 13 + ['abcdef1'] * 26) + '\n'
  general = parse.parse_rows(data + odd_line.encode(), CARDINALITIES, 'x.tsv', 1)
  for a, b in zip(fast, general):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b[:-1])
  assert general.sparse[-1, 3] == 0xABCDEF1


@pytest.mark.parametrize(
  'fields, kind, detail',
  [
    (['1'] + ['5'] * 13 + ['0a'] * 25, 'columns', 'expected 40 tab-separated columns, found 39'),
    (['x'] + ['5'] * 13 + ['0a'] * 26, 'label', "the label must be 0 or 1, found 'x'"),
    (['1', '5', '+5'] + ['5'] * 11 + ['0a'] * 26, 'dense', "dense feature I2 must be an integer, found '+5'"),
    (['1'] + ['5'] * 13 + ['0a'] * 3 + ['0x12'] + ['0a'] * 22, 'categorical', 'category C4 must be hexadecimal'),
  ],
)
def test_errors_say_file_line_and_kind(fields, kind, detail):
  data = '\n'.join([GOOD, GOOD, '\t'.join(fields), GOOD]) + '\n'
  with pytest.raises(parse.CriteoFormatError, match='^' + re.escape(f'day_3.tsv:12: {detail}')) as raised:
    parse.parse_rows(data.encode(), CARDINALITIES, 'day_3.tsv', first_line=10)
  assert (raised.value.path, raised.value.line, raised.value.kind) == ('day_3.tsv', 12, kind)
  copy = pickle.loads(pickle.dumps(raised.value))  # It crosses from the preparing workers to the caller.
  assert (copy.line, copy.kind, str(copy)) == (12, kind, str(raised.value))


def test_skipping_drops_each_kind_and_keeps_the_rest_exactly():
  good = _random_block(3, 40, 12).decode().splitlines()
  bad = {
    5: ('columns', ''),  # An empty line.
    9: ('label', '\t'.join(['2'] + ['5'] * 13 + ['0a'] * 26)),
    17: ('dense', '\t'.join(['1', '5.5'] + ['5'] * 12 + ['zz'] * 26)),  # Bad dense and categorical: dense first.
    30: ('categorical', '\t'.join(['1'] + ['5'] * 13 + ['0a'] * 25 + ['1' * 17])),
    31: ('columns', '\t'.join(['1'] * 41)),
  }
  lines = list(good)
  for index in sorted(bad):
    lines.insert(index, bad[index][1])
  batch, dropped = malformed.parse_skipping(('\n'.join(lines) + '\n').encode(), CARDINALITIES)
  assert {kind: list(at) for kind, at in dropped.items()} == {
    'columns': [5, 31],
    'label': [9],
    'dense': [17],
    'categorical': [30],
  }
  expected = parse.parse_rows(('\n'.join(good) + '\n').encode(), CARDINALITIES, 'x', 1)
  for a, b in zip(batch, expected):
    np.testing.assert_array_equal(a, b)


def test_skipping_a_block_without_problems_is_parsing_it():
  data = _random_block(4, 100, 10)
  batch, dropped = malformed.parse_skipping(data, CARDINALITIES)
  assert not any(len(at) for at in dropped.values())
  for a, b in zip(batch, parse.parse_rows(data, CARDINALITIES, 'x', 1)):
    np.testing.assert_array_equal(a, b)
