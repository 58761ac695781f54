r"""Stragglers across processes: does one slow process hold the others back? (`shadowsync_jax.studies.stragglers`)

  python -m benchmarks.stragglers [--slowdown=2] [--algorithms=none,shadow_ma,shadow_ea,shadow_bmuf,sync_sgd] \
      [--repeats=3] [--num_train_examples=N] [--min_interval_s=S] [--pin_cpus] [--out=benchmarks/results/stragglers.md]

Prints the table and writes it with the raw summaries to `--out`.
"""

import pathlib
import tempfile

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.studies import report as study_report
from shadowsync_jax.studies import stragglers

flags.DEFINE_float('slowdown', 2.0, 'How many times slower the straggler (process 1) is.')
flags.DEFINE_integer('num_train_examples', None, "Length of the one-pass training stream (default: the config's).")
flags.DEFINE_list(
  'algorithms',
  ['none', 'shadow_ma', 'shadow_ea', 'shadow_bmuf', 'sync_sgd'],
  'Sync algorithms to compare (none: the ceiling, no coupling at all); ALGORITHM@PLACEMENT also sets the placement.',
)
flags.DEFINE_string(
  'min_interval_s', None, "shadow_*: least seconds between rounds, or 'auto' (default: the config's)."
)
flags.DEFINE_integer('repeats', stragglers.REPEATS, 'Runs of each pair (without and with the straggler).')
flags.DEFINE_bool('pin_cpus', False, 'Each process on its own share of the cores, like separate hosts.')
flags.DEFINE_string('out', 'benchmarks/results/stragglers.md', 'Where the table and raw summaries go.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as root:
    results = stragglers.run(
      pathlib.Path(root),
      tuple(FLAGS.algorithms),
      FLAGS.slowdown,
      FLAGS.repeats,
      num_train_examples=FLAGS.num_train_examples,
      min_interval_s=FLAGS.min_interval_s,
      pin_cpus=FLAGS.pin_cpus,
    )
  text = stragglers.table(results)
  print(text)
  raw = {stragglers.raw_key(key): r for key, r in results.items()}
  out = study_report.write(
    FLAGS.out,
    'Stragglers across 2 processes',
    study_report.command_line(),
    text,
    raw,
    note=stragglers.note(FLAGS.slowdown, FLAGS.pin_cpus),
  )
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
