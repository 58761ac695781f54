"""A run's `data` section checked by the package that reads it: ValueError naming the key, or None.

  checks.check_source(config.data)   # the source, and the files or prepared dataset it names: there, of the right kind
  checks.check(resolved.data)        # the rest, once `data.lengths` has resolved the lengths of 0

`shadowsync_jax.config` calls both (`check_source` first: the lengths are counted from what it names) and words
their errors as its ConfigError.
"""

import os

import ml_collections

from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.criteo import files as criteo_files
from shadowsync_jax.data.prepared import manifest as prepared_manifest

SOURCES = ('synthetic', 'criteo', 'prepared')
MAX_TOTAL_ROWS = 2**31 - 1  # The tables are one concatenated table whose row ids are int32.


def check_source(data: ml_collections.ConfigDict) -> None:
  """The source, its readers, and the files or prepared dataset it reads: there, and of the right kind."""
  readers = data.readers
  if readers != 'auto' and not (isinstance(readers, int) and not isinstance(readers, bool) and readers >= 1):
    raise ValueError(f"data.readers={readers!r} must be 'auto' or an integer >= 1.")
  if data.reader_processes not in ('auto', True, False):
    raise ValueError(f"data.reader_processes={data.reader_processes!r} must be 'auto', True or False.")
  if data.generator not in ('auto', 'host', 'device'):
    raise ValueError(f"data.generator={data.generator!r} must be 'auto', 'host' or 'device'.")
  if data.generator == 'device' and data.source != 'synthetic':
    raise ValueError(
      f"data.generator='device' makes the synthetic stream; data.source={data.source!r} is read on "
      "the host (data.generator='auto' or 'host')."
    )
  if data.source not in SOURCES:
    raise ValueError(f'data.source={data.source!r} is not one of {", ".join(SOURCES)}.')
  if data.source == 'criteo':
    _check_criteo_files(data)
  if data.source == 'prepared':
    _check_prepared(data)


def _check_criteo_files(data: ml_collections.ConfigDict) -> None:
  if not data.train_path:
    raise ValueError(
      "data.train_path must name Criteo TSV file(s) when data.source='criteo' (--config.data.train_path=FILE)."
    )
  for key, value in (('data.train_path', data.train_path), ('data.eval_path', data.eval_path)):
    for path in criteo_files.split_paths(value):
      named = f'{key}={path!r}' if path == value else f'{key}={value!r}: {path!r}'
      if not os.path.isfile(path):
        raise ValueError(f'{named}: no such file (from {os.getcwd()}); give the path of a Criteo TSV file.')
      if criteo_files.is_gzip(path):
        raise ValueError(
          f'{named} is gzip-compressed and cannot be read at random; prepare it once '
          "(python -m experiments.prepare_criteo) and train with data.source='prepared'."
        )


def _check_prepared(data: ml_collections.ConfigDict) -> None:
  if not data.prepared_dir:
    raise ValueError(
      "data.prepared_dir must name a prepared dataset when data.source='prepared' "
      '(what python -m experiments.prepare_criteo wrote).'
    )
  try:
    version_dir = prepared_manifest.find(data.prepared_dir)
    manifest = prepared_manifest.read(version_dir)
  except (OSError, ValueError) as error:
    raise ValueError(f'data.prepared_dir={data.prepared_dir!r}: {error}') from error
  for key, split in (('data.train_split', data.train_split), ('data.eval_split', data.eval_split)):
    if (split or key == 'data.train_split') and split not in manifest['splits']:
      raise ValueError(f'{key}={split!r} is not a split of {version_dir}; it has {", ".join(manifest["splits"])}.')
  prepared_manifest.check_cardinalities(manifest, data.cardinalities, version_dir)


def check(data: ml_collections.ConfigDict) -> None:
  """The lengths (resolved: 0 is all of the data, `data.lengths`), the tables and the synthetic stream's shape."""
  for key, value in (
    ('data.num_train_examples', data.num_train_examples),
    ('data.num_eval_examples', data.num_eval_examples),
  ):
    if value < 0:
      raise ValueError(f'{key}={value} must be >= 0 (0 = all of the data).')
  if data.num_eval_examples == 0:  # Still 0 once resolved: the held-out data has no row.
    raise ValueError('data.num_eval_examples=0: the held-out file or split has no row to evaluate on.')
  cardinalities = list(data.cardinalities)
  if len(cardinalities) != NUM_SPARSE_FEATURES or any(int(c) < 1 for c in cardinalities):
    raise ValueError(f'data.cardinalities must be {NUM_SPARSE_FEATURES} positive table sizes, got {cardinalities}.')
  if sum(int(c) for c in cardinalities) > MAX_TOTAL_ROWS:
    raise ValueError(
      f'data.cardinalities hold {sum(int(c) for c in cardinalities):,} rows in all, more than the '
      f'{MAX_TOTAL_ROWS:,} that int32 row ids address in the concatenated table (Criteo Terabyte: 0.88 billion).'
    )
  if data.zipf_exponent < 0:
    raise ValueError(f'data.zipf_exponent={data.zipf_exponent} must be >= 0.')
  if data.drift < 0:
    raise ValueError(f'data.drift={data.drift} must be >= 0.')
