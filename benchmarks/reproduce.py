r"""Reruns the studies whose results are stale, one command after the other (`shadowsync_jax.studies.reproduce`).

  python -m benchmarks.reproduce --list            # every study: stale or current, its last time, its command
  python -m benchmarks.reproduce                   # rerun every stale one
  python -m benchmarks.reproduce --only=sync_study,stragglers   # these (a result file's name), stale or not
  python -m benchmarks.reproduce --all             # every one

Each command is the one its result files recorded, run as it was (its flags, its `--out`), and writes its files,
its page's table and headlines as it does when run by hand. Exits with status 1 if any failed (every one is tried).
Run it on a quiet machine: the speed figures are worth what it was.
"""

import sys

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.studies import reproduce

flags.DEFINE_bool('list', False, 'List the studies, stale or current, with their last times; run nothing.')
flags.DEFINE_list('only', [], "Rerun these studies (a result file's name without its suffix), stale or not.")
flags.DEFINE_bool('all', False, 'Rerun every study, stale or not.')
flags.DEFINE_string('results', reproduce.RESULTS_DIR, 'Where the result files are.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  found = reproduce.studies(FLAGS.results)
  if FLAGS.list:
    print(reproduce.listing(found))
    return
  try:
    chosen = reproduce.selected(found, only=FLAGS.only, every=FLAGS.all)
  except ValueError as error:
    sys.exit(str(error))
  if not chosen:
    print('Every study is current: nothing to rerun (--all reruns them all).')
    return
  failed = reproduce.run(chosen)
  print(f'{len(chosen) - len(failed)} of {len(chosen)} studies rerun.')  # Each wrote the README's time (`report`).
  if failed:
    sys.exit('failed: ' + '; '.join(study.command for study in failed))


if __name__ == '__main__':
  cli.run(main)
