r"""Prepares Criteo TSV files once: a tensorflow-datasets dataset of parsed, hashed row blocks that training reads fast.

  python -m experiments.prepare_criteo --config=experiments/configs/criteo_kaggle.py --inputs=train.txt --days=7
  python -m experiments.prepare_criteo --config=experiments/configs/criteo_terabyte.py --inputs='day_*.gz'
      [--heldout_days=1] [--block_rows=8192] [--compression=uncompressed] [--workers=0] [--skip_malformed]

--inputs: plain or gzip TSV files, comma-separated, globs allowed (natural order: day_2 before day_10); several
files are one day each, one file with --days=N is cut into N days by row count (Kaggle's train.txt). The last
--heldout_days days are the split `heldout`, the others `train`. The ids are hashed into the config's
`data.cardinalities`, and the dataset goes where the config's `data.prepared_dir` says
(DATA_DIR/criteo_click_blocks/NAME), so the same --config (and overrides) trains on it:

  python -m experiments.train --config=experiments/configs/criteo_kaggle.py --workdir=/tmp/kaggle

It runs on every core, prints rows/s and the time left, and resumes where it stopped when run again. A malformed
line stops it with the file and line (exit status 1); --skip_malformed drops such lines and counts them by kind.
`tfds.data_source('criteo_click_blocks/NAME', split='train', data_dir=DATA_DIR)[i]` reads block i, no TensorFlow.
"""

import sys

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.criteo import parse
from shadowsync_jax.data.prepared import builder
from shadowsync_jax.data.prepared import manifest
from shadowsync_jax.data.prepared import prepare

_INPUTS = flags.DEFINE_string('inputs', None, 'Criteo TSV files (plain or .gz), comma-separated; globs allowed.')
_DAYS = flags.DEFINE_integer(
  'days', 0, 'Cut one plain file into this many days (Kaggle train.txt: 7); 0 = a file a day.'
)
_HELDOUT_DAYS = flags.DEFINE_integer('heldout_days', 1, 'The last days, held out as the split `heldout`.')
_BLOCK_ROWS = flags.DEFINE_integer('block_rows', prepare.DEFAULT_BLOCK_ROWS, 'Rows per record (a block).')
_COMPRESSION = flags.DEFINE_enum(
  'compression', prepare.DEFAULT_COMPRESSION, prepare.COMPRESSIONS, 'array_record compression of the blocks.'
)
_WORKERS = flags.DEFINE_integer('workers', 0, 'Worker processes; 0 = one per core.')
_SKIP_MALFORMED = flags.DEFINE_bool('skip_malformed', False, 'Drop malformed lines and count them, rather than stop.')
cli.define_config_flag('experiments/configs/criteo_kaggle.py')
flags.mark_flag_as_required('inputs')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:  # An unquoted glob: the shell gave the other files as arguments.
    cli.exit_with_usage_error(f"unexpected arguments {argv[1:3]}...; quote a glob in --inputs: --inputs='day_*.gz'.")
  data = FLAGS.config.data
  try:
    data_dir, name = manifest.location(data.prepared_dir)
    splits = files.day_layout(files.expand_inputs(_INPUTS.value), _DAYS.value, _HELDOUT_DAYS.value)
  except (OSError, ValueError) as error:
    cli.exit_with_usage_error(f'{error} (--inputs, --days, --heldout_days, --config.data.prepared_dir)')
  try:
    version_dir, result = builder.prepare_dataset(
      splits,
      data_dir,
      name,
      data.cardinalities,
      block_rows=_BLOCK_ROWS.value,
      compression=_COMPRESSION.value,
      skip_malformed=_SKIP_MALFORMED.value,
      num_workers=_WORKERS.value or None,
    )
  except ValueError as error:  # A malformed line, or a work or dataset directory of other inputs.
    hint = ' (--skip_malformed drops and counts such lines)' if isinstance(error, parse.CriteoFormatError) else ''
    print(f'{cli.ERROR_PREFIX}{error}{hint}', file=sys.stderr)
    sys.exit(1)
  print(builder.describe(version_dir, result))


if __name__ == '__main__':
  cli.run(main)
