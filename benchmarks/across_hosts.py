r"""The ShadowSync study across emulated hosts: what synchronization costs when a network carries it.

  python -m benchmarks.across_hosts [--profiles=10gbit,1gbit,100mbit] \
      [--algorithms=none,sync_sgd,fr_ma,shadow_ma,shadow_ea,shadow_bmuf] [--num_train_examples=N] \
      [--max_overhead=0.05] [--repeats=3] [--out=benchmarks/results/across_hosts.md] \
      [--plot=benchmarks/results/across_hosts.png]

Each algorithm runs as a job of 2 processes, each in an emulated host of its own (`experiments.launch
--hosts=netns`: a network namespace behind a link shaped to the profile, the coordinator in host 0) and pinned to
one core, one replica per host (the default `num_replicas`, on the launcher's default 4 CPU devices), on the default
config. Examples/sec of the same job move by 10-30% between runs on a shared machine, more than a shadow thread's
cost, so every run of another algorithm is bracketed by runs of `none` on the same link, just before and just after
it (none, sync_sgd, none, fr_ma, none, shadow_ma, ..., none), and its throughput is read against theirs: the
ratio of its examples/sec (mean of the hosts) to the mean of the two `none` runs around it. Prints a markdown table
per row: examples/sec of each host (mean over the row's runs), that paired ratio (mean over the row's runs, every run's
in the raw summaries), eval NE and its gap to `sync_sgd`'s at
that profile, sync rounds, mean sync gap, the pace the hosts agreed on at the last round, and the bytes each host sent
per step (from its interface counters); writes it with the raw summaries to `--out` and a plot of examples/sec
against bandwidth (one line per algorithm) to `--plot`.

Changed from the defaults: each process pinned to a core, `train.progress_every_s`. The default problem's 2M
examples (sync SGD at 100 Mbit/s takes 0.1 s a step; with the default 3 runs of every other row, each beside its
`none` runs, the study takes about 50 minutes). `fr_ma` keeps the default `sync.every_k_steps` (10), the shadow
algorithms the default pace (`sync.min_interval_s=auto`, `sync.max_overhead=0.05`). `sync_sgd` runs once: its NE is
the reference and does not move between runs. Needs root and iproute2 (`shadowsync_jax.parallel.netns`).
"""

import io
import json
import pathlib
import statistics
import tempfile

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.parallel import netns
from shadowsync_jax.parallel import supervisor
from shadowsync_jax.studies import bracketed
from shadowsync_jax.studies import report as study_report

ALGORITHMS = ('none', 'sync_sgd', 'fr_ma', 'shadow_ma', 'shadow_ea', 'shadow_bmuf')
# Bits per second of each profile, for the plot's axis.
BANDWIDTH_BPS = {'10gbit': 1e10, '1gbit': 1e9, '100mbit': 1e8, '10mbit': 1e7}

flags.DEFINE_list('profiles', ['10gbit', '1gbit', '100mbit'], 'Link profiles of both hosts, fastest first.')
flags.DEFINE_list('algorithms', list(ALGORITHMS), 'Sync algorithms (none: the ceiling; sync_sgd: the NE reference).')
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


def run_job(workdir: pathlib.Path, algorithm: str, profile: str) -> dict:
  """One 2-host job; its summary.json (raises with the job's output if it failed)."""
  train_flags = [
    f'--workdir={workdir}',
    f'--config.sync.algorithm={algorithm}',
    '--config.train.progress_every_s=60',
  ]
  if FLAGS.num_train_examples:
    train_flags.append(f'--config.data.num_train_examples={FLAGS.num_train_examples}')
  if FLAGS.max_overhead is not None:
    train_flags.append(f'--config.sync.max_overhead={FLAGS.max_overhead}')
  output = io.StringIO()
  with netns.EmulatedHosts(2, profile) as hosts:
    code = supervisor.supervise(
      train_flags,
      num_processes=2,
      cpu_devices=supervisor.DEFAULT_CPU_DEVICES,
      peer_timeout_s=60.0,
      grace_s=30.0,
      pin_cpus=True,
      out=output,
      hosts=hosts,
    )
  if code != 0:
    raise RuntimeError(f'{algorithm} at {profile} failed:\n{output.getvalue()}')
  return json.loads((workdir / 'summary.json').read_text())


def row(summaries: list[dict], speeds: list[float], ratios: list[float | None]) -> dict:
  """One row from its runs (their summaries, examples/sec and paired ratios): the first run's summary (NE, rounds,
  pace, bytes), each host's examples/sec as the mean over the runs, the paired ratio as the mean of the runs', and
  what every run read."""
  known = [r for r in ratios if r is not None]
  return {
    **summaries[0],
    'examples_per_sec_per_process': [
      statistics.fmean(host) for host in zip(*(s['examples_per_sec_per_process'] for s in summaries))
    ],
    'vs_none_paired': statistics.fmean(known) if known else None,
    'vs_none_per_run': ratios,
    'examples_per_sec_per_run': speeds,
    'eval_ne_per_run': [s['eval_ne'] for s in summaries],
    'sync_rounds_per_run': [s.get('sync_rounds') for s in summaries],
    'sync_job_interval_s_per_run': [s.get('sync_job_interval_s') for s in summaries],
  }


def table(results: dict[tuple[str, str], dict]) -> str:
  lines = [
    '| link | algorithm | host 0 ex/s | host 1 ex/s | vs none | eval NE | NE vs sync_sgd | sync rounds | '
    'mean sync gap | pace (s) | sent per step (KB) |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for (profile, algorithm), summary in results.items():
    speeds = summary['examples_per_sec_per_process']
    reference = results.get((profile, 'sync_sgd'))
    ratio = '-' if summary['vs_none_paired'] is None else f'{summary["vs_none_paired"]:.2f}'
    ne_gap = f'{100 * (summary["eval_ne"] / reference["eval_ne"] - 1):+.2f}%' if reference else '-'
    gap, pace = summary['mean_sync_gap'], summary.get('sync_job_interval_s')
    sent = statistics.fmean(summary['net_bytes_sent']) / summary['train_steps'] / 1e3
    lines.append(
      f'| {profile} | {algorithm} | {speeds[0]:,.0f} | {speeds[1]:,.0f} | {ratio} | {summary["eval_ne"]:.4f} | '
      f'{ne_gap} | {summary["sync_rounds"]} | {"-" if gap is None else f"{gap:.1f}"} | '
      f'{"-" if pace is None else f"{pace:.2f}"} | {sent:,.1f} |'
    )
  return '\n'.join(lines)


def plot(results: dict[tuple[str, str], dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for algorithm in FLAGS.algorithms:
    points = [
      (BANDWIDTH_BPS[p], statistics.fmean(results[(p, algorithm)]['examples_per_sec_per_process']))
      for p in FLAGS.profiles
    ]
    points.sort()
    ax.plot([x for x, _ in points], [y for _, y in points], marker='o', label=algorithm)
  ax.set_xscale('log')
  ax.set_xlabel('link bandwidth (bit/s)')
  ax.set_ylabel('examples/sec per host')
  ax.set_title('2 emulated hosts, 1 core each: throughput against bandwidth')
  ax.grid(True, which='both', alpha=0.3)
  ax.legend()
  fig.tight_layout()
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  unknown = [p for p in FLAGS.profiles if p not in BANDWIDTH_BPS]
  if unknown:
    cli.exit_with_usage_error(f'--profiles: unknown {unknown}; known: {", ".join(BANDWIDTH_BPS)}.')
  reason = netns.unavailable_reason()
  if reason:
    cli.exit_with_usage_error(reason)
  if FLAGS.repeats < 1:
    cli.exit_with_usage_error(f'--repeats={FLAGS.repeats} must be at least 1.')
  if 'none' not in FLAGS.algorithms:
    cli.exit_with_usage_error('--algorithms must hold none: every other run is read against the none runs beside it.')
  others = [
    a for repeat in range(FLAGS.repeats) for a in FLAGS.algorithms if a != 'none' and not (repeat and a == 'sync_sgd')
  ]
  order = bracketed.run_order('none', others)
  results = {}
  with tempfile.TemporaryDirectory() as root:
    for profile in FLAGS.profiles:
      summaries = []
      for i, algorithm in enumerate(order):
        print(f'--- {algorithm} at {profile} (run {i + 1} of {len(order)})', flush=True)
        summaries.append(run_job(pathlib.Path(root) / f'{profile}_{i}_{algorithm}', algorithm, profile))
      # Of each run: the mean of its hosts.
      speeds = [statistics.fmean(s['examples_per_sec_per_process']) for s in summaries]
      ratios = bracketed.ratios(order, speeds, 'none')
      for algorithm in FLAGS.algorithms:
        runs = [i for i, a in enumerate(order) if a == algorithm]
        results[(profile, algorithm)] = row(
          [summaries[i] for i in runs], [speeds[i] for i in runs], [ratios[i] for i in runs]
        )
  text = table(results)
  print(text)
  plot(results, FLAGS.plot)
  note = (
    f'2 emulated hosts (network namespaces, tbf-shaped links) x 1 replica (on {supervisor.DEFAULT_CPU_DEVICES} CPU '
    "devices, the launcher's default), "
    'each pinned to one core; '
    + (f'{FLAGS.num_train_examples:,} training examples; ' if FLAGS.num_train_examples else '')
    + (f'sync.max_overhead={FLAGS.max_overhead:g}; ' if FLAGS.max_overhead is not None else '')
    + 'everything else at the default config (shadow pace auto, fr_ma every 10 steps, checkpoints on). '
    + f'Per link the runs went {", ".join(order)}: every run of another algorithm between two runs of none. '
    + 'Host ex/s: the mean over the row\'s runs; "vs none": a run\'s examples/sec (mean of the hosts) over the mean '
    "of the two none runs around it, averaged over the row's runs (the raw summaries list every run's); NE, rounds, "
    'gap, pace and bytes: the row\'s first run. "sent per step": the bytes a host\'s interface sent, per training '
    'step, mean of the hosts.'
  )
  out = study_report.write(
    FLAGS.out,
    'ShadowSync across emulated hosts',
    study_report.command_line(),
    text,
    {f'{a} at {p}': r for (p, a), r in results.items()},
    note=note,
  )
  print(f'-> {out}, {FLAGS.plot}')


if __name__ == '__main__':
  cli.run(main)
