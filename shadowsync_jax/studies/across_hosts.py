r"""The ShadowSync study across emulated hosts: what synchronization costs when a network carries it.

  results, order = across_hosts.run(root, ['10gbit', '100mbit'], list(across_hosts.ALGORITHMS), repeats=3)
  print(across_hosts.table(results))
  across_hosts.plot(results, ['10gbit', '100mbit'], list(across_hosts.ALGORITHMS), 'hosts.png')

Each algorithm runs as a job of 2 processes, each in an emulated host of its own (`experiments.launch
--hosts=netns`: a network namespace behind a link shaped to the profile, the coordinator in host 0) and pinned to
one core, one replica per host (the default `num_replicas`, on the launcher's default 4 CPU devices), on the default
config. Examples/sec of the same job move by 10-30% between runs on a shared machine, more than a shadow thread's
cost, so every run of another algorithm is bracketed by runs of `none` on the same link, just before and just after
it (none, sync_sgd, none, fr_ma, none, shadow_ma, ..., none), and its throughput is read against theirs: the ratio
of its examples/sec (mean of the hosts) to the mean of the two `none` runs around it. The table, per row:
examples/sec of each host (mean over the row's runs), that paired ratio and the eval NE (mean and range over the
row's runs, all of one seed: they differ by timing alone; every run's in the raw summaries), the NE's gap to
`sync_sgd`'s at that profile, sync rounds, mean sync gap, the pace the
hosts agreed on at the last round, and the bytes each host sent per step (from its interface counters); the plot:
examples/sec against bandwidth, one line per algorithm.

Changed from the defaults: each process pinned to a core, `train.progress_every_s`. The default problem's 2M examples
(sync SGD at 100 Mbit/s takes 0.1 s a step; every other row runs 3 times by default, each beside its `none` runs: the
result file says how long its runs took). `fr_ma` keeps the default `sync.every_k_steps` (10), the shadow algorithms the
default pace (`sync.min_interval_s=auto`, `sync.max_overhead=0.05`). `sync_sgd` runs once: its NE is the reference and
does not move between runs. Needs root and iproute2 (`shadowsync_jax.parallel.netns`).
"""

import pathlib
import statistics
from typing import Any

from shadowsync_jax.parallel import supervisor
from shadowsync_jax.studies import bracketed
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import result_files
from shadowsync_jax.studies import spread

ALGORITHMS = ('none', 'sync_sgd', 'fr_ma', 'shadow_ma', 'shadow_ea', 'shadow_bmuf')
# Bits per second of each profile, for the plot's axis.
BANDWIDTH_BPS = {'10gbit': 1e10, '1gbit': 1e9, '100mbit': 1e8, '10mbit': 1e7}


def run_job(
  workdir: pathlib.Path,
  algorithm: str,
  profile: str,
  num_train_examples: int | None = None,
  max_overhead: float | None = None,
) -> dict[str, Any]:
  """One 2-host job; its summary.json."""
  train_flags = [f'--config.sync.algorithm={algorithm}', '--config.train.progress_every_s=60']
  if num_train_examples:
    train_flags.append(f'--config.data.num_train_examples={num_train_examples}')
  if max_overhead is not None:
    train_flags.append(f'--config.sync.max_overhead={max_overhead}')
  launch_flags = [
    '--num_processes=2',
    '--hosts=netns',
    f'--link_profile={profile}',
    '--pin_cpus',
    '--peer_timeout_s=60',
    '--grace_s=30',
  ]
  job = jobs.launch(workdir, launch_flags, train_flags)
  if job.error:
    raise RuntimeError(f'{algorithm} at {profile} refused its config: {job.error}')
  return job.summary


def run(
  root: pathlib.Path, profiles: list[str], algorithms: list[str], repeats: int, **job_settings: Any
) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
  """Every profile's bracketed runs; ({(profile, algorithm): row}, the run order of a profile). `job_settings`:
  `run_job`'s num_train_examples, max_overhead."""
  others = [a for repeat in range(repeats) for a in algorithms if a != 'none' and not (repeat and a == 'sync_sgd')]
  order = bracketed.run_order('none', others)
  results = {}
  for profile in profiles:
    summaries = []
    for i, algorithm in enumerate(order):
      print(f'--- {algorithm} at {profile} (run {i + 1} of {len(order)})', flush=True)
      summaries.append(run_job(root / f'{profile}_{i}_{algorithm}', algorithm, profile, **job_settings))
    # Of each run: the mean of its hosts.
    speeds = [statistics.fmean(s['examples_per_sec_per_process']) for s in summaries]
    ratios = bracketed.ratios(order, speeds, 'none')
    for algorithm in algorithms:
      runs = [i for i, a in enumerate(order) if a == algorithm]
      results[(profile, algorithm)] = row(
        [summaries[i] for i in runs], [speeds[i] for i in runs], [ratios[i] for i in runs]
      )
  return results, order


def row(summaries: list[dict], speeds: list[float], ratios: list[float | None]) -> dict:
  """One row from its runs (their summaries, examples/sec and paired ratios): the first run's summary (rounds, pace,
  bytes), each host's examples/sec as the mean over the runs, the paired ratio and the eval NE as the mean and range
  of the runs' (one seed: the runs differ by their timing alone), and what every run read."""
  figures = spread.mean_and_range({'vs_none_paired': ratios, 'eval_ne_mean': [s['eval_ne'] for s in summaries]})
  return {
    **summaries[0],
    'examples_per_sec_per_process': [
      statistics.fmean(host) for host in zip(*(s['examples_per_sec_per_process'] for s in summaries))
    ],
    **figures,  # vs_none_paired, eval_ne_mean and their ranges over the row's runs.
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
    several = len(summary.get('vs_none_per_run') or ()) > 1  # One run (sync_sgd), or the reference: no range.
    if summary['vs_none_paired'] is None:
      ratio = '-'
    elif not several or algorithm == 'none':
      ratio = f'{summary["vs_none_paired"]:.2f}'
    else:
      ratio = spread.span(summary, 'vs_none_paired', '{:.2f}')
    ne = spread.span(summary, 'eval_ne_mean', '{:.4f}') if several else f'{summary["eval_ne"]:.4f}'
    ne_gap = '-'
    if reference:
      ne_gap = f'{100 * (summary.get("eval_ne_mean", summary["eval_ne"]) / reference["eval_ne"] - 1):+.2f}%'
    gap, pace = summary['mean_sync_gap'], summary.get('sync_job_interval_s')
    sent = statistics.fmean(summary['net_bytes_sent']) / summary['train_steps'] / 1e3
    lines.append(
      f'| {profile} | {algorithm} | {speeds[0]:,.0f} | {speeds[1]:,.0f} | {ratio} | {ne} | '
      f'{ne_gap} | {summary["sync_rounds"]} | {"-" if gap is None else f"{gap:.1f}"} | '
      f'{"-" if pace is None else f"{pace:.2f}"} | {sent:,.1f} |'
    )
  return '\n'.join(lines)


def plot(results: dict[tuple[str, str], dict], profiles: list[str], algorithms: list[str], path: str) -> None:
  """Examples/sec per host against bandwidth, one line per algorithm."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for algorithm in algorithms:
    points = [
      (BANDWIDTH_BPS[p], statistics.fmean(results[(p, algorithm)]['examples_per_sec_per_process'])) for p in profiles
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


def note(order: list[str], num_train_examples: int | None, max_overhead: float | None) -> str:
  """The settings sentence of the result file."""
  return (
    f'2 emulated hosts (network namespaces, tbf-shaped links) x 1 replica (on {supervisor.DEFAULT_CPU_DEVICES} CPU '
    "devices, the launcher's default), "
    'each pinned to one core; '
    + (f'{num_train_examples:,} training examples; ' if num_train_examples else '')
    + (f'sync.max_overhead={max_overhead:g}; ' if max_overhead is not None else '')
    + 'everything else at the default config (shadow pace auto, fr_ma every 10 steps, checkpoints on). '
    + f'Per link the runs went {", ".join(order)}: every run of another algorithm between two runs of none. '
    + 'Host ex/s: the mean over the row\'s runs; "vs none": a run\'s examples/sec (mean of the hosts) over the mean '
    "of the two none runs around it, mean (lowest to highest) over the row's runs (the raw summaries list every "
    "run's); eval NE: the same over the row's runs, all of seed 0 (they differ by timing alone), its gap to sync_sgd "
    'from the mean; rounds, gap, pace and bytes: the row\'s first run. "sent per step": the bytes a host\'s interface '
    'sent, per training step, mean of the hosts.'
  )


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): `sync_sgd`'s and `fr_ma`'s pace at the slowest link, what
  the shadow algorithms keep at every link, their NE and rounds."""
  rows = result_files.rows(path)
  profiles = list(dict.fromkeys(key.split(' at ')[1] for key in rows))
  slow = profiles[-1]
  ratio = lambda algorithm, profile: rows[f'{algorithm} at {profile}']['vs_none_paired']
  shadows = [k for k in rows if k.startswith('shadow_')]
  kept = [rows[k]['vs_none_paired'] for k in shadows]
  gaps = [  # A row's mean over its runs, as its table shows it.
    abs(
      100 * (rows[k].get('eval_ne_mean', rows[k]['eval_ne']) / rows[f'sync_sgd at {k.split(" at ")[1]}']['eval_ne'] - 1)
    )
    for k in shadows
    if f'sync_sgd at {k.split(" at ")[1]}' in rows
  ]
  rounds = [n for k in shadows for n in rows[k]['sync_rounds_per_run']]
  return (
    f"at {slow} `sync_sgd` runs at {ratio('sync_sgd', slow):.2f} of `none`'s examples/sec and `fr_ma` at "
    f'{ratio("fr_ma", slow):.2f}; the shadow algorithms keep {min(kept):.2f}-{max(kept):.2f} at every link '
    f"(each run read against the `none` runs beside it), their NE within {max(gaps):.2f}% of `sync_sgd`'s (row means), "
    f'{min(rounds)}-{max(rounds)} rounds a run (one seed)'
  )
