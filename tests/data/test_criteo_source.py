"""Tests of the Criteo TSV reader: transform against hand-computed values, random access, and clear errors."""

import math
import pathlib

import numpy as np
import pytest

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.data.criteo import parse
from shadowsync_jax.data.criteo import source as criteo

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = REPO_ROOT / 'tests' / 'data' / 'criteo_tiny.tsv'
KAGGLE_SAMPLE = REPO_ROOT.parent / 'shared' / 'data' / 'criteo_kaggle_sample.tsv'
CARDINALITIES = (1000,) * 26
# Line 1 of the Kaggle sample, and its transform worked out by hand.
SAMPLE_LINE_1 = (
  '0\t\t3\t260\t\t17668\t\t\t33\t\t\t\t0\t\t05db9164\t08d6d899\t9143c832\tf56b7dd5\t25c83c98\t'
  '7e0ccccf\tdf5c2d18\t0b153874\ta73ee510\t8f48ce11\ta7b606c4\tae1bb660\teae197fd\tb28479f6\t'
  'bfef54b3\tbad5ee18\te5ba7672\t87c6f83c\t\t\t0429f84b\t\t3a171ecb\tc0d61a5c\t\t'
)


def _write(tmp_path: pathlib.Path, text: str, name: str = 'rows.tsv') -> str:
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def _good_line(label: str = '1') -> str:
  return '\t'.join([label] + ['1'] * 13 + ['0000000a'] * 26)


def test_hand_computed_row(tmp_path):
  batch = criteo.CriteoSource(_write(tmp_path, SAMPLE_LINE_1 + '\n'), CARDINALITIES).read(0, 1)
  counts = [0, 3, 260, 0, 17668, 0, 0, 33, 0, 0, 0, 0, 0]  # empty -> 0
  np.testing.assert_allclose(batch.dense[0], [math.log1p(c) for c in counts], rtol=1e-6)
  assert batch.sparse[0, 0] == 684  # 0x05db9164 = 98275684
  assert batch.sparse[0, 1] == 881  # 0x08d6d899 = 148297881
  assert batch.sparse[0, 18] == 0 and batch.sparse[0, 25] == 0  # missing categories -> id 0
  assert batch.label[0] == 0.0


def test_negative_counts_clip_to_zero(tmp_path):
  line = '\t'.join(['1', '-1', '-7'] + ['5'] * 11 + ['ff'] * 26)
  batch = criteo.CriteoSource(_write(tmp_path, line + '\n'), (7,) * 26).read(0, 1)
  np.testing.assert_allclose(batch.dense[0, :3], [0.0, 0.0, math.log(6.0)], rtol=1e-6)
  assert np.all(batch.sparse[0] == 255 % 7)


def test_tiny_fixture_shapes_and_a_python_reference():
  source = criteo.CriteoSource(str(TINY), CARDINALITIES)
  assert len(source) == 50
  batch = source.read(0, 50)
  assert batch.dense.shape == (50, 13) and batch.dense.dtype == np.float32
  assert batch.sparse.shape == (50, 26) and batch.sparse.dtype == np.int32
  assert batch.label.shape == (50,) and batch.label.dtype == np.float32
  for i, line in enumerate(TINY.read_text().splitlines()):
    fields = line.split('\t')
    assert batch.label[i] == int(fields[0])
    np.testing.assert_allclose(batch.dense[i], [math.log1p(max(int(x or 0), 0)) for x in fields[1:14]], rtol=1e-6)
    np.testing.assert_array_equal(batch.sparse[i], [int(x, 16) % 1000 if x else 0 for x in fields[14:]])


def test_any_range_reads_the_same_rows():
  source = criteo.CriteoSource(str(TINY), CARDINALITIES)
  whole = source.read(0, 50)
  for start, count in [(0, 1), (3, 10), (49, 1), (17, 33)]:
    part = source.read(start, count)
    for name, a, b in zip(Batch._fields, part, whole):
      np.testing.assert_array_equal(a, b[start : start + count], err_msg=name)
  assert source.read(5, 0).dense.shape == (0, 13)
  with pytest.raises(ValueError, match='50 rows'):
    source.read(45, 10)


def test_crlf_and_missing_final_newline_read_the_same(tmp_path):
  lines = [_good_line('0'), SAMPLE_LINE_1, _good_line('1')]
  plain = criteo.CriteoSource(_write(tmp_path, '\n'.join(lines) + '\n', 'a.tsv'), CARDINALITIES).read(0, 3)
  crlf = criteo.CriteoSource(_write(tmp_path, '\r\n'.join(lines), 'b.tsv'), CARDINALITIES)
  assert len(crlf) == 3
  for a, b in zip(plain, crlf.read(0, 3)):
    np.testing.assert_array_equal(a, b)


def test_kaggle_sample():
  if not KAGGLE_SAMPLE.parent.is_dir():
    pytest.skip(f'{KAGGLE_SAMPLE.parent} is absent (only the project workspace has ../shared/data).')
  source = criteo.CriteoSource(str(KAGGLE_SAMPLE), CARDINALITIES)
  assert len(source) == 200
  batch = source.read(0, 200)
  assert batch.label.sum() == 49
  assert batch.dense.shape == (200, 13) and batch.sparse.shape == (200, 26)
  assert batch.sparse[0, 0] == 684 and batch.dense[0, 4] == pytest.approx(math.log1p(17668))
  assert np.all(batch.dense >= 0) and np.all(batch.sparse < 1000)


def test_missing_file_names_it(tmp_path):
  with pytest.raises(FileNotFoundError, match='nope.tsv'):
    criteo.CriteoSource(str(tmp_path / 'nope.tsv'), CARDINALITIES)


def test_empty_file(tmp_path):
  path = _write(tmp_path, '')
  with pytest.raises(parse.CriteoFormatError, match=f'{path}.*empty'):
    criteo.CriteoSource(path, CARDINALITIES)


@pytest.mark.parametrize(
  'bad_line, message',
  [
    ('\t'.join(['1'] + ['1'] * 13 + ['0a'] * 25), 'expected 40 tab-separated columns, found 39'),
    ('\t'.join(['1'] + ['1'] * 13 + ['0a'] * 27), 'expected 40 tab-separated columns, found 41'),
    ('', 'expected 40 tab-separated columns, found 1'),
    ('\t'.join(['1'] + ['1'] * 13 + ['0a'] * 5 + ['0xzz'] + ['0a'] * 20), "category C6 must be hexadecimal.*'0xzz'"),
    ('\t'.join(['1'] + ['1'] * 13 + ['0a'] * 25 + ['1' * 17]), 'category C26 must be hexadecimal'),
    ('\t'.join(['1', '1', '2.5'] + ['1'] * 11 + ['0a'] * 26), "dense feature I2 must be an integer.*'2.5'"),
    ('\t'.join(['1'] + ['1'] * 12 + ['-'] + ['0a'] * 26), 'dense feature I13 must be an integer'),
    ('\t'.join(['1'] + ['1'] * 12 + ['nan'] + ['0a'] * 26), 'dense feature I13 must be an integer'),
    ('\t'.join(['2'] + ['1'] * 13 + ['0a'] * 26), "the label must be 0 or 1, found '2'"),
    ('\t'.join([''] + ['1'] * 13 + ['0a'] * 26), "the label must be 0 or 1, found ''"),
  ],
)
def test_bad_line_names_file_and_line(tmp_path, bad_line, message):
  path = _write(tmp_path, '\n'.join([_good_line(), _good_line(), bad_line, _good_line()]) + '\n')
  source = criteo.CriteoSource(path, CARDINALITIES)
  with pytest.raises(parse.CriteoFormatError, match=f'{path}:3: {message}'):
    source.read(0, 4)
  with pytest.raises(parse.CriteoFormatError, match=f'{path}:3: '):  # also when the read starts at line 2
    source.read(1, 3)
  source.read(3, 1)  # rows around the bad one still read
