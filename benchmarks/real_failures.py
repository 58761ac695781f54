r"""Failure recovery on real failures: 2 processes on the default problem, killed on one seeded schedule.

  python -m benchmarks.real_failures [--kill_mtbf_s=20] [--kill_seed=0] [--modes=full,partial,cpr_mfu,cpr] \
      [--root=DIR] [--out=benchmarks/results/real_failures.md] [--tiny]

Runs the job once without failures and without recovery (the reference), then once per mode with the launcher
SIGKILLing a random process at exponential times of mean `--kill_mtbf_s` seconds (`--max_restarts` as needed);
every run the same schedule (`shadowsync_jax.studies.real_failures`). Settings changed from the defaults: the
launcher's `--num_processes=2 --cpu_devices=1 --pin_cpus` (each process on a core of its own, like two hosts),
`recovery.mode` and `recovery.mtbf_steps` (the schedule's mean in the reference's steps). Prints the table and
writes it, with the raw summaries, to `--out`; docs/studies/real_failures.md embeds it.
"""

import pathlib
import tempfile

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.studies import real_failures
from shadowsync_jax.studies import report

flags.DEFINE_float('kill_mtbf_s', 20.0, 'Mean seconds between the kills.')
flags.DEFINE_integer('kill_seed', 0, 'Seed of the kill schedule (the same for every mode).')
flags.DEFINE_list('modes', ['full', 'partial', 'cpr_mfu', 'cpr'], 'Recovery modes to run after the reference.')
flags.DEFINE_string('root', None, 'Where the runs go (default: a new temporary directory).')
flags.DEFINE_string('out', 'benchmarks/results/real_failures.md', 'Where the table and raw summaries go.')
flags.DEFINE_bool('tiny', False, 'The tiny config (seconds per run), for a smoke test.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  root = pathlib.Path(FLAGS.root or tempfile.mkdtemp(prefix='real_failures_'))
  train_flags = ['--config.train.progress_every_s=60']
  if FLAGS.tiny:
    train_flags.insert(0, '--config=experiments/configs/default.py:tiny')
  rows = real_failures.run(root, tuple(FLAGS.modes), FLAGS.kill_mtbf_s, FLAGS.kill_seed, train_flags=tuple(train_flags))
  text = real_failures.table(rows)
  print(text)
  note = (
    f'2 processes x 1 replica, default problem{" (tiny)" if FLAGS.tiny else ""}, each pinned to one core; kills at '
    f'exponential times of mean {FLAGS.kill_mtbf_s:g} s, seed {FLAGS.kill_seed}; reference step time '
    f'{1e3 * rows[0]["step_s"]:.1f} ms.'
  )
  out = report.write(FLAGS.out, 'Recovery from real failures', report.command_line(), text, rows, note=note, root=root)
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
