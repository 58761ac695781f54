"""The prepared Criteo dataset as a tensorflow-datasets builder, `criteo_click_blocks`: array_record, no TensorFlow.

  splits = files.day_layout(['day_0.gz', ..., 'day_23.gz'], heldout_days=1)
  version_dir, result = builder.prepare_dataset(splits, data_dir='/data/tfds', name='terabyte',
                                                cardinalities=config.data.cardinalities)
  ds = tfds.data_source('criteo_click_blocks/terabyte', split='train', data_dir='/data/tfds')
  ds[0]['sparse']       # int32 [8192, 26]: record 0 is block 0 (tfds finds the dataset without this module)

`prepare_dataset` runs TFDS's `download_and_prepare` on `CriteoClickBlocks`, whose `_download_and_prepare` runs
the parallel, resumable preparation (`prepare.run`) in a work directory of its own, `DATA_DIR/downloads/
criteo_click_blocks/NAME`, then hard-links the finished parts into TFDS's temporary directory under TFDS's shard
names and writes `criteo_manifest.json` (`manifest`) beside TFDS's metadata. TFDS deletes its temporary directory
when interrupted, so the slow work must live elsewhere; a rerun reuses every finished part, and the work directory
is deleted once TFDS has moved the dataset into place. TFDS's own route (`GeneratorBasedBuilder`) would not do:
one process, every example through its shuffler, and nothing kept after an interruption.

`true_probability-SPLIT.npy` is written beside the shards when every input of the split was generated with its
true probabilities (`criteo.generate`) and no line was dropped, so the Bayes NE floor holds on prepared data.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import os
import shutil
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.prepared import manifest as manifest_lib
from shadowsync_jax.data.prepared import prepare
from shadowsync_jax.data.prepared import records


@dataclasses.dataclass(eq=False, repr=False)
class CriteoBlocksConfig(tfds.core.BuilderConfig):
  """What a prepared dataset is made of; its `name` is the TFDS config name ('kaggle', 'terabyte', ...)."""

  pieces: tuple = ()  # ((split, ((path, start, end, first_line), ...)), ...): `files.Piece`s by split.
  cardinalities: tuple = ()
  block_rows: int = prepare.DEFAULT_BLOCK_ROWS
  compression: str = prepare.DEFAULT_COMPRESSION
  part_blocks: int = prepare.DEFAULT_PART_BLOCKS
  unit_bytes: int = prepare.DEFAULT_UNIT_BYTES

  def __repr__(self) -> str:  # TFDS logs the config; the pieces would fill the screen.
    return f'CriteoBlocksConfig(name={self.name!r}, block_rows={self.block_rows}, compression={self.compression!r})'

  def splits(self) -> dict[str, list[files.Piece]]:
    return {split: [files.Piece(*piece) for piece in pieces] for split, pieces in self.pieces}


class CriteoClickBlocks(tfds.core.DatasetBuilder):
  """Criteo click logs (Kaggle, Terabyte, or any TSV of their layout), parsed and hashed, in blocks of rows."""

  VERSION = tfds.core.Version('1.0.0')

  def __init__(
    self,
    *,
    skip_malformed: bool = False,
    num_workers: int | None = None,
    print_fn: Callable[[str], None] = print,
    **kwargs: Any,
  ):
    self.skip_malformed, self.num_workers, self.print_fn = skip_malformed, num_workers, print_fn
    self.run_result: prepare.Result | None = None
    super().__init__(**kwargs)

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> None:
    """None: TFDS looks beside the code for the checksums of downloads (this builder downloads nothing), and its
    lookup for a builder inside a package needs `importlib_resources`, which Python 3.11 does not."""
    return None

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=(
        'Criteo click logs in blocks of rows: label uint8 [n], dense float32 [n, 13] = log(1 + max(I, 0)), '
        'sparse int32 [n, 26] = int(C, 16) % table size. Rows per record and the provenance are in '
        f'{manifest_lib.FILENAME}.'
      ),
      features=records.FEATURES,
      homepage='https://ailab.criteo.com/ressources/',
      disable_shuffling=True,  # One pass in time order.
    )

  def work_dir(self) -> str:
    return os.path.join(os.fspath(self.data_dir_root), 'downloads', manifest_lib.DATASET, self.builder_config.name)

  def _download_and_prepare(self, dl_manager, download_config=None) -> None:
    del dl_manager, download_config
    config = self.builder_config
    splits = config.splits()
    self.run_result = prepare.run(
      splits,
      self.work_dir(),
      config.cardinalities,
      block_rows=config.block_rows,
      compression=config.compression,
      skip_malformed=self.skip_malformed,
      num_workers=self.num_workers,
      part_blocks=config.part_blocks,
      unit_bytes=config.unit_bytes,
      print_fn=self.print_fn,
    )
    version_dir = os.fspath(self.data_path)  # TFDS's temporary directory while this runs.
    split_infos, shard_names = _link_shards(self.run_result.parts, splits, self.work_dir(), version_dir, self.name)
    true_probability = {
      split: _write_true_probability(version_dir, split, self.run_result.parts, pieces)
      for split, pieces in splits.items()
    }
    manifest_lib.write(
      version_dir,
      manifest_lib.build(
        splits,
        self.run_result.parts,
        shard_names,
        config.cardinalities,
        config.block_rows,
        prepare.writer_options(config.compression),
        true_probability,
      ),
    )
    self.info.set_splits(tfds.core.SplitDict(split_infos))

  def _as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
    raise NotImplementedError(
      'array_record datasets are read with tfds.data_source(...) or builder.as_data_source(split) (no TensorFlow).'
    )


def prepare_dataset(
  splits: Mapping[str, Sequence[files.Piece]],
  data_dir: str,
  name: str,
  cardinalities: Sequence[int],
  block_rows: int = prepare.DEFAULT_BLOCK_ROWS,
  compression: str = prepare.DEFAULT_COMPRESSION,
  skip_malformed: bool = False,
  num_workers: int | None = None,
  part_blocks: int = prepare.DEFAULT_PART_BLOCKS,
  unit_bytes: int = prepare.DEFAULT_UNIT_BYTES,
  print_fn: Callable[[str], None] = print,
) -> tuple[str, prepare.Result | None]:
  """(the dataset's directory, this run's work or None when it was prepared already) of `criteo_click_blocks/NAME`
  under `data_dir`, prepared now if need be. A finished dataset of the same name from other inputs or settings is
  refused, not overwritten."""
  config = CriteoBlocksConfig(
    name=name,
    description=f'Criteo TSV prepared by shadowsync_jax into {block_rows}-row blocks.',
    pieces=tuple((split, tuple(dataclasses.astuple(p) for p in pieces)) for split, pieces in splits.items()),
    cardinalities=tuple(int(c) for c in cardinalities),
    block_rows=block_rows,
    compression=compression,
    part_blocks=part_blocks,
    unit_bytes=unit_bytes,
  )
  builder = CriteoClickBlocks(
    data_dir=data_dir, config=config, skip_malformed=skip_malformed, num_workers=num_workers, print_fn=print_fn
  )
  version_dir = os.fspath(builder.data_path)
  if os.path.exists(os.path.join(version_dir, manifest_lib.FILENAME)):
    _check_same(manifest_lib.read(version_dir), config, version_dir)
    print_fn(f'{version_dir} holds this dataset already; nothing to do.')
    return version_dir, None
  for stale in builder.data_path.parent.glob('incomplete.*'):  # Left by a run killed while TFDS moved files.
    shutil.rmtree(stale)
  builder.download_and_prepare(file_format='array_record')
  shutil.rmtree(builder.work_dir())  # Its parts now live on as the shards (hard links).
  return version_dir, builder.run_result


def describe(version_dir: str, result: prepare.Result | None) -> str:
  """What a preparation made, as lines for a person: splits, malformed lines, speed, how to read it."""
  info = manifest_lib.read(version_dir)
  lines = [f'prepared {version_dir}']
  for split, entry in info['splits'].items():
    records = sum(len(shard['rows_per_record']) for shard in entry['shards'])
    lines.append(
      f'  {split}: {entry["rows"]:,} rows in {records:,} blocks of up to {info["block_rows"]:,}, '
      f'{len(entry["shards"])} shards, from {len(entry["inputs"])} input(s)'
    )
    for source in entry['inputs']:
      if any(source['malformed'].values()):
        counts = ', '.join(
          f'{kind} {count:,} (first {source["first_malformed"][kind]})'
          for kind, count in source['malformed'].items()
          if count
        )
        lines.append(f'    skipped malformed lines of {source["path"]}: {counts}')
  if result is not None and result.rows:
    lines.append(
      f'  this run: {result.rows:,} rows in {result.wall_s:.1f} s, {result.rows / result.wall_s:,.0f} rows/s; '
      f'{result.rows / max(result.cpu_s, 1e-9):,.0f} rows per CPU-second of a worker'
    )
  data_dir, name = manifest_lib.location(os.path.dirname(version_dir))
  lines.append(f"  read: tfds.data_source('{manifest_lib.DATASET}/{name}', split='train', data_dir='{data_dir}')")
  lines.append(f"  train: --config.data.source=prepared --config.data.prepared_dir='{os.path.dirname(version_dir)}'")
  return '\n'.join(lines)


def _link_shards(parts, splits, work_dir: str, version_dir: str, name: str):
  """Hard-links the parts that hold records to TFDS shard names; returns (SplitInfos, {split: shard names})."""
  split_infos, shard_names = [], {}
  for split in splits:
    stored = [p for p in parts if p['split'] == split and p['file'] is not None]
    template = tfds.core.ShardedFileTemplate(
      data_dir=version_dir, dataset_name=name, split=split, filetype_suffix='array_record'
    )
    paths = template.sharded_filepaths(len(stored)) if stored else []
    for part, path in zip(stored, paths):
      if os.path.exists(path):
        os.remove(path)
      os.link(os.path.join(work_dir, 'parts', part['file']), path)
    shard_names[split] = [os.path.basename(os.fspath(path)) for path in paths]
    split_infos.append(
      tfds.core.SplitInfo(
        name=split,
        shard_lengths=[len(p['rows_per_record']) for p in stored],
        num_bytes=sum(os.path.getsize(path) for path in paths),
        filename_template=template,
      )
    )
  return split_infos, shard_names


def _write_true_probability(version_dir: str, split: str, parts, pieces: Sequence[files.Piece]) -> str | None:
  """Copies the generator's probabilities of the split's lines into the dataset; None when there are none."""
  mine = [p for p in parts if p['split'] == split]
  sidecars = [files.true_probability_path(piece.path) for piece in pieces]
  if any(p['malformed'][kind] for p in mine for kind in p['malformed']) or not all(map(os.path.exists, sidecars)):
    return None
  lines = [sum(p['end_line'] - p['start_line'] for p in mine if p['piece'] == i) for i in range(len(pieces))]
  name = f'true_probability-{split}.npy'
  out = np.lib.format.open_memmap(os.path.join(version_dir, name), 'w+', np.float32, (sum(lines),))
  position = 0
  for piece, sidecar, count in zip(pieces, sidecars, lines):
    out[position : position + count] = np.load(sidecar, mmap_mode='r')[
      piece.first_line - 1 : piece.first_line - 1 + count
    ]
    position += count
  out.flush()
  return name


def _check_same(existing: dict[str, Any], config: CriteoBlocksConfig, version_dir: str) -> None:
  wanted = {split: [p.path for p in pieces] for split, pieces in config.splits().items()}
  found = {split: [entry['path'] for entry in info['inputs']] for split, info in existing['splits'].items()}
  settings = (list(config.cardinalities), config.block_rows, prepare.writer_options(config.compression))
  if found != wanted or settings != (existing['cardinalities'], existing['block_rows'], existing['writer_options']):
    raise ValueError(
      f'{version_dir} holds a dataset of this name prepared from other inputs or with other settings; give another '
      'name, or delete it to prepare it again.'
    )
