r"""Which study results are stale: each result file with the code it measures that changed since it was written,
and the commits that changed it (`shadowsync_jax.studies.staleness`).

  python -m benchmarks.stale_results [--results=benchmarks/results] [--only_stale]

Exits with status 1 when any result is stale (0 when every one is current), so that a script can stop on it.
"""

import sys

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.studies import staleness

flags.DEFINE_string('results', 'benchmarks/results', 'Where the result files are.')
flags.DEFINE_bool('only_stale', False, 'List only the stale ones.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  entries = list(staleness.check(FLAGS.results))
  for entry in entries:
    if entry.stale or not FLAGS.only_stale:
      print(staleness.describe(entry))
  stale = sum(entry.stale for entry in entries)
  print(f'{stale} of {len(entries)} result files stale.')
  sys.exit(1 if stale else 0)


if __name__ == '__main__':
  cli.run(main)
