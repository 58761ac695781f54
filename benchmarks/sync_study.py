r"""The ShadowSync study: every sync algorithm on the same data, R replicas, total training data fixed, per seed.

  python -m benchmarks.sync_study [--seeds=0,1,2] [--repeats=1] [--num_replicas=8] [--batch_size=256] \
      [--num_train_examples=2000000] [--min_interval_s=auto|SECONDS] [--steps_per_dispatch=auto|K] \
      [--out=benchmarks/results/sync_study.md]

What it runs and measures, and the table it prints and writes to `--out`: `shadowsync_jax.studies.sync_study`.
"""

import pathlib
import tempfile

from absl import flags
from absl import logging
import jax

from shadowsync_jax import cli
from shadowsync_jax.studies import report as study_report

flags.DEFINE_integer('num_replicas', 8, 'Replicas (virtual CPU devices on a CPU machine).')
flags.DEFINE_integer(
  'num_train_examples', None, 'Length of the one-pass training stream, for every run; unset: the default (all of it).'
)
flags.DEFINE_integer('batch_size', None, 'Examples per replica per step; unset: the default (256).')
flags.DEFINE_integer('every_k_steps', 10, 'k of the foreground algorithms in their first runs.')
flags.DEFINE_string('min_interval_s', None, "sync.min_interval_s: seconds, or 'auto'; unset: the default ('auto').")
flags.DEFINE_string(
  'steps_per_dispatch',
  None,
  "train.steps_per_dispatch of every run: an integer K, or 'auto'; unset: the default ('auto', K chosen by each "
  'run). A K here is run by the shadow algorithms too.',
)
flags.DEFINE_string('what', 'all', "What a round syncs: 'all' or 'dense'.")
flags.DEFINE_string('embedding_placement', 'replicated', "'replicated' or 'shared'.")
flags.DEFINE_string('out', 'benchmarks/results/sync_study.md', 'Where the table and raw summaries go.')
flags.DEFINE_bool('tiny', False, 'The tiny config (seconds per run), for a smoke test.')
flags.DEFINE_integer(
  'repeats',
  1,
  'Runs of the whole grid, interleaved; examples/sec is the best of them (on a '
  'shared machine the best run is the least disturbed one), NE and the rest from the first.',
)
flags.DEFINE_list('seeds', ['0', '1', '2'], 'config.seed of each grid; NE is compared within a seed.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_num_cpu_devices', max(FLAGS.num_replicas, 1))
  from experiments.configs import default  # pylint: disable=g-import-not-at-top  (after the device count is set)
  from shadowsync_jax.studies import sync_study  # pylint: disable=g-import-not-at-top

  variant = 'tiny' if FLAGS.tiny else 'default'
  base = default.get_config('tiny' if FLAGS.tiny else '')
  settings = sync_study.Settings(
    num_replicas=FLAGS.num_replicas,
    every_k_steps=FLAGS.every_k_steps,
    batch_size=FLAGS.batch_size,
    num_train_examples=None if FLAGS.tiny else FLAGS.num_train_examples,  # The tiny config keeps its stream.
    min_interval_s=FLAGS.min_interval_s,
    what=FLAGS.what,
    embedding_placement=FLAGS.embedding_placement,
    steps_per_dispatch=_steps_per_dispatch(FLAGS.steps_per_dispatch),
    repeats=FLAGS.repeats,
    seeds=tuple(int(seed) for seed in FLAGS.seeds),
  )
  root = pathlib.Path(tempfile.mkdtemp(prefix='sync_study_'))
  rows = sync_study.run(base, settings, root)
  table = sync_study.table(rows)
  print(table)
  note = sync_study.note(variant, base, settings, rows)
  out = study_report.write(FLAGS.out, 'Sync study', study_report.command_line(), table, rows, note=note)
  print(f'written to {out}')


def _steps_per_dispatch(text: str | None) -> int | str | None:
  """The flag's K as an integer; anything else as it is (the config's check refuses it, naming the key)."""
  return int(text) if text is not None and text.isdigit() else text


if __name__ == '__main__':
  cli.run(main)
