r"""The ShadowSync study across emulated hosts: what synchronization costs when a network carries it.

  python -m benchmarks.across_hosts [--profiles=10gbit,1gbit,100mbit] \
      [--algorithms=none,sync_sgd,fr_ma,shadow_ma,shadow_ea,shadow_bmuf] [--num_train_examples=N] \
      [--max_overhead=0.05] [--repeats=2] [--out=benchmarks/results/across_hosts.md] \
      [--plot=benchmarks/results/across_hosts.png]

Each algorithm runs as a job of 2 processes, each in an emulated host of its own (`experiments.launch
--hosts=netns`: a network namespace behind a link shaped to the profile, the coordinator in host 0) and pinned to
one core, one replica per host (the default `num_replicas`, on the launcher's default 4 CPU devices), on the default
config; every profile's rows run one after the other, so they meet the same load. Prints a markdown table per row:
examples/sec of each host and their mean against `none`'s at that profile, eval NE and its gap to `sync_sgd`'s at
that profile, sync rounds, mean sync gap, the pace the hosts agreed on at the last round, and the bytes each host sent
per step (from its interface counters); writes it with the raw summaries to `--out` and a plot of examples/sec
against bandwidth (one line per algorithm) to `--plot`.

Changed from the defaults: each process pinned to a core, `train.progress_every_s`. The default problem's 2M
examples (sync SGD at 100 Mbit/s takes 0.1 s a step; with the default 2 runs of every other row the study takes about
45 minutes). `fr_ma` keeps the default `sync.every_k_steps` (10), the shadow algorithms the default pace
(`sync.min_interval_s=auto`, `sync.max_overhead=0.05`). Examples/sec of the same job move by 10-30% between runs on
a shared machine; each row but `sync_sgd` runs `--repeats` times and reports its fastest run.
Needs root and iproute2 (`shadowsync_jax.parallel.netns`).
"""

import io
import json
import pathlib
import tempfile

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.parallel import netns
from shadowsync_jax.parallel import supervisor
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
  2,
  "Runs of each row but sync_sgd, in turn (a profile's rows, then again); a row reports its run with the most "
  'examples/sec, as external load only ever slows a run down. sync_sgd runs once (the NE reference, deterministic; '
  'a quarter of an hour at 100mbit).',
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


def _mean(values: list[float]) -> float:
  return sum(values) / len(values)


def best_run(summaries: list[dict]) -> dict:
  """The run with the most examples/sec (mean of the hosts), with what every run read beside it."""
  best = max(summaries, key=lambda s: _mean(s['examples_per_sec_per_process']))
  return {
    **best,
    'examples_per_sec_per_run': [_mean(s['examples_per_sec_per_process']) for s in summaries],
    'eval_ne_per_run': [s['eval_ne'] for s in summaries],
    'sync_rounds_per_run': [s.get('sync_rounds') for s in summaries],
  }


def table(results: dict[tuple[str, str], dict]) -> str:
  lines = [
    '| link | algorithm | host 0 ex/s | host 1 ex/s | vs none | eval NE | NE vs sync_sgd | sync rounds | '
    'mean sync gap | pace (s) | sent per step (KB) |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for (profile, algorithm), summary in results.items():
    speeds = summary['examples_per_sec_per_process']
    none = results.get((profile, 'none'))
    reference = results.get((profile, 'sync_sgd'))
    ratio = f'{_mean(speeds) / _mean(none["examples_per_sec_per_process"]):.2f}' if none else '-'
    ne_gap = f'{100 * (summary["eval_ne"] / reference["eval_ne"] - 1):+.2f}%' if reference else '-'
    gap, pace = summary['mean_sync_gap'], summary.get('sync_job_interval_s')
    sent = _mean(summary['net_bytes_sent']) / summary['train_steps'] / 1e3
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
      (BANDWIDTH_BPS[p], _mean(results[(p, algorithm)]['examples_per_sec_per_process'])) for p in FLAGS.profiles
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
  runs: dict[tuple[str, str], list[dict]] = {}
  with tempfile.TemporaryDirectory() as root:
    for profile in FLAGS.profiles:
      for repeat in range(FLAGS.repeats):
        for algorithm in FLAGS.algorithms:
          if algorithm == 'sync_sgd' and repeat:
            continue
          print(f'--- {algorithm} at {profile}, run {repeat + 1}', flush=True)
          workdir = pathlib.Path(root) / f'{profile}_{algorithm}_{repeat}'
          runs.setdefault((profile, algorithm), []).append(run_job(workdir, algorithm, profile))
  results = {key: best_run(summaries) for key, summaries in runs.items()}
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
    + (
      f'Every row but sync_sgd ran {FLAGS.repeats} times in turn and shows its run with the most examples/sec '
      "(the raw summaries list every run's); sync_sgd ran once. "
      if FLAGS.repeats > 1
      else ''
    )
    + '"vs none": the mean of the hosts\' examples/sec over none\'s at that link; '
    '"sent per step": the bytes a host\'s interface sent, per training step, mean of the hosts.'
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
