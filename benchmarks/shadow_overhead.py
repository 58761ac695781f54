r"""What the shadow rounds cost the trainers: the sync study's examples/sec ratio, measured in paired windows.

  python -m benchmarks.shadow_overhead [--algorithms=shadow_ma,shadow_ea,shadow_bmuf] [--window_steps=150] \
      [--pairs=40] [--num_replicas=8] [--batch_size=256] [--min_interval_s=auto|SECONDS] [--max_overhead=0.05] \
      [--tiny] [--out=benchmarks/results/shadow_overhead.md]

What it runs and measures, and the table it prints and writes to `--out`: `shadowsync_jax.studies.shadow_overhead`.
"""

import pathlib

from absl import flags
from absl import logging
import jax

from shadowsync_jax import cli
from shadowsync_jax.studies import report as study_report

flags.DEFINE_list('algorithms', ['shadow_ma', 'shadow_ea', 'shadow_bmuf'], 'Shadow algorithms to measure.')
flags.DEFINE_string('min_interval_s', None, "sync.min_interval_s: seconds, or 'auto'; unset: the default ('auto').")
flags.DEFINE_float('max_overhead', None, "sync.max_overhead ('auto' pace's budget); unset: the default (0.05).")
flags.DEFINE_integer('window_steps', 150, 'Steps per window.')
flags.DEFINE_integer('pairs', 40, 'Pairs of windows (one without the rounds, one with them) per algorithm.')
flags.DEFINE_integer('num_replicas', 8, 'Replicas (virtual CPU devices on a CPU machine).')
flags.DEFINE_integer('batch_size', None, 'Examples per replica per step; unset: the default (256).')
flags.DEFINE_string('what', 'all', "What a round syncs: 'all' or 'dense'.")
flags.DEFINE_string('embedding_placement', 'replicated', "'replicated' or 'shared'.")
flags.DEFINE_string('out', 'benchmarks/results/shadow_overhead.md', 'Where the table goes.')
flags.DEFINE_bool('tiny', False, 'The tiny config, for a smoke test.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_num_cpu_devices', max(FLAGS.num_replicas, 1))
  from experiments.configs import default  # pylint: disable=g-import-not-at-top  (after the device count is set)
  from shadowsync_jax.studies import shadow_overhead  # pylint: disable=g-import-not-at-top

  variant = 'tiny' if FLAGS.tiny else 'default'
  base = default.get_config('tiny' if FLAGS.tiny else '')
  settings = shadow_overhead.Settings(
    window_steps=FLAGS.window_steps,
    pairs=FLAGS.pairs,
    num_replicas=FLAGS.num_replicas,
    batch_size=FLAGS.batch_size,
    min_interval_s=FLAGS.min_interval_s,
    max_overhead=FLAGS.max_overhead,
    what=FLAGS.what,
    embedding_placement=FLAGS.embedding_placement,
  )
  rows = shadow_overhead.run(base, settings, FLAGS.algorithms)
  table = shadow_overhead.table(rows)
  print(table)
  note = shadow_overhead.note(variant, base, settings, FLAGS.algorithms[0])
  out = study_report.write(FLAGS.out, 'Shadow rounds overhead', study_report.command_line(), table, rows, note=note)
  print(f'written to {pathlib.Path(out)}')


if __name__ == '__main__':
  cli.run(main)
