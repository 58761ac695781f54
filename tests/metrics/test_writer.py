"""MetricWriter output read back without TensorBoard: TFRecord framing and CRCs checked by hand, then protos."""

import glob
import math
import os
import struct

import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from shadowsync_jax.metrics.writer import MetricWriter
from shadowsync_jax.metrics.writer import read_metrics_jsonl


def _crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: slow, obviously correct."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
  crc = _crc32c(data)
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _read_tfrecords(path: str) -> list[bytes]:
  """Each record: uint64 length, masked CRC of the length, data, masked CRC of the data (all little-endian)."""
  with open(path, 'rb') as f:
    content = f.read()
  records, offset = [], 0
  while offset < len(content):
    header = content[offset : offset + 8]
    (length,) = struct.unpack('<Q', header)
    (length_crc,) = struct.unpack('<I', content[offset + 8 : offset + 12])
    assert length_crc == _masked_crc(header), f'bad length CRC at byte {offset}'
    data = content[offset + 12 : offset + 12 + length]
    (data_crc,) = struct.unpack('<I', content[offset + 12 + length : offset + 16 + length])
    assert data_crc == _masked_crc(data), f'bad data CRC at byte {offset}'
    records.append(data)
    offset += 16 + length
  assert offset == len(content), 'trailing bytes after the last record'
  return records


def _read_events(logdir: str) -> list[event_pb2.Event]:
  paths = glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))
  assert len(paths) == 1, paths
  return [event_pb2.Event.FromString(record) for record in _read_tfrecords(paths[0])]


def _scalars_by_tag(events):
  scalars = {}
  for event in events:
    for value in event.summary.value:
      if value.HasField('simple_value'):
        scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars


def test_crc32c_reference_is_right():
  assert _crc32c(b'123456789') == 0xE3069283  # The standard CRC-32C check value.


def test_scalars_reach_the_event_file(tmp_path):
  logdir = str(tmp_path / 'workdir')
  with MetricWriter(logdir) as writer:
    writer.write_scalars(10, {'train/loss': 0.5, 'train/examples_per_sec': np.float32(1250.0)})
    writer.write_scalars(20, {'train/loss': np.array(0.25), 'eval/auc': 0.75})
  events = _read_events(logdir)
  assert events[0].file_version == 'brain.Event:2'
  assert _scalars_by_tag(events) == {
    'train/loss': [(10, 0.5), (20, 0.25)],
    'train/examples_per_sec': [(10, 1250.0)],
    'eval/auc': [(20, 0.75)],
  }


def test_float_values_keep_float32_precision_in_events(tmp_path):
  with MetricWriter(str(tmp_path)) as writer:
    writer.write_scalars(3, {'eval/ne': 0.8123456789})
  ((step, value),) = _scalars_by_tag(_read_events(str(tmp_path)))['eval/ne']
  assert step == 3
  assert value == pytest.approx(0.8123456789, rel=1e-7)


def test_texts_reach_the_event_file(tmp_path):
  with MetricWriter(str(tmp_path)) as writer:
    writer.write_texts(0, {'config': 'sync.algorithm: shadow_ea'})
  texts = [
    (event.step, value.tag, value.tensor.string_val[0].decode())
    for event in _read_events(str(tmp_path))
    for value in event.summary.value
    if value.HasField('tensor')
  ]
  assert len(texts) == 1
  step, tag, text = texts[0]
  assert step == 0 and tag.startswith('config') and text == 'sync.algorithm: shadow_ea'


def test_jsonl_has_one_row_per_call(tmp_path):
  logdir = str(tmp_path)
  with MetricWriter(logdir) as writer:
    writer.write_scalars(1, {'a': 1.5, 'b': 2})
    writer.write_scalars(2, {'a': float('nan')})
  rows = read_metrics_jsonl(os.path.join(logdir, 'metrics.jsonl'))
  assert rows[0] == {'step': 1, 'a': 1.5, 'b': 2.0}
  assert rows[1]['step'] == 2 and math.isnan(rows[1]['a'])
  assert read_metrics_jsonl(logdir)[0] == rows[0]  # The logdir works as well as the file.


def test_jsonl_is_readable_before_close(tmp_path):
  writer = MetricWriter(str(tmp_path))
  writer.write_scalars(5, {'train/loss': 0.3})
  assert read_metrics_jsonl(str(tmp_path)) == [{'step': 5, 'train/loss': 0.3}]
  writer.close()


def test_reopening_appends_to_jsonl(tmp_path):
  with MetricWriter(str(tmp_path)) as writer:
    writer.write_scalars(1, {'x': 1.0})
  with MetricWriter(str(tmp_path)) as writer:
    writer.write_scalars(2, {'x': 2.0})
  assert [row['step'] for row in read_metrics_jsonl(str(tmp_path))] == [1, 2]


def test_disabled_writer_writes_nothing(tmp_path):
  logdir = tmp_path / 'not_process_zero'
  with MetricWriter(str(logdir), enabled=False) as writer:
    writer.write_scalars(1, {'x': 1.0})
    writer.write_texts(1, {'t': 'text'})
    writer.flush()
  assert not logdir.exists()


def test_step_is_a_reserved_name(tmp_path):
  with MetricWriter(str(tmp_path)) as writer:
    with pytest.raises(ValueError, match='reserved'):
      writer.write_scalars(1, {'step': 3.0})
  assert read_metrics_jsonl(str(tmp_path)) == []


def test_close_twice_is_harmless(tmp_path):
  writer = MetricWriter(str(tmp_path))
  writer.write_scalars(1, {'x': 1.0})
  writer.close()
  writer.close()
  with pytest.raises(ValueError, match='closed'):
    writer.write_scalars(2, {'x': 2.0})
  assert len(read_metrics_jsonl(str(tmp_path))) == 1
