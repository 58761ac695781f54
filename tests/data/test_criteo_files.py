"""Criteo input files: gzip streams read like plain files, row counts, the DLRM days, the standard splits."""

import gzip
import os

import numpy as np
import pytest

from shadowsync_jax.data.criteo import files


def _lines(count: int, start: int = 0) -> bytes:
  return b''.join(b'%d\tline\n' % i for i in range(start, start + count))


def test_gzip_members_read_as_one_stream_with_the_compressed_bytes_counted(tmp_path):
  text = _lines(5000)
  path = tmp_path / 'day_0.gz'
  path.write_bytes(gzip.compress(text[:30000]) + gzip.compress(text[30000:]))  # Two members, as a parallel writer.
  chunks = list(files.read_chunks(str(path), chunk_bytes=4096))
  assert b''.join(chunk for chunk, _ in chunks) == text
  assert sum(consumed for _, consumed in chunks) == os.path.getsize(path)
  assert b''.join(chunk for chunk, _ in files.read_chunks(str(path), skip=12345, chunk_bytes=999)) == text[12345:]
  assert files.is_gzip(str(path)) and files.count_rows(str(path)) == 5000


def test_plain_byte_ranges_and_counts(tmp_path):
  text = _lines(1000)
  path = tmp_path / 'day_0'
  path.write_bytes(text + b'last line without newline')
  assert b''.join(c for c, _ in files.read_chunks(str(path), 100, 5000, skip=7, chunk_bytes=333)) == text[107:5000]
  assert files.count_rows(str(path)) == 1001
  assert files.lines_before(str(path), len(_lines(250))) == 250
  assert files.line_starts(str(path), [0, 250, 999]) == [0, len(_lines(250)), len(_lines(999))]
  with pytest.raises(ValueError, match='gzip file is read whole'):
    (tmp_path / 'z.gz').write_bytes(gzip.compress(text))
    next(files.read_chunks(str(tmp_path / 'z.gz'), 10, 20))


def test_day_sizes_are_the_dlrm_references():
  """DLRM (data_utils.getCriteoAdData): divmod(total, 7), the first `extras` days one row longer."""
  assert files.day_sizes(45_840_617, 7) == [6_548_660] * 4 + [6_548_659] * 3
  assert sum(files.day_sizes(45_840_617, 7)[:6]) == 39_291_958  # Kaggle's training rows.


def test_one_plain_file_is_cut_into_days_the_last_held_out(tmp_path):
  path = tmp_path / 'train.txt'
  path.write_bytes(_lines(703))
  splits = files.day_layout([str(path)], days=7, heldout_days=1)
  pieces = splits['train'] + splits['heldout']
  assert [len(splits['train']), len(splits['heldout'])] == [6, 1]
  sizes = files.day_sizes(703, 7)
  assert [p.first_line for p in pieces] == list(np.cumsum([1, *sizes[:-1]]))
  text = path.read_bytes()
  for piece, size in zip(pieces, sizes):
    day = text[piece.start : piece.end]
    assert day.count(b'\n') == size and day.startswith(b'%d\t' % (piece.first_line - 1))


def test_several_files_are_one_day_each(tmp_path):
  paths = []
  for day in range(24):
    paths.append(str(tmp_path / f'day_{day}.gz'))
    (tmp_path / f'day_{day}.gz').write_bytes(gzip.compress(_lines(3)))
  splits = files.day_layout(files.expand_inputs(str(tmp_path / 'day_*.gz')), heldout_days=1)
  assert [p.path for p in splits['train']] == paths[:23] and [p.path for p in splits['heldout']] == paths[23:]
  with pytest.raises(ValueError, match='plain file'):
    files.day_layout([paths[0]], days=7)
  with pytest.raises(ValueError, match='heldout_days'):
    files.day_layout(paths[:1], heldout_days=1)
  with pytest.raises(FileNotFoundError, match='nope'):
    files.expand_inputs(str(tmp_path / 'nope*'))


def test_true_probabilities_lie_beside_the_day_file():
  assert files.true_probability_path('/d/day_3.gz') == '/d/day_3.p_true.npy'
  assert files.true_probability_path('/d/day_3') == '/d/day_3.p_true.npy'
  assert files.true_probability_path('/d/train.tsv') == '/d/train.p_true.npy'
