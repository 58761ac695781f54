"""Reading prepared data through the training input pipeline: the TSV stream's batches, each process its own
replicas' rows (disjoint, together the whole step), resumable at any step, each block decoded once."""

import concurrent.futures
import multiprocessing

import generated_criteo
import numpy as np
import pytest

from shadowsync_jax.data import input_pipeline
from shadowsync_jax.data.criteo import source as criteo_source
from shadowsync_jax.data.prepared import source as prepared_source

R, B = 4, 96  # A global step of 384 rows: steps straddle the 500-row blocks and the file boundary.


def _stream(version_dir):
  source = prepared_source.PreparedSource(version_dir, 'train')
  return input_pipeline.StreamSlice(source, 0, len(source)), len(source)


def _batches(version_dir, replicas=None, start_step=0):
  stream, n = _stream(version_dir)
  return list(input_pipeline.train_batches(stream, R, B, n, start_step=start_step, replicas=replicas))


def test_the_pipeline_gives_the_tsv_streams_batches(criteo_days, prepared_criteo):
  _, version_dir, _ = prepared_criteo
  tsv = criteo_source.CriteoSource([generated_criteo.plain(p) for p in criteo_days[:2]], generated_criteo.CARDINALITIES)
  stream, n = _stream(version_dir)
  from_tsv = list(input_pipeline.train_batches(input_pipeline.StreamSlice(tsv, 0, n), R, B, n))
  from_prepared = _batches(version_dir)
  assert len(from_prepared) == len(from_tsv) == n // (R * B)
  for a, b in zip(from_prepared, from_tsv):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)


def test_resuming_at_any_step_continues_the_same_stream(prepared_criteo):
  _, version_dir, _ = prepared_criteo
  full = _batches(version_dir)
  for start in (1, 11, len(full) - 1):
    resumed = _batches(version_dir, start_step=start)
    assert len(resumed) == len(full) - start
    np.testing.assert_array_equal(resumed[0].sparse, full[start].sparse)
    np.testing.assert_array_equal(resumed[-1].dense, full[-1].dense)


def _process_reads(version_dir: str, process: int, num_processes: int) -> list[np.ndarray]:
  """What one process of a job reads: its replicas' labels and ids, step by step."""
  local = R // num_processes
  replicas = range(process * local, (process + 1) * local)
  return [np.concatenate([b.label[..., None], b.sparse], -1) for b in _batches(version_dir, replicas)]


def test_two_processes_read_disjoint_rows_that_make_up_every_step(prepared_criteo):
  _, version_dir, _ = prepared_criteo
  with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('spawn')) as pool:
    reads = list(pool.map(_process_reads, [version_dir] * 2, [0, 1], [2, 2]))
  whole = _process_reads(version_dir, 0, 1)
  assert len(reads[0]) == len(reads[1]) == len(whole)
  for step, (mine, theirs, both) in enumerate(zip(*reads, whole)):
    assert mine.shape == theirs.shape == (R // 2, B, 27)
    np.testing.assert_array_equal(np.concatenate([mine, theirs]), both, err_msg=f'step {step}')


def test_blocks_are_decoded_once_however_many_threads_read_them(prepared_criteo):
  _, version_dir, _ = prepared_criteo
  source = prepared_source.PreparedSource(version_dir, 'train')
  stream = input_pipeline.StreamSlice(source, 0, len(source))
  for _ in input_pipeline.train_batches(stream, 1, 64, len(source), prefetch=4):
    pass
  assert source.blocks_decoded == len(source._rows_R)


def test_reads_outside_the_split_and_unknown_splits_are_refused(prepared_criteo):
  _, version_dir, _ = prepared_criteo
  source = prepared_source.PreparedSource(version_dir, 'heldout')
  with pytest.raises(ValueError, match='cannot read rows'):
    source.read(len(source) - 5, 10)
  with pytest.raises(ValueError, match="no split 'validation'.*train, heldout"):
    prepared_source.PreparedSource(version_dir, 'validation')
