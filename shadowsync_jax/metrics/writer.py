"""Metrics over time: TensorBoard event files plus a JSON-lines copy that a notebook reads without TensorBoard.

  with MetricWriter(workdir, enabled=jax.process_index() == 0) as writer:
    for step in ...:
      writer.write_scalars(step, {'train/loss': loss, 'train/examples_per_sec': eps})
    writer.write_texts(step, {'config': config.to_json_best_effort()})

  tensorboard --logdir=WORKDIR                         # curves
  rows = read_metrics_jsonl(f'{workdir}/metrics.jsonl')  # [{'step': 100, 'train/loss': 0.47, ...}, ...]
  write_summary(workdir, summary)                       # workdir/summary.json, the run's end (docs/design.md §9)

Event files go through tensorboardX (clu's writers need TensorFlow). Only one process of a multi-process job
should write: the others pass `enabled=False`, which turns every method into a no-op and creates no file.
"""

from collections.abc import Mapping
import json
import os
import pathlib
from typing import Any

import numpy as np
import tensorboardX

JSONL_FILENAME = 'metrics.jsonl'


class MetricWriter:
  """Writes scalars (and optionally texts) to `logdir` as TensorBoard events and as `logdir/metrics.jsonl`.

  The JSON-lines file is opened in append mode, so a run resumed from a checkpoint extends its history.
  """

  def __init__(self, logdir: str, enabled: bool = True, flush_secs: int = 30):
    self._enabled = enabled
    self._summary_writer = None
    self._jsonl_file = None
    self._closed = False
    if not enabled:
      return
    os.makedirs(logdir, exist_ok=True)
    self._summary_writer = tensorboardX.SummaryWriter(logdir, flush_secs=flush_secs)
    self._jsonl_file = open(os.path.join(logdir, JSONL_FILENAME), 'a', buffering=1, encoding='utf-8')

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes one value per name at `step`; values are anything `float()` accepts (including 0-d arrays)."""
    if not self._is_open():
      return
    step = int(step)
    values = {name: float(np.asarray(value)) for name, value in scalars.items()}
    if 'step' in values:
      raise ValueError("'step' is reserved for the step column of metrics.jsonl; rename the metric.")
    for name, value in values.items():
      self._summary_writer.add_scalar(name, value, global_step=step)
    self._jsonl_file.write(json.dumps({'step': step, **values}) + '\n')

  def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
    """Writes text (shown in TensorBoard's Text tab), such as the resolved config; not copied to the JSONL."""
    if not self._is_open():
      return
    for name, text in texts.items():
      self._summary_writer.add_text(name, text, global_step=int(step))

  def flush(self) -> None:
    if not self._is_open():
      return
    self._summary_writer.flush()
    self._jsonl_file.flush()

  def close(self) -> None:
    """Flushes and closes both files; calling it again does nothing."""
    if not self._enabled or self._closed:
      return
    self._summary_writer.close()
    self._jsonl_file.close()
    self._closed = True

  def _is_open(self) -> bool:
    """False when disabled (callers no-op); raises when used after `close`, which would lose data silently."""
    if self._closed:
      raise ValueError('MetricWriter is closed.')
    return self._enabled

  def __enter__(self) -> 'MetricWriter':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def read_metrics_jsonl(path: str) -> list[dict[str, Any]]:
  """Reads the rows a `MetricWriter` wrote, in order; `path` is the file or the logdir that holds it.

  Non-finite values come back as float NaN/inf (Python's json writes and reads them as `NaN`, `Infinity`).
  """
  if os.path.isdir(path):
    path = os.path.join(path, JSONL_FILENAME)
  with open(path, encoding='utf-8') as jsonl_file:
    return [json.loads(line) for line in jsonl_file if line.strip()]


def write_summary(workdir: str | pathlib.Path, summary: Mapping[str, Any]) -> None:
  """Writes `summary` as `workdir/summary.json` (numpy scalars as numbers)."""
  (pathlib.Path(workdir) / 'summary.json').write_text(json.dumps(summary, indent=2, default=jsonable) + '\n')


def jsonable(value: Any) -> Any:
  """`json.dumps`'s `default` for what configs and summaries hold besides plain JSON types."""
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f'not JSON serializable: {type(value)}')
