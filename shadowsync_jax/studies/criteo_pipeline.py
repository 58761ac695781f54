"""Criteo at its real size, measured: preparing rows/s per core, reading examples/s per process through the training
input pipeline, and the trainer's own examples/sec beside them.

  days = criteo_pipeline.generated_days(config, root, rows=4_000_000)        # 7 gzip days, written once
  prepared = criteo_pipeline.measure_preparing(days, config, root, 'uncompressed')
  reading = criteo_pipeline.measure_reading(prepared['version_dir'], num_processes=2, replicas_per_process=1,
                                            batch_size=256)     # one dict per process, read at the same time
  training = criteo_pipeline.measure_training(config, prepared['prepared_dir'], workdir, train_examples=1_000_000)
  job = criteo_pipeline.measure_training_job(config_file, prepared['prepared_dir'], workdir, 1_000_000, 2)

Preparing is timed by the preparation itself: rows per CPU-second of a worker (its parse, hash, encode and write; a
core's rate whatever else runs on the machine), and rows/s of the whole run. Reading runs `input_pipeline.
train_batches` over the prepared training split as a job's processes do, each its own replicas' rows, all processes
at once in spawned processes; each reads the split twice and the second pass is timed (the first warms the page
cache and the allocator). The trainer is `train.train_and_evaluate` on the same prepared data, in one process and
in a job of two (one replica each), so that reading is compared with training in the same layout.
"""

from collections.abc import Sequence
import os
import pathlib
import re
import shutil
import time
from typing import Any

import ml_collections

from shadowsync_jax import config as config_lib
from shadowsync_jax import train
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.data import synthetic
from shadowsync_jax.data import workers
from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.criteo import generate
from shadowsync_jax.data.prepared import builder
from shadowsync_jax.data.prepared import manifest
from shadowsync_jax.data.prepared import source as prepared_source
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import result_files

DAYS = 7  # Kaggle's layout: days 1-6 train, day 7 held out.
PREPARE_TARGET = 100_000  # rows/s per core (issue 20).
READ_TARGET = 1_000_000  # examples/s per process, and at least READ_OVER_TRAIN times one replica's pace.
READ_OVER_TRAIN = 20
# (processes, replicas per process, batch size or 0 for the config's): the config's own layout in one and two
# processes, and the reference batch of 1024 on 8 replicas in two.
LAYOUTS = ((1, 1, 0), (2, 1, 0), (2, 4, 1024))


def run(
  config: ml_collections.ConfigDict,
  config_file: str,
  root: str | pathlib.Path,
  rows: int,
  compressions: Sequence[str],
  train_examples: int,
) -> tuple[str, dict[str, Any]]:
  """Generates (once), prepares with each compression, reads in every layout, trains in one and two processes;
  returns (table, raw). `config_file` (FILE[:variant]) is `config`'s, for the two-process job's command line."""
  days = generated_days(config, root, rows)
  raw = {'load_average_before': os.getloadavg()[0], 'cores': os.cpu_count(), 'preparing': [], 'reading': []}
  for compression in compressions:
    prepared = measure_preparing(days, config, root, compression)
    raw['preparing'].append(prepared)
    for processes, local, batch_size in LAYOUTS:
      per_process = measure_reading(prepared['version_dir'], processes, local, batch_size or config.batch_size)
      raw['reading'].append({'compression': compression, 'processes': per_process})
  prepared_dir = raw['preparing'][0]['prepared_dir']
  raw['training'] = [
    _without_config(measure_training(config, prepared_dir, _fresh(root, 'train_1'), train_examples)),
    measure_training_job(config_file, prepared_dir, _fresh(root, 'train_2'), train_examples, num_processes=2),
  ]
  raw['load_average_after'] = os.getloadavg()[0]
  return table(raw, config), raw


def table(raw: dict[str, Any], config: ml_collections.ConfigDict) -> str:
  """The study's markdown table: every figure beside its target."""
  lines = ['| stage | setting | measured | target | met |', '|---|---|---|---|---|']
  for prepared in raw['preparing']:
    per_core = prepared['rows_per_cpu_s']
    lines.append(
      f'| preparing, {prepared["compression"]} | {prepared["rows"]:,} rows in {DAYS} gzip days, '
      f'{prepared["workers"]} workers | {per_core:,.0f} rows/s per core ({prepared["rows_per_s"]:,.0f} rows/s in all, '
      f'{prepared["bytes_per_row"]:.0f} B/row) | {PREPARE_TARGET:,} rows/s per core | '
      f'{_met(per_core >= PREPARE_TARGET)} |'
    )
  slowest_reads = {}
  for reading in raw['reading']:
    slowest = min(reading['processes'], key=lambda p: p['examples_per_s'])
    processes, local = slowest['num_processes'], slowest['replicas_per_process']
    slowest_reads[reading['compression'], processes, local, slowest['batch_size']] = slowest['examples_per_s']
    lines.append(
      f'| reading, {reading["compression"]} | {_layout(processes, local, slowest["batch_size"])} | '
      f'{slowest["examples_per_s"]:,.0f} examples/s{" per process (the slower)" if processes > 1 else ""} '
      f'({slowest["examples_per_cpu_s"]:,.0f} per CPU-second) | {READ_TARGET:,} per process | '
      f'{_met(slowest["examples_per_s"] >= READ_TARGET)} |'
    )
  default = raw['preparing'][0]['compression']  # The first compression is the one the trainer read.
  for summary in raw['training']:
    processes, local = summary['num_processes'], summary['num_replicas'] // summary['num_processes']
    pace = max(summary['examples_per_sec_per_process']) / local  # The faster replica: the stricter ratio.
    ratio = slowest_reads[default, processes, local, config.batch_size] / pace
    lines.append(
      f'| training | {_layout(processes, local, config.batch_size)}, {summary["train_examples"]:,} examples | '
      f'{pace:,.0f} examples/s a replica{" (the faster)" if processes > 1 else ""} (eval NE '
      f'{summary["eval_ne"]:.4f}, floor {summary["bayes_ne"]:.4f}) | reading ({default}, same layout) '
      f'{READ_OVER_TRAIN}x this | {ratio:.0f}x: {_met(ratio >= READ_OVER_TRAIN)} |'
    )
  return '\n'.join(lines)


def _layout(processes: int, local: int, batch_size: int) -> str:
  return (
    f'{processes} process{"es" if processes > 1 else ""} x {local} replica{"s" if local > 1 else ""} x {batch_size}'
  )


def _fresh(root: str | pathlib.Path, name: str) -> pathlib.Path:
  workdir = pathlib.Path(root) / name
  shutil.rmtree(workdir, ignore_errors=True)  # A finished run there would be resumed at its end, untimed.
  return workdir


def _without_config(summary: dict[str, Any]) -> dict[str, Any]:
  return {key: value for key, value in summary.items() if key != 'config'}


def _met(ok: bool) -> str:
  return 'yes' if ok else '**no**'


def generated_days(config: ml_collections.ConfigDict, root: str | pathlib.Path, rows: int) -> list[str]:
  """Kaggle-like gzip day files of `rows` rows from the config's synthetic teacher, under root/days_ROWS (reused
  when they are there already)."""
  directory = pathlib.Path(root) / f'days_{rows}'
  paths = [str(directory / f'day_{day}.gz') for day in range(DAYS)]
  if not all(os.path.exists(path) for path in paths):
    data = config.data
    spec = synthetic.SyntheticSpec(
      seed=config.seed, cardinalities=tuple(data.cardinalities), zipf_exponent=data.zipf_exponent, drift=data.drift
    )
    generate.write_days(str(directory), rows, DAYS, spec, gzip=True)
  return paths


def measure_preparing(
  days: Sequence[str], config: ml_collections.ConfigDict, root: str | pathlib.Path, compression: str
) -> dict[str, Any]:
  """Prepares `days` afresh with the default settings but `compression`; its figures and where the data went."""
  name = f'bench_{compression.replace(":", "")}'
  prepared_dir = os.path.join(str(root), 'tfds', manifest.DATASET, name)
  if os.path.exists(prepared_dir):  # Measure a whole preparation, not a reuse.
    shutil.rmtree(prepared_dir)
  num_workers = os.cpu_count()
  version_dir, result = builder.prepare_dataset(
    files.day_layout(list(days), heldout_days=1),
    os.path.join(str(root), 'tfds'),
    name,
    config.data.cardinalities,
    compression=compression,
    num_workers=num_workers,
  )
  shard_bytes = sum(f.stat().st_size for f in pathlib.Path(version_dir).glob('*.array_record-*'))
  return {
    'compression': compression,
    'prepared_dir': prepared_dir,
    'version_dir': version_dir,
    'rows': result.rows,
    'workers': num_workers,
    'wall_s': result.wall_s,
    'rows_per_s': result.rows / result.wall_s,
    'rows_per_cpu_s': result.rows / result.cpu_s,
    'bytes_per_row': shard_bytes / result.rows,
  }


def measure_reading(
  version_dir: str, num_processes: int, replicas_per_process: int, batch_size: int, passes: int = 2
) -> list[dict[str, Any]]:
  """Every process of a job of `num_processes` reading its replicas' rows of the training split, all at once."""
  tasks = [(version_dir, num_processes, replicas_per_process, batch_size, p, passes) for p in range(num_processes)]
  results = dict(workers.run(_read_as_process, tasks, num_workers=num_processes))
  return [results[p] for p in range(num_processes)]


def _read_as_process(task: tuple, state: None, report) -> dict[str, Any]:
  del state, report
  version_dir, num_processes, local, batch_size, process, passes = task
  source = prepared_source.PreparedSource(version_dir, 'train')
  stream = input_pipeline.StreamSlice(source, 0, len(source))
  replicas = range(process * local, (process + 1) * local)
  for _ in range(passes):
    source.blocks_decoded = 0
    start_wall, start_cpu, examples = time.perf_counter(), time.process_time(), 0
    for batch in input_pipeline.train_batches(
      stream, num_processes * local, batch_size, len(source), replicas=replicas
    ):
      examples += batch.label.size
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
  return {
    'process': process,
    'num_processes': num_processes,
    'replicas_per_process': local,
    'batch_size': batch_size,
    'examples': examples,
    'examples_per_s': examples / wall,
    'examples_per_cpu_s': examples / cpu,
    'blocks_decoded': source.blocks_decoded,
  }


def measure_training_job(
  config_file: str, prepared_dir: str, workdir: pathlib.Path, train_examples: int, num_processes: int
) -> dict[str, Any]:
  """The same in a job of `num_processes` processes of one replica each, started as a user starts it
  (`experiments.launch`, through `studies.jobs`); its summary.json, less the config."""
  train_flags = [
    f'--config={config_file}',
    f'--config.data.prepared_dir={prepared_dir}',
    f'--config.data.num_train_examples={train_examples}',
    f'--config.num_replicas={num_processes}',
    '--config.train.checkpoint_every_steps=0',
    '--config.train.checkpoint_every_s=0',
    '--config.train.progress_every_s=30',
  ]
  launch_flags = [f'--num_processes={num_processes}', '--cpu_devices=1', '--peer_timeout_s=60', '--grace_s=30']
  job = jobs.launch(workdir, launch_flags, train_flags)
  if job.summary is None:
    raise RuntimeError(f'the {num_processes}-process training job refused its config: {job.error}')
  return _without_config(job.summary)


def measure_training(
  config: ml_collections.ConfigDict, prepared_dir: str, workdir: str | pathlib.Path, train_examples: int
) -> dict[str, Any]:
  """The trainer's own examples/sec on the prepared data (the first `train_examples` rows of the training split)."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.data.source, config.data.prepared_dir = 'prepared', prepared_dir
  config.data.num_train_examples = train_examples
  config.train.checkpoint_every_steps = 0
  config.train.checkpoint_every_s = 0.0
  config_lib.validate(config, num_devices=None)
  return train.train_and_evaluate(config, workdir)


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): preparing's pace a core, and reading's with two processes
  against a replica's training pace."""
  text = (result_files.REPO_ROOT / path).read_text()
  prepare = re.search(r'preparing, uncompressed \| [^|]+\| ([\d,]+) rows/s per core', text).group(1)
  read = re.search(r'2 processes x 1 replica x 256 \| ([\d,]+) examples/s per process', text).group(1)
  train_pace = re.search(r'2 processes x 1 replica x 256, [\d,]+ examples \|[^|]+\|[^|]+\| (\d+)x', text).group(1)
  return (
    f'prepares {prepare} rows/s per core; reads {read} examples/s per process with two processes (one replica '
    f"each), {train_pace}x a replica's training pace"
  )
