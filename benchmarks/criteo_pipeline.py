r"""Criteo at its real size on this machine: preparing rows/s per core, reading examples/s per process through the
training input pipeline (1 and 2 processes), and the trainer's examples/sec in the same layouts, beside the targets.

  python -m benchmarks.criteo_pipeline [--rows=4000000] [--root=/tmp/criteo_pipeline] \
      [--compressions=uncompressed,zstd:1] [--train_examples=1000000] [--out=benchmarks/results/criteo_pipeline.md]

Generates `--rows` rows of Kaggle-like day files (7 gzip days, once; the config's synthetic teacher), prepares them
with the default settings (all cores, 8192-row blocks) once per compression, the first being the default, reads the
training split in the layouts of `criteo_pipeline.LAYOUTS`, and trains the config on the first `--train_examples`
rows, in one process and in a job of two. Targets (issue 20): preparing >= 100k rows/s per core; reading >= 1M
examples/s per process, >= 20x what one training replica of the same layout consumes. The table goes to --out and
docs/studies/criteo.md.
"""

from absl import flags
from absl import logging
from ml_collections import config_flags

from shadowsync_jax import cli
from shadowsync_jax.studies import criteo_pipeline
from shadowsync_jax.studies import report

_ROWS = flags.DEFINE_integer('rows', 4_000_000, 'Rows of generated Criteo, in 7 day files.')
_ROOT = flags.DEFINE_string('root', '/tmp/criteo_pipeline', 'Where the day files, datasets and the run go.')
_COMPRESSIONS = flags.DEFINE_list('compressions', ['uncompressed', 'zstd:1'], 'Compressions to prepare and read.')
_TRAIN_EXAMPLES = flags.DEFINE_integer('train_examples', 1_000_000, 'Examples the trainer is timed on.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/criteo_pipeline.md', 'Where the table and raw figures go.')
cli.define_config_flag('experiments/configs/criteo_kaggle.py:local', 'The config whose layout is measured.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  config_file = config_flags.get_config_filename(FLAGS['config'])
  table, raw = criteo_pipeline.run(
    FLAGS.config, config_file, _ROOT.value, _ROWS.value, _COMPRESSIONS.value, _TRAIN_EXAMPLES.value
  )
  print(table)
  note = (
    f'On {raw["cores"]} cores shared with other jobs (load average {raw["load_average_before"]:.1f} before, '
    f'{raw["load_average_after"]:.1f} after): per core = rows per CPU-second of a preparing worker; reading runs '
    "the processes at once, each through input_pipeline.train_batches over its replicas' rows; its figures are "
    'wall-clock, with examples per CPU-second beside them; training is timed in one process and in a job of two '
    f'(one replica each). Changed from the defaults: none but the config ({config_file}) and the '
    f'{raw["training"][0]["train_examples"]:,} examples the trainer is timed on.'
  )
  title = 'Criteo at its real size: preparing, reading, training'
  report.write(_OUT.value, title, report.command_line(), table, {'run': raw}, note=note, root=_ROOT.value)


if __name__ == '__main__':
  cli.run(main)
