"""Headlines: each study's one-sentence reading, written from its result file, never typed.

  headlines.sentence('benchmarks/results/stragglers.md')   # 'a 2x slower process holds sync_sgd to 0.50 ...'
  headlines.refresh()                                       # README.md and docs/ from the result files

The README's studies table and each study's page quote a result file's headline between two markers, and
`refresh` (run by `report.write` for the file it wrote, or by hand for all) rewrites them from the file:

  <!-- headline: benchmarks/results/stragglers.md -->...<!-- /headline -->

Each figure of a headline is a figure of its result file (a table cell, or a raw figure rounded as the headline
shows it), or a target the study is read against (`TARGETS`); `tests/test_docs.py` checks both, and that every
README headline is on the page its row links. A target reads "met" only where the interval clears it.
"""

from collections.abc import Callable
import pathlib
import re
import statistics
from typing import Any

from shadowsync_jax.studies import cpr
from shadowsync_jax.studies import real_failures
from shadowsync_jax.studies import result_files
from shadowsync_jax.studies import stragglers

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r'<!-- headline: (?P<path>\S+) -->(?P<body>.*?)<!-- /headline -->', re.S)


def _rows(path: str) -> Any:
  return result_files.read_rows(REPO_ROOT / path)


def _pct(value: float) -> str:
  return f'{value:+.2f}%'


def _verdict(low: float, high: float, target: float, higher_is_better: bool = True) -> str:
  """'met' where the interval clears the target, 'within noise' where it holds it, else 'not met'."""
  if not higher_is_better:
    low, high, target = -high, -low, -target
  return 'met' if low >= target else 'within noise' if high >= target else 'not met'


def _runs_verdict(values: list[float], bound: float) -> str:
  """A bound every run must keep (each run's NE, each restart): 'met' where all do, else how many do not."""
  over = sum(v > bound for v in values)
  return 'met' if not over else f'not met by {over} of {len(values)}'


def _default_problem(path: str) -> str:
  ne = _rows(path)['eval_ne']
  gaps = lambda label: [
    100 * (by_seed[label] / by_seed['Bayes floor (true probabilities)'] - 1) for by_seed in ne.values()
  ]
  dlrm = gaps('DLRM (experiments.train, default config)')
  regression = gaps('logistic regression, dense features only')
  return (
    f'over {len(dlrm)} seeds the DLRM lands {statistics.fmean(dlrm):.2f}% above the Bayes NE floor on average '
    f'({min(dlrm):.1f}% to {max(dlrm):.1f}%; target 3%: '
    f'{_verdict(-max(dlrm), -min(dlrm), -3.0)}); dense-only regression {statistics.fmean(regression):.2f}% above it'
  )


def _throughput(path: str) -> str:
  parts = []
  for row in _rows(path):
    low, high = row['fraction_interval']
    target = TARGETS[path][row['batch_size']]
    parts.append(
      f'{row["fraction_of_compute_limit"]:.2f} at batch {row["batch_size"]} (interval {low:.2f}-{high:.2f}; '
      f'target {target:g}: {_verdict(low, high, target)})'
    )
  return "of this machine's matmul limit (measured in the same run): " + ', '.join(parts)


def _sync_study(path: str) -> str:
  rows = _rows(path)
  seeds = sorted({row.get('seed', 0) for row in rows})
  ne = {(row['label'], row.get('seed', 0)): row['eval_ne'] for row in rows}
  gaps = {
    name: [100 * (ne[(name, s)] / ne[('sync_sgd', s)] - 1) for s in seeds]
    for name in ('shadow_ma', 'shadow_ea', 'shadow_bmuf')
  }
  worst = max(abs(g) for values in gaps.values() for g in values)
  each = ', '.join(
    f'{n.removeprefix("shadow_")} {_pct(statistics.fmean(g))}'
    + (f' ({min(g):+.2f}% to {max(g):+.2f}%)' if len(seeds) > 1 else '')
    for n, g in gaps.items()
  )
  target = TARGETS[path]
  met = [n.removeprefix('shadow_') for n, g in gaps.items() if max(abs(x) for x in g) <= target]
  return (
    f"on the default config with 8 replicas, at the default pace, the shadow algorithms' NE is within {worst:.2f}% "
    f"of `sync_sgd`'s in every run ({each}; "
    + (f'means over {len(seeds)} seeds' if len(seeds) > 1 else 'one seed')
    + f'); target {target:g}% on every seed: met by {", ".join(met) if met else "none"}'
  )


def _shadow_overhead(path: str) -> str:
  rows = _rows(path)
  medians = [r['ratio_median'] for r in rows.values()]
  verdicts = {_verdict(r['ratio_median_low'], r['ratio_median_high'], TARGETS[path]) for r in rows.values()}
  return (
    f"at the default pace the shadow rounds leave {min(medians):.3f}-{max(medians):.3f} of `none`'s examples/sec "
    f'(medians of paired windows in one run; target {TARGETS[path]:g}: {" / ".join(sorted(verdicts))})'
  )


def _across_hosts(path: str) -> str:
  rows = _rows(path)
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


def _sweep(path: str) -> str:
  from shadowsync_jax.studies import sweep  # pylint: disable=g-import-not-at-top  (matplotlib: only when asked)

  rows = sweep.read_csv(REPO_ROOT / path)
  top = max(r['replicas'] for r in rows)
  at = lambda algorithm, replicas: next(
    r['ne_vs_floor_pct'] for r in rows if r['algorithm'] == algorithm and r['replicas'] == replicas
  )
  synced = [r['ne_vs_floor_pct'] for r in rows if r['replicas'] == top and r['algorithm'] != 'none']
  return (
    f"with the data fixed, `none`'s NE goes from {at('none', 1):.1f}% above the floor at 1 replica to "
    f'{at("none", top):.1f}% at {top}; the synced algorithms stay at {min(synced):.1f}-{max(synced):.1f}% at {top}'
  )


def _stragglers(path: str) -> str:
  """`sync_sgd`'s pace under the straggler, and how much of its own the fast process keeps under the others (mean
  and range over the repeats; its target: `TARGETS`)."""
  results = {stragglers.parse_key(key): summary for key, summary in _rows(path).items()}
  algorithms = stragglers.by_algorithm(results)
  target = TARGETS[path]
  any_m = next(iter(algorithms.values()))
  slowdown, repeats = f'{any_m["slowdown"]:g}', min(m['repeats'] for m in algorithms.values())
  sync = algorithms['sync_sgd']
  low, high = sync['fast_kept_range']
  free = {a: m for a, m in algorithms.items() if a != 'sync_sgd'}
  verdicts: dict[str, list[str]] = {}  # 'met' only where the lowest repeat clears the target.
  for algorithm, m in free.items():
    verdicts.setdefault(_verdict(*m['fast_kept_range'], target), []).append(f'`{algorithm}`')
  means = [m['fast_kept'] for m in free.values()]
  return (
    f'a {slowdown}x slower process (its own steps {slowdown}x as long) holds `sync_sgd` to {sync["fast_kept"]:.2f} '
    f'of its pace ({f"{low:.2f} to {high:.2f} over {repeats} repeats" if repeats > 1 else "one run"}); under '
    + ', '.join(f'`{a}`' for a in free)
    + f' the fast process keeps {min(means):.2f}-{max(means):.2f} of its own on average (target {target:g}: '
    + '; '.join(f'{", ".join(names)}: {verdict}' for verdict, names in verdicts.items())
    + ')'
  )


def _gba(path: str) -> str:
  rows = _rows(path)
  slow_prob = max(r['straggler_prob'] for r in rows)
  seeds = sorted({r['seed'] for r in rows})
  pick = lambda algorithm, prob: {
    r['seed']: r for r in rows if r['sync_algorithm'] == algorithm and r['straggler_prob'] == prob
  }
  gaps, speed = [], []
  for prob in (0.0, slow_prob):
    sync, gba = pick('sync_sgd', prob), pick('gba', prob)
    gaps += [100 * (gba[s]['eval_ne'] / sync[s]['eval_ne'] - 1) for s in seeds]
    if prob:
      speed = [gba[s]['emulated_examples_per_sec'] / sync[s]['emulated_examples_per_sec'] for s in seeds]
  return (
    f"over {len(seeds)} seeds `gba`'s NE is within {max(abs(g) for g in gaps):.2f}% of `sync_sgd`'s with the same "
    f'hyperparameters, without and with stragglers, and runs {statistics.fmean(speed):.2f}x its emulated speed '
    'under stragglers'
  )


def _cpr(path: str) -> str:
  """Full recovery's overhead, the partial modes' shares of it on the same seed, the NE (mean and range over the
  seeds)."""
  rows = _rows(path)
  modes = cpr.by_mode(rows)
  seeds = len(modes['full']['seeds'])
  shares = {k: modes[k] for k in ('partial', 'cpr_mfu', 'cpr_ssu', 'cpr') if k in modes}
  ne = [abs(v) for m in shares.values() for v in m['ne_vs_reference_pct_range']]
  span = lambda m, key, unit='': (
    f'{m[key]:.2f}{unit}'
    + (f' ({m[key + "_range"][0]:.2f}{unit} to {m[key + "_range"][1]:.2f}{unit})' if seeds > 1 else '')
  )
  return (
    f"emulated failures, {seeds} seed{'s' if seeds != 1 else ''}: full recovery's overhead "
    f'{span(modes["full"], "overhead_pct", "%")}; '
    + ', '.join(f'`{mode}` {span(m, "overhead_vs_full")}' for mode, m in shares.items())
    + f" of it on the same seed; NE within {max(ne):.3f}% of the failure-free run's"
  )


def _real_failures(path: str) -> str:
  """Full recovery's checkpoint-related overhead, each mode's share of it (same seed), the restarts, the NE (its
  targets: `TARGETS`; a restart's at the default size only)."""
  targets = TARGETS[path]
  rows = _rows(path)
  modes, runs = real_failures.by_mode(rows), rows[1:]
  full = modes['full']
  shares = {mode: m['checkpoint_overhead_vs_full'] for mode, m in modes.items() if mode not in ('full', 'full:whole')}
  cpr_high = max(modes[m]['checkpoint_overhead_vs_full_range'][1] for m in ('cpr_mfu', 'cpr_ssu') if m in modes)
  cpr_low = min(modes[m]['checkpoint_overhead_vs_full_range'][0] for m in ('cpr_mfu', 'cpr_ssu') if m in modes)
  restarts = [s for r in runs for s in real_failures.restart_seconds(r)]  # A run's mean restart, run by run.
  ne = [abs(r['ne_vs_reference_pct']) for r in runs]
  seeds = len(full['kill_seeds'])
  return (
    f"killed processes, {seeds} kill seed{'s' if seeds != 1 else ''}: full recovery's checkpoint-related overhead "
    f"{full['checkpoint_overhead_pct']:.2f}% of the steps' time"
    + (
      f' ({modes["full:whole"]["checkpoint_overhead_pct"]:.2f}% with whole checkpoints at the same kill times)'
      if 'full:whole' in modes
      else ''
    )
    + '; '
    + ', '.join(f'`{mode}` {share:.2f}' for mode, share in shares.items())
    + f' of it on the same seed (cpr_mfu/ssu target {targets["vs_full"]:g}: '
    f'{_verdict(cpr_low, cpr_high, targets["vs_full"], higher_is_better=False)}); a restart '
    f'{min(restarts):.2f}-{max(restarts):.2f} s'
    + (
      f' (target {targets["restart_s"]:g} s on average a run: {_runs_verdict(restarts, targets["restart_s"])} runs)'
      if 'restart_s' in targets
      else ''
    )
    + f"; NE within {max(ne):.3f}% of the failure-free run's (target {targets['ne_pct']:g}% a run: "
    f'{_runs_verdict(ne, targets["ne_pct"])} runs)'
  )


def _real_failures_kaggle(path: str) -> str:
  return 'at Criteo Kaggle size: ' + _real_failures(path)


def _table_size(path: str) -> str:
  rows = [r for r in _rows(path) if r.get('state_bytes')]
  kaggle_one = [r for r in rows if r['size'] == 'Kaggle' and r['num_replicas'] == 1 and r['num_processes'] == 1]
  peaks = [r['peak_rss_bytes'] / 1e9 for r in kaggle_one]
  terabyte = [r for r in rows if r['size'] == 'Terabyte' and r['placement'] == 'sharded']
  tb_peaks = [r['peak_rss_bytes'] / 1e9 for r in terabyte]
  text = (REPO_ROOT / path).read_text()
  ratios = re.findall(r'batch (\d+): median (\d\.\d\d)', text)
  return (
    f"Criteo Kaggle's tables ({kaggle_one[0]['state_bytes'] / 1e9:.2f} GB of state) train in one process at a peak "
    f'of {min(peaks):.2f}-{max(peaks):.2f} GB, at '
    + ', '.join(f'{ratio} (batch {batch})' for batch, ratio in ratios)
    + " of the same model's speed with 100k-row tables (medians); Terabyte's sharded over 2 processes x 4 devices "
    f'at a peak of {min(tb_peaks):.2f}-{max(tb_peaks):.2f} GB a process'
  )


def _criteo_pipeline(path: str) -> str:
  text = (REPO_ROOT / path).read_text()
  prepare = re.search(r'preparing, uncompressed \| [^|]+\| ([\d,]+) rows/s per core', text).group(1)
  read = re.search(r'2 processes x 1 replica x 256 \| ([\d,]+) examples/s per process', text).group(1)
  train = re.search(r'2 processes x 1 replica x 256, [\d,]+ examples \|[^|]+\|[^|]+\| (\d+)x', text).group(1)
  return (
    f'prepares {prepare} rows/s per core; reads {read} examples/s per process with two processes (one replica '
    f"each), {train}x a replica's training pace"
  )


def _loop(path: str) -> str:
  rows, target = _rows(path), TARGETS[path]
  shares = []
  for name, row in rows.items():
    low, high = row['loop_share_range']
    what = f'the {name} config'
    if name.startswith('job'):
      from shadowsync_jax.studies import loop  # pylint: disable=g-import-not-at-top  (JAX: only for this row)

      what = f'{loop.JOB_PROCESSES} processes x {loop.JOB_DEVICES} devices with {row["algorithm"]}'
    shares.append(
      f'{row["loop_share_median"]:.2f} ({low:.2f} to {high:.2f}) for {what} (target {target["share"]:g}: '
      f'{_verdict(low, high, target["share"])})'
    )
  ceilings = {False: [], True: []}  # By whether the source is prepared data (its own target).
  for row in rows.values():
    if row['no_work_examples_per_sec_median'] is not None:  # None: a job, whose ceiling is not timed.
      ceilings[row.get('source') == 'prepared'].append(row['no_work_examples_per_sec_median'])
  fed = []
  for prepared, figures in ceilings.items():
    if figures:
      goal = target['ceiling_prepared' if prepared else 'ceiling']
      what = 'prepared data' if prepared else 'the synthetic stream'
      span = f'{min(figures):,.0f}' if len(figures) == 1 else f'{min(figures):,.0f} to {max(figures):,.0f}'
      fed.append(f'{span} examples/s of {what} (target {goal / 1e6:g}M: {_verdict(min(figures), max(figures), goal)})')
  return (
    f'one replica, the whole loop at {", ".join(shares)} of its own step alone; with a step that does no work it '
    f'feeds {" and ".join(fed)}'
  )


HEADLINES: dict[str, Callable[[str], str]] = {
  'benchmarks/results/default_quality.md': _default_problem,
  'benchmarks/results/throughput.md': _throughput,
  'benchmarks/results/loop.md': _loop,
  'benchmarks/results/sync_study.md': _sync_study,
  'benchmarks/results/shadow_overhead.md': _shadow_overhead,
  'benchmarks/results/across_hosts.md': _across_hosts,
  'benchmarks/results/sweep/sweep.csv': _sweep,
  'benchmarks/results/stragglers.md': _stragglers,
  'benchmarks/results/gba_study.md': _gba,
  'benchmarks/results/recovery.md': _cpr,
  'benchmarks/results/real_failures.md': _real_failures,
  'benchmarks/results/real_failures_kaggle.md': _real_failures_kaggle,
  'benchmarks/results/table_size.md': _table_size,
  'benchmarks/results/criteo_pipeline.md': _criteo_pipeline,
}
# Figures a headline may quote that are no measurement: the targets it is read against.
TARGETS: dict[str, Any] = {
  'benchmarks/results/default_quality.md': 3.0,
  'benchmarks/results/throughput.md': {128: 0.5, 1024: 0.75},
  'benchmarks/results/loop.md': {'share': 0.9, 'ceiling': 5e6, 'ceiling_prepared': 2e6},
  'benchmarks/results/sync_study.md': 0.5,
  'benchmarks/results/shadow_overhead.md': 0.95,
  'benchmarks/results/stragglers.md': 0.95,  # The fast process's examples/sec beside a straggler, of its own.
  'benchmarks/results/real_failures.md': {'vs_full': 0.2, 'restart_s': 2.0, 'ne_pct': 0.1},
  'benchmarks/results/real_failures_kaggle.md': {'vs_full': 0.2, 'ne_pct': 0.1, 'restart_s': 2.0},
}


def sentence(path: str) -> str:
  """The headline of the result file at `path` (relative to the repository)."""
  return HEADLINES[path](path)


def blocks(text: str) -> list[tuple[str, str]]:
  """(result file path, the quoted headline) for every headline block of a page."""
  return [(m.group('path'), m.group('body')) for m in _BLOCK.finditer(text)]


def pages(root: pathlib.Path = REPO_ROOT) -> list[pathlib.Path]:
  """The pages that may quote headlines: the README and every page under docs/."""
  return [root / 'README.md', *sorted((root / 'docs').rglob('*.md'))]


def refresh(only: str | pathlib.Path | None = None, root: pathlib.Path = REPO_ROOT) -> list[pathlib.Path]:
  """Rewrites the headline blocks (of `only`'s file, if given) from their result files; returns the pages changed."""
  only_path = None if only is None else pathlib.Path(only).resolve()
  changed, sentences = [], {}  # A file's headline, read once for every page that quotes it.
  for page in pages(root):
    text = page.read_text()

    def block(match: re.Match) -> str:
      path = match.group('path')
      if (only_path is not None and (root / path).resolve() != only_path) or path not in HEADLINES:
        return match.group(0)
      if path not in sentences:
        sentences[path] = sentence(path)
      return f'<!-- headline: {path} -->{sentences[path]}<!-- /headline -->'

    new = _BLOCK.sub(block, text)
    if new != text:
      page.write_text(new)
      changed.append(page)
  return changed
