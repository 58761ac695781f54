"""Preparing Criteo: the prepared dataset equals the TSV parse row for row, resumes without redoing finished parts
(also after a SIGKILL, leaving no process behind), and malformed lines stop it at their file and line or are
skipped and counted by kind."""

import gzip
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time

import generated_criteo
import numpy as np
import psutil
import pytest
import tensorflow_datasets as tfds

from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.criteo import parse
from shadowsync_jax.data.criteo import source as criteo_source
from shadowsync_jax.data.prepared import builder
from shadowsync_jax.data.prepared import manifest
from shadowsync_jax.data.prepared import prepare
from shadowsync_jax.data.prepared import source as prepared_source
from shadowsync_jax.data.prepared import units

CARDINALITIES, SMALL = generated_criteo.CARDINALITIES, generated_criteo.SMALL
GOOD = '\t'.join(['1'] + ['5'] * 13 + ['0000000a'] * 26)


def _assert_equal(a, b):
  for name, x, y in zip(('dense', 'sparse', 'label'), a, b):
    np.testing.assert_array_equal(x, y, err_msg=name)


def test_the_prepared_dataset_is_the_tsv_parse_row_for_row(criteo_days, prepared_criteo):
  data_dir, version_dir, result = prepared_criteo
  assert version_dir == os.path.join(data_dir, manifest.DATASET, 'gen', '1.0.0') and result.rows == 12_000
  info = manifest.read(version_dir)
  for split, paths in (('train', criteo_days[:2]), ('heldout', criteo_days[2:])):
    tsv = criteo_source.CriteoSource([generated_criteo.plain(p) for p in paths], CARDINALITIES)
    rows = tsv.read(0, len(tsv))
    source = prepared_source.PreparedSource(version_dir, split)
    assert len(source) == len(tsv) == manifest.split_rows(info, split)
    _assert_equal(source.read(0, len(source)), rows)
    np.testing.assert_array_equal(source.true_probability(0, len(source)), tsv.true_probability(0, len(tsv)))
    assert manifest.input_rows(info, split) == tsv.file_rows
    assert all(r <= 500 for shard in info['splits'][split]['shards'] for r in shard['rows_per_record'])
    # A tfds user reads the same blocks by name, without this package's builder.
    blocks = tfds.data_source(f'{manifest.DATASET}/gen', split=split, data_dir=data_dir)
    assert np.array_equal(np.concatenate([blocks[i]['sparse'] for i in range(len(blocks))]), rows.sparse)
    assert np.array_equal(np.concatenate([blocks[i]['label'] for i in range(len(blocks))]), rows.label)
    by_directory = tfds.builder_from_directory(version_dir).as_data_source(split)
    last = by_directory[len(by_directory) - 1]['dense']
    assert np.array_equal(last, rows.dense[-len(last) :])
  assert not os.path.exists(os.path.join(data_dir, 'downloads', manifest.DATASET, 'gen'))  # The work dir is gone.


def test_a_finished_dataset_is_reused_and_one_of_other_inputs_refused(criteo_days, prepared_criteo):
  data_dir, version_dir, _ = prepared_criteo
  splits = files.day_layout(criteo_days, heldout_days=1)
  assert builder.prepare_dataset(splits, data_dir, 'gen', CARDINALITIES, num_workers=0, **SMALL) == (version_dir, None)
  with pytest.raises(ValueError, match='other inputs or with other settings'):
    builder.prepare_dataset(files.day_layout(criteo_days[:2], heldout_days=1), data_dir, 'gen', CARDINALITIES, **SMALL)


def test_resuming_redoes_only_the_unfinished_parts(criteo_days, tmp_path):
  splits = files.day_layout(criteo_days, heldout_days=1)
  work = str(tmp_path / 'work')
  full = prepare.run(splits, work, CARDINALITIES, num_workers=0, print_fn=lambda _: None, **SMALL)
  parts_dir = os.path.join(work, 'parts')
  stamps = {name: os.stat(os.path.join(parts_dir, name)).st_mtime_ns for name in os.listdir(parts_dir)}
  lost = [p for p in full.parts if p['part'] == 1 and p['file']]  # An interruption: second parts are missing,
  for part in lost:
    os.remove(os.path.join(parts_dir, part['file']))
    os.remove(os.path.join(parts_dir, part['file'].replace('.array_record', '.json')))
  open(os.path.join(parts_dir, lost[0]['file'] + '.incomplete'), 'wb').close()  # and one was being written.
  resumed = prepare.run(splits, work, CARDINALITIES, num_workers=0, print_fn=lambda _: None, **SMALL)
  redone = [p for p in full.parts if p['unit'] in {q['unit'] for q in lost} and p['part'] >= 1]
  assert resumed.rows == sum(p['rows'] for p in redone) < 12_000
  assert [{**p, 'cpu_s': 0} for p in resumed.parts] == [{**p, 'cpu_s': 0} for p in full.parts]
  for name, stamp in stamps.items():
    if name.startswith(tuple(p['file'].removesuffix('.array_record') for p in full.parts if p['part'] == 0)):
      assert os.stat(os.path.join(parts_dir, name)).st_mtime_ns == stamp, f'{name} was written again'
  assert not [n for n in os.listdir(parts_dir) if n.endswith('.incomplete')]
  with pytest.raises(ValueError, match='other inputs or with other settings'):
    prepare.run(splits, work, CARDINALITIES, num_workers=0, block_rows=400, part_blocks=2, unit_bytes=200_000)


_KILLED_RUN = """
import sys
from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.prepared import prepare
if __name__ == '__main__':
  splits = files.day_layout(sys.argv[2].split(','), heldout_days=1)
  prepare.run(splits, sys.argv[1], [1000] * 20 + [7, 100_000, 3, 50, 2, 1], block_rows=50, part_blocks=1,
              unit_bytes=100_000, num_workers=2)
"""


def test_a_killed_preparation_leaves_no_process_and_resumes(criteo_days, tmp_path):
  work, script = str(tmp_path / 'work'), tmp_path / 'run.py'
  script.write_text(_KILLED_RUN)
  env = {**os.environ, 'PYTHONPATH': os.getcwd()}
  parent = subprocess.Popen(
    [sys.executable, str(script), work, ','.join(criteo_days)], env=env, stdout=subprocess.DEVNULL
  )
  parts_dir, deadline = os.path.join(work, 'parts'), time.monotonic() + 60
  while time.monotonic() < deadline and len([n for n in _listdir(parts_dir) if n.endswith('.json')]) < 5:
    time.sleep(0.05)
  children = psutil.Process(parent.pid).children(recursive=True)
  parent.send_signal(signal.SIGKILL)
  parent.wait()
  _, alive = psutil.wait_procs(children, timeout=10)
  assert not alive, f'workers outlived their parent: {alive}'
  done_before = len([n for n in os.listdir(parts_dir) if n.endswith('.json')])
  splits = files.day_layout(criteo_days, heldout_days=1)
  settings = dict(block_rows=50, part_blocks=1, unit_bytes=100_000)
  resumed = prepare.run(splits, work, CARDINALITIES, num_workers=0, print_fn=lambda _: None, **settings)
  assert 0 < resumed.rows < 12_000, f'{done_before} parts were finished before the kill'
  fresh = prepare.run(
    splits, str(tmp_path / 'fresh'), CARDINALITIES, num_workers=0, print_fn=lambda _: None, **settings
  )
  assert [p['tsv_sha256'] for p in resumed.parts] == [p['tsv_sha256'] for p in fresh.parts]
  assert [p['rows_per_record'] for p in resumed.parts] == [p['rows_per_record'] for p in fresh.parts]


def _listdir(path):
  return os.listdir(path) if os.path.isdir(path) else []


BAD_LINES = {  # kind: (line number in the file, 1-based, the line)
  'columns': (1503, '\t'.join(['1'] * 39)),
  'label': (2602, '\t'.join(['7'] + ['5'] * 13 + ['0000000a'] * 26)),
  'dense': (3001, '\t'.join(['0', '1e5'] + ['5'] * 12 + ['0000000a'] * 26)),
  'categorical': (3777, '\t'.join(['0'] + ['5'] * 13 + ['0000000a'] * 25 + ['xyz'])),
}


def _file_with_bad_lines(path, kinds, lines=4000, compress=False):
  text = [GOOD.replace('\t5\t', f'\t{i}\t', 1) for i in range(lines)]
  for kind in kinds:
    line, bad = BAD_LINES[kind]
    text[line - 1] = bad
  data = ('\n'.join(text) + '\n').encode()
  path.write_bytes(gzip.compress(data) if compress else data)
  return str(path)


@pytest.mark.parametrize('kind', sorted(BAD_LINES))
def test_a_malformed_line_stops_at_its_file_and_line(kind, tmp_path):
  path = _file_with_bad_lines(tmp_path / 'day_0', [kind])  # Past the first unit: its line is counted across units.
  with pytest.raises(parse.CriteoFormatError) as raised:
    prepare.run({'train': [files.Piece(path)]}, str(tmp_path / 'w'), CARDINALITIES, num_workers=0, **SMALL)
  assert (raised.value.path, raised.value.line, raised.value.kind) == (path, BAD_LINES[kind][0], kind)
  assert str(raised.value).startswith(f'{path}:{BAD_LINES[kind][0]}: ')


def test_a_worker_sends_the_error_with_its_file_and_line(tmp_path):
  path = _file_with_bad_lines(tmp_path / 'day_0.gz', ['dense'], compress=True)
  with pytest.raises(parse.CriteoFormatError, match=f'{path}:3001: dense feature I1 must be an integer'):
    prepare.run({'train': [files.Piece(path)]}, str(tmp_path / 'w'), CARDINALITIES, num_workers=2, **SMALL)
  assert not multiprocessing.active_children()  # The workers are stopped, not left behind.


def test_skipping_counts_each_kind_and_keeps_the_good_lines(tmp_path):
  plain = _file_with_bad_lines(tmp_path / 'day_0', sorted(BAD_LINES))
  packed = _file_with_bad_lines(tmp_path / 'day_1.gz', ['label', 'dense'], compress=True)
  splits = {'train': [files.Piece(plain), files.Piece(packed)]}
  data_dir = str(tmp_path / 'tfds')
  version_dir, _ = builder.prepare_dataset(splits, data_dir, 'bad', CARDINALITIES, skip_malformed=True, **SMALL)
  inputs = manifest.read(version_dir)['splits']['train']['inputs']
  assert inputs[0]['malformed'] == {kind: 1 for kind in BAD_LINES} and inputs[0]['lines'] == 4000
  assert inputs[0]['first_malformed'] == {kind: f'{plain}:{line}' for kind, (line, _) in BAD_LINES.items()}
  assert inputs[1]['malformed'] == {'columns': 0, 'label': 1, 'dense': 1, 'categorical': 0}
  assert inputs[1]['rows'] == 3998 and manifest.true_probability_file(manifest.read(version_dir), 'train') is None
  good = [line for line in open(plain).read().splitlines() if line.count('\t') == 39 and line[0] in '01']
  good = [line for line in good if '1e5' not in line and 'xyz' not in line]
  expected = parse.parse_rows(('\n'.join(good) + '\n').encode(), CARDINALITIES, 'x', 1)
  _assert_equal(prepared_source.PreparedSource(version_dir, 'train').read(0, len(good)), expected)
  assert 'skipped malformed lines' in builder.describe(version_dir, None)
  shutil.rmtree(data_dir)


def test_units_cut_plain_files_at_line_ends(criteo_days):
  plan = units.plan(files.day_layout(criteo_days, heldout_days=1), unit_bytes=100_000)
  plain = [u for u in plan if u.path == criteo_days[1]]
  assert len(plain) > 2 and plain[0].start == 0 and plain[-1].end == os.path.getsize(criteo_days[1])
  text = open(criteo_days[1], 'rb').read()
  assert all(text[u.start - 1 : u.start] == b'\n' for u in plain[1:])
  assert [u.end for u in plain[:-1]] == [u.start for u in plain[1:]]
  assert [u for u in plan if u.path == criteo_days[0]] == [
    units.Unit('train', 0, 0, criteo_days[0], 0, None, 1)
  ]  # gzip: whole.
  assert json.loads(json.dumps([u.key for u in plan])) == [u.key for u in plan]
