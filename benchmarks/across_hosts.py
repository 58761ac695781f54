r"""The ShadowSync study across emulated hosts (`shadowsync_jax.studies.across_hosts`).

  python -m benchmarks.across_hosts [--profiles=10gbit,1gbit,100mbit] \
      [--algorithms=none,sync_sgd,fr_ma,shadow_ma,shadow_ea,shadow_bmuf] [--num_train_examples=N] \
      [--max_overhead=0.05] [--repeats=3] [--out=benchmarks/results/across_hosts.md] \
      [--plot=benchmarks/results/across_hosts.png]

Prints the table and writes it with the raw summaries to `--out`, a plot of examples/sec against bandwidth to
`--plot`. Needs root and iproute2 (`shadowsync_jax.parallel.netns`).
"""

import pathlib
import tempfile

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.parallel import netns
from shadowsync_jax.studies import across_hosts
from shadowsync_jax.studies import report as study_report

flags.DEFINE_list('profiles', ['10gbit', '1gbit', '100mbit'], 'Link profiles of both hosts, fastest first.')
flags.DEFINE_list(
  'algorithms', list(across_hosts.ALGORITHMS), 'Sync algorithms (none: the ceiling; sync_sgd: the NE reference).'
)
flags.DEFINE_integer('num_train_examples', None, "Length of the one-pass training stream (default: the config's).")
flags.DEFINE_float('max_overhead', None, "sync.max_overhead, the shadow pace's budget; unset: the default (0.05).")
flags.DEFINE_integer(
  'repeats',
  3,
  "Runs of each row but none and sync_sgd, in turn (a profile's rows, then again), each between two runs of none. "
  'sync_sgd runs once (the NE reference, deterministic; 7 minutes at 100mbit).',
)
flags.DEFINE_string('out', 'benchmarks/results/across_hosts.md', 'Where the table and raw summaries go.')
flags.DEFINE_string('plot', 'benchmarks/results/across_hosts.png', 'Where the plot goes.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  unknown = [p for p in FLAGS.profiles if p not in across_hosts.BANDWIDTH_BPS]
  if unknown:
    cli.exit_with_usage_error(f'--profiles: unknown {unknown}; known: {", ".join(across_hosts.BANDWIDTH_BPS)}.')
  reason = netns.unavailable_reason()
  if reason:
    cli.exit_with_usage_error(reason)
  if FLAGS.repeats < 1:
    cli.exit_with_usage_error(f'--repeats={FLAGS.repeats} must be at least 1.')
  if 'none' not in FLAGS.algorithms:
    cli.exit_with_usage_error('--algorithms must hold none: every other run is read against the none runs beside it.')
  with tempfile.TemporaryDirectory() as root:
    results, order = across_hosts.run(
      pathlib.Path(root),
      FLAGS.profiles,
      FLAGS.algorithms,
      FLAGS.repeats,
      num_train_examples=FLAGS.num_train_examples,
      max_overhead=FLAGS.max_overhead,
    )
  text = across_hosts.table(results)
  print(text)
  across_hosts.plot(results, FLAGS.profiles, FLAGS.algorithms, FLAGS.plot)
  out = study_report.write(
    FLAGS.out,
    'ShadowSync across emulated hosts',
    study_report.command_line(),
    text,
    {f'{a} at {p}': r for (p, a), r in results.items()},
    note=across_hosts.note(order, FLAGS.num_train_examples, FLAGS.max_overhead),
  )
  print(f'-> {out}, {FLAGS.plot}')


if __name__ == '__main__':
  cli.run(main)
