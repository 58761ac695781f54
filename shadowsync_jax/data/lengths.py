"""How long the training stream and the held-out set are; 0 in the config means all of the data.

  lengths = lengths_lib.resolve(config.data)     # StreamLengths(num_train, num_eval, eval_offset)
  lengths_lib.split_lengths(train_rows=[100, 100, 100], eval_rows=None, num_train=0, num_eval=0)
  # StreamLengths(num_train=200, num_eval=100, eval_offset=200): the last of three days held out

`data.num_train_examples = 0` and `data.num_eval_examples = 0` (the defaults) mean:
  - synthetic: 2,000,000 and 200,000 (the stream is endless; the default problem's size), eval after training;
  - criteo (TSV files) and prepared (a prepared split): every row of the training files or split, and the whole
    held-out file(s) (`data.eval_path`) or split (`data.eval_split`). Without a held-out file or split, the last day
    of the training data is held out and training stops before it: the last of several files (the last input of a
    prepared split), or the last seventh of a single file (Kaggle's train.txt: the DLRM reference holds out its 7th
    day, `files.day_sizes`).
An explicit value is honoured: N training rows from the start; M held-out rows from the start of the held-out file or
split, or, without one, the M rows that follow the training stream. Errors name the config key.
"""

from collections.abc import Sequence
from typing import NamedTuple

import ml_collections

from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.prepared import manifest as manifest_lib

SYNTHETIC_TRAIN_EXAMPLES = 2_000_000
SYNTHETIC_EVAL_EXAMPLES = 200_000
KAGGLE_DAYS = 7  # One file without a held-out file is cut into this many days, the last held out.


class StreamLengths(NamedTuple):
  num_train: int
  num_eval: int
  eval_offset: int | None  # Where the held-out rows start in the training data; None: in a held-out file or split.


def split_lengths(
  train_rows: Sequence[int],
  eval_rows: int | None,
  num_train: int,
  num_eval: int,
  train_name: str = 'the training data',
  eval_name: str = 'the held-out data',
) -> StreamLengths:
  """The lengths for training data of `train_rows` rows per file or day and `eval_rows` held-out rows (None: no
  held-out file or split); `num_train`/`num_eval` as configured (0 = all). The names go into error messages."""
  train_rows = [int(rows) for rows in train_rows]
  total = sum(train_rows)
  if eval_rows is not None:
    num_train, num_eval = num_train or total, num_eval or eval_rows
    if num_train > total:
      raise ValueError(f'data.num_train_examples={num_train} exceeds the {total} rows of {train_name}.')
    if num_eval > eval_rows:
      raise ValueError(f'data.num_eval_examples={num_eval} exceeds the {eval_rows} rows of {eval_name}.')
    return StreamLengths(num_train, num_eval, None)
  if num_eval:
    offset = num_train or total - num_eval
    if offset + num_eval > total or offset <= 0:
      raise ValueError(
        f'data.num_train_examples + data.num_eval_examples (no held-out file: eval follows training) = '
        f'{offset + num_eval} exceeds the {total} rows of {train_name}.'
      )
    return StreamLengths(offset, num_eval, offset)
  last_day = train_rows[-1] if len(train_rows) > 1 else files.day_sizes(total, KAGGLE_DAYS)[-1]
  offset = total - last_day
  if num_train > offset or offset <= 0:
    raise ValueError(
      f'data.num_train_examples={num_train} reaches into the held-out last day of {train_name} (rows {offset} '
      f'to {total}); train on fewer rows, or set data.num_eval_examples to hold out the rows after training.'
    )
  return StreamLengths(num_train or offset, last_day, offset)


def resolve(data_config: ml_collections.ConfigDict) -> StreamLengths:
  """The lengths the `data` config section asks for, the files or the prepared dataset read for their row counts
  only when a length is 0."""
  num_train, num_eval = data_config.num_train_examples, data_config.num_eval_examples
  if data_config.source == 'synthetic':
    num_train = num_train or SYNTHETIC_TRAIN_EXAMPLES
    return StreamLengths(num_train, num_eval or SYNTHETIC_EVAL_EXAMPLES, num_train)
  if data_config.source == 'criteo':
    eval_paths = files.split_paths(data_config.eval_path)
    if num_train and num_eval:  # Nothing to count (make_sources checks that the files hold that many rows).
      return StreamLengths(num_train, num_eval, None if eval_paths else num_train)
    return split_lengths(
      [files.count_rows(path) for path in files.split_paths(data_config.train_path)],
      sum(files.count_rows(path) for path in eval_paths) if eval_paths else None,
      num_train,
      num_eval,
      f'data.train_path={data_config.train_path!r}',
      f'data.eval_path={data_config.eval_path!r}',
    )
  if data_config.source == 'prepared':
    train_split, eval_split = data_config.train_split, data_config.eval_split
    if num_train and num_eval:
      return StreamLengths(num_train, num_eval, None if eval_split else num_train)
    version_dir = manifest_lib.find(data_config.prepared_dir)
    manifest = manifest_lib.read(version_dir)
    return split_lengths(
      manifest_lib.input_rows(manifest, train_split),
      manifest_lib.split_rows(manifest, eval_split) if eval_split else None,
      num_train,
      num_eval,
      f'data.train_split={train_split!r} of {version_dir}',
      f'data.eval_split={eval_split!r} of {version_dir}',
    )
  raise ValueError(f"data.source={data_config.source!r} must be 'synthetic', 'criteo' or 'prepared'.")
