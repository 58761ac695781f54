r"""The ShadowSync study as a scaling sweep: replicas x sync algorithms, the total training data fixed.

  python -m benchmarks.sweep [--output_dir=runs/sweep] [--tiny] [--replicas=1,2,4,8] \
      [--algorithms=none,sync_sgd,fr_ma,...] [--num_train_examples=1048576] [--batch_size=128]

Trains every cell of the grid in turn on the default synthetic stream, each in OUTPUT_DIR/<algorithm>/R<replicas>,
printing which cell it is on. `--tiny`: the same grid on the tiny config and 32,768 examples (about a minute and a
half on 2 cores). Compiled programs are kept in JAX's persistent compilation cache (`--compilation_cache_dir`), so
cells that run the same computation (the train step of `none`, `fr_*` and `shadow_*` at one R, the evaluation)
compile it once, and a rerun compiles nothing. Writes OUTPUT_DIR/sweep.csv (one row per cell: eval NE, AUC, Bayes
floor, examples/sec and its ratio to `none`, sync rounds and gaps, wall time) and three figures: eval_ne.png (with
the Bayes NE floor), examples_per_sec.png and sync_gap.png. `tensorboard --logdir=OUTPUT_DIR` compares all cells'
curves. Rerunning with the same OUTPUT_DIR reads finished cells back and trains only the rest.

On 2 CPU cores the default grid (25 cells) takes a few minutes; docs/studies/sweep.md reads the latest result
(benchmarks/results/sweep/). R replicas are R virtual CPU devices sharing the cores, so examples/sec does not grow
with R here (docs/design.md §6); read the throughput figure's ratio to `none` instead. The finished CSV's lines
above its header say the command, the commit and the machine.
"""

import os

from absl import app
from absl import flags
from absl import logging
import jax

from shadowsync_jax import cli
from shadowsync_jax import config as config_lib
from shadowsync_jax.parallel import compilation_cache
from shadowsync_jax.studies import report

flags.DEFINE_string(
  'output_dir', None, 'Where the cells, sweep.csv and the figures go (default runs/sweep, runs/sweep_tiny with --tiny).'
)
flags.DEFINE_bool('tiny', False, 'The tiny config and a short stream, the same grid: about a minute and a half.')
flags.DEFINE_list('replicas', None, 'Replica counts (on CPU, virtual devices); default 1,2,4,8.')
flags.DEFINE_list(
  'algorithms',
  None,
  'Sync algorithms, one curve each; default none, sync_sgd and the foreground and shadow ma, ea and bmuf.',
)
flags.DEFINE_string(
  'compilation_cache_dir',
  None,
  'JAX persistent compilation cache (default: $JAX_COMPILATION_CACHE_DIR if set, else OUTPUT_DIR/'
  '.compilation_cache; empty: none).',
)
flags.DEFINE_integer(
  'num_train_examples',
  None,
  'Length of the one-pass training stream of every cell (default 1,048,576; --tiny: 32,768).',
)
flags.DEFINE_integer('num_eval_examples', None, 'Held-out examples (default 200,000; --tiny: 4096).')
flags.DEFINE_integer('batch_size', None, 'Examples per replica per step (default 128; --tiny: 64).')
flags.DEFINE_integer('every_k_steps', 10, "Steps between the foreground algorithms' rounds.")
flags.DEFINE_string(
  'min_interval_s',
  None,
  "sync.min_interval_s of the shadow algorithms: seconds, or 'auto'; unset: the default ('auto').",
)
flags.DEFINE_integer('seed', 0, 'Seed of the data, the teacher and the model init.')
FLAGS = flags.FLAGS

# (num_train_examples, num_eval_examples, batch_size) of the two grids.
DEFAULT_SIZES = (1_048_576, 200_000, 128)
TINY_SIZES = (32_768, 4096, 64)
GRID = (
  ('1', '2', '4', '8'),
  ('none', 'sync_sgd', 'fr_ma', 'fr_ea', 'fr_bmuf', 'shadow_ma', 'shadow_ea', 'shadow_bmuf'),
)


def base_config():
  from experiments.configs import default  # pylint: disable=g-import-not-at-top  (after the device count is set)

  config = default.get_config('tiny' if FLAGS.tiny else '')
  train_examples, eval_examples, batch_size = TINY_SIZES if FLAGS.tiny else DEFAULT_SIZES
  config.data.num_train_examples = FLAGS.num_train_examples or train_examples
  config.data.num_eval_examples = FLAGS.num_eval_examples or eval_examples
  config.batch_size = FLAGS.batch_size or batch_size
  config.sync.every_k_steps = FLAGS.every_k_steps
  if FLAGS.min_interval_s is not None:
    config.sync.min_interval_s = config_lib.min_interval_from_text(FLAGS.min_interval_s)
  config.seed = FLAGS.seed
  config.train.progress_every_s = 30.0
  return config


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  from shadowsync_jax.studies import sweep  # pylint: disable=g-import-not-at-top

  default_replicas, default_algorithms = GRID
  cells = sweep.grid([int(r) for r in FLAGS.replicas or default_replicas], FLAGS.algorithms or default_algorithms)
  max_replicas = max(cell.replicas for cell in cells)
  jax.config.update('jax_num_cpu_devices', max_replicas)
  output_dir = FLAGS.output_dir or ('runs/sweep_tiny' if FLAGS.tiny else 'runs/sweep')
  cache_dir = compilation_cache.directory_for(
    FLAGS.compilation_cache_dir, os.path.join(output_dir, '.compilation_cache')
  )
  if cache_dir:
    jax.config.update('jax_compilation_cache_dir', os.path.abspath(cache_dir))
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  from shadowsync_jax import train  # pylint: disable=g-import-not-at-top  (after the device count is set)

  note = ''
  if jax.devices()[0].platform == 'cpu':
    note = (
      f"R replicas = R virtual CPU devices sharing this machine's {os.cpu_count()} cores: total examples/sec "
      'cannot grow with R here (docs/design.md §6); read the ratio to none.'
    )
  rows = sweep.run(
    cells,
    base_config(),
    output_dir,
    train.train_and_evaluate,
    num_devices=len(jax.devices()),
    plot_note=note,
    command=report.command_line(),
  )
  print(
    f'{len(rows)} cells -> {output_dir}/{sweep.CSV_FILENAME} and '
    f'{", ".join(f"{output_dir}/{name}" for name in sweep.PLOT_FILENAMES)}'
  )


if __name__ == '__main__':
  cli.run(main)
