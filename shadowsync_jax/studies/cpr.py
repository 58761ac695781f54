"""The CPR study: one training run per recovery mode, on the same data and the same failure schedule, in a table.

  from experiments.configs import recovery
  from shadowsync_jax.studies import cpr
  rows = cpr.run(recovery.get_config(), root='/tmp/cpr', seeds=(0, 1, 2))   # each seed: no failures, full, ...
  print(cpr.table(rows))          # each mode over the seeds (mean, range), then every run
  modes = cpr.by_mode(rows)       # {'full': {'overhead_pct': ..., 'overhead_pct_range': [lo, hi], ...}, ...}

Every run of a seed trains the same config but `recovery.mode`; the failure schedule depends on the seed, the MTBF
and the part counts only, so every mode of a seed meets the same failures at the same steps (full recovery meets
more of them: its clock runs on through the steps it trains again). A seed also sets the data and the initial
model, so a mode is compared with the runs of its own seed: the no-failure run (which saves no checkpoint but the
final one: its time is the failure-free time, and its eval NE the reference) and full recovery. Overhead columns
are each run's own accounts (`recovery.Account`) over its own failure-free step time, so they compare within one
study run even on a loaded machine; wall time is shown beside them as a cross-check.
"""

import copy
import pathlib
from typing import Any

import ml_collections

from shadowsync_jax import train
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import result_files
from shadowsync_jax.studies import spread

MODES = ('none', 'full', 'partial', 'cpr_mfu', 'cpr_ssu', 'cpr')


def config_for(base: ml_collections.ConfigDict, mode: str) -> ml_collections.ConfigDict:
  """`base` with `recovery.mode = mode`; the no-failure run checkpoints only at the end."""
  config = copy.deepcopy(base)
  config.recovery.mode = mode
  if mode == 'none':
    config.train.checkpoint_every_steps = 0
    config.train.checkpoint_every_s = 0.0
  return config


def run(
  base: ml_collections.ConfigDict,
  root: str | pathlib.Path,
  modes: tuple[str, ...] = MODES,
  seeds: tuple[int, ...] | None = None,
) -> list[dict]:
  """Trains `base` once per seed (default: its own) and mode in `root/seed_<seed>/<mode>`, each emptied first (a
  study measures whole runs: one run again in a used root resumed its finished checkpoint and trained nothing);
  returns the summaries, each with its 'label' and 'seed'."""
  rows = []
  for seed in seeds if seeds is not None else (base.seed,):
    for mode in modes:
      print(f'--- seed={seed} recovery.mode={mode}', flush=True)
      config = config_for(base, mode)
      config.seed = seed
      summary = train.train_and_evaluate(config, jobs.fresh(pathlib.Path(root) / f'seed_{seed}' / mode))
      label = {'none': 'no failures', 'cpr': f'cpr (as {summary.get("recovered_as")})'}.get(mode, mode)
      rows.append({**summary, 'label': label, 'seed': seed})
  return rows


def _reference(rows: list[dict[str, Any]], seed: int | None) -> dict[str, Any] | None:
  """A seed's NE reference: its run without failures, or else its full recovery (which ends with exactly the
  failure-free model)."""
  same = [r for r in rows if r.get('seed') == seed]
  return next((r for r in same if r['recovery_mode'] == 'none'), _full(rows, seed))


def _full(rows: list[dict[str, Any]], seed: int | None) -> dict[str, Any] | None:
  return next((r for r in rows if r.get('seed') == seed and r['recovery_mode'] == 'full'), None)


def ne_vs_reference_pct(row: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
  """A run's eval NE over its seed's reference, in % (None: no reference)."""
  reference = _reference(rows, row.get('seed'))
  return None if reference is None else 100 * (row['eval_ne'] / reference['eval_ne'] - 1)


def overhead_vs_full(row: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
  """A run's overhead over full recovery's on the same seed (None: no such run, or no overhead)."""
  full = _full(rows, row.get('seed'))
  if full is None or not full['recovery_overhead_pct'] or row['recovery_overhead_pct'] is None:
    return None
  return row['recovery_overhead_pct'] / full['recovery_overhead_pct']


def by_mode(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """Per recovery mode (but the run without failures) over its seeds: the mean and range (`<key>_range`: lowest,
  highest) of the overhead (% of the failure-free time, and over full recovery's on the same seed), of the NE's
  difference to its seed's reference, of the failures met and of the actual PLS; `recovered_as` lists what `cpr`
  ran as, a seed each."""

  def figures(runs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {
      'overhead_pct': [r['recovery_overhead_pct'] for r in runs],
      'overhead_vs_full': [overhead_vs_full(r, rows) for r in runs],
      'ne_vs_reference_pct': [ne_vs_reference_pct(r, rows) for r in runs],
      'failures': [r['num_failures'] for r in runs],
      'actual_pls': [r['actual_pls'] for r in runs],
    }

  failed = [r for r in rows if r['recovery_mode'] != 'none']
  modes = spread.by_group(failed, lambda r: r['recovery_mode'], figures)
  for mode, mode_figures in modes.items():
    runs = [r for r in failed if r['recovery_mode'] == mode]
    modes[mode] = {'seeds': [r.get('seed') for r in runs], 'recovered_as': [r.get('recovered_as') for r in runs]}
    modes[mode].update(mode_figures)
  return modes


def _pct(value: float | None) -> str:
  return '' if value is None else f'{value:.2f}%'


def _share(row: dict, key: str) -> str:
  details = row.get('recovery') or {}
  if not details.get('failure_free_s'):
    return ''
  return _pct(100 * details[key] / details['failure_free_s'])


def mode_table(rows: list[dict[str, Any]]) -> str:
  """A markdown table of each recovery mode over its seeds (`by_mode`)."""
  lines = [
    '| mode | seeds | failures | **overhead** | overhead / full (same seed) | NE vs no failures (same seed) | '
    'actual PLS |',
    '|---|---|---|---|---|---|---|',
  ]
  for mode, m in by_mode(rows).items():
    ran_as = [a for a in m['recovered_as'] if a]
    label = f'{mode} (as {", ".join(ran_as)})' if mode == 'cpr' and ran_as else mode
    lines.append(
      f'| {label} | {len(m["seeds"])} | {m["failures"]:.1f} | **{spread.span(m, "overhead_pct", "{:.2f}%")}** | '
      f'{spread.span(m, "overhead_vs_full", "{:.2f}")} | {spread.span(m, "ne_vs_reference_pct", "{:+.3f}%")} | '
      f'{spread.span(m, "actual_pls", "{:.4f}")} |'
    )
  return '\n'.join(lines)


def table(rows: list[dict[str, Any]]) -> str:
  """Markdown: with several seeds each mode over them (`mode_table`); then every run (NE against its seed's run
  without failures, or else its full recovery's; overhead against its seed's full recovery), and a line of
  settings."""
  seeds = list(dict.fromkeys(r.get('seed') for r in rows))
  lines = [mode_table(rows), ''] if len(seeds) > 1 else []
  lines += [
    '| run | eval NE | NE vs no failures | failures | checkpoint every | priority every | blocked on saves | '
    're-trained | restores | row counting | **overhead** | overhead / full | estimated PLS | actual PLS | '
    'lost lookups | wall s |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    details = r.get('recovery') or {}
    failure_free = r['recovery_mode'] == 'none'
    ne_vs = ne_vs_reference_pct(r, rows)
    saves = (
      ''
      if failure_free
      else _pct(
        100 * (details['blocked_on_saves_s'] + details['blocked_on_priority_saves_s']) / details['failure_free_s']
      )
    )
    vs_full = overhead_vs_full(r, rows) if not failure_free else None
    pls = lambda key, r=r: '' if r[key] is None else f'{r[key]:.4f}'
    lines.append(
      ' | '.join(
        [
          f'| {r["label"]}' + (f', seed {r["seed"]}' if len(seeds) > 1 else ''),
          f'{r["eval_ne"]:.5f}',
          '' if ne_vs is None else f'{ne_vs:+.3f}%',
          str(r['num_failures']),
          '' if failure_free else str(r['checkpoint_interval_steps']),
          str(details.get('priority_interval_steps') or ''),
          saves,
          _share(r, 'retrained_s'),
          _share(r, 'restore_s'),
          _share(r, 'row_counting_s'),
          f'**{_pct(r["recovery_overhead_pct"])}**' if r['recovery_overhead_pct'] is not None else '',
          '' if vs_full is None else f'{vs_full:.2f}',
          pls('estimated_pls'),
          pls('actual_pls'),
          '' if failure_free else f'{details["lost_lookup_fraction"]:.4f}',
          f'{r["wall_time_s"]:.0f} |',
        ]
      )
    )
  config = rows[0]['config']
  recovery = config['recovery']
  settings = [
    *([f'seeds {", ".join(map(str, seeds))}'] if len(seeds) > 1 else []),
    f'{config["data"]["num_train_examples"]:,} examples',
    f'{rows[0]["train_steps"]} steps',
    f'{config["num_replicas"]} replica(s), sync {config["sync"]["algorithm"]}',
    f'failures: {recovery["failure_target"]}, MTBF {recovery["mtbf_steps"]:g} steps',
    f'{recovery["num_embedding_shards"]} embedding shards',
    f'target PLS {recovery["target_pls"]:g}',
    f'priority rows {recovery["priority_fraction"]:g}',
    f'SSU sample {recovery["ssu_sample_rate"]:g}',
  ]
  for row in rows:
    details = row.get('recovery') or {}
    if details.get('save_cost_steps') is not None and row['recovery_mode'] == 'full':
      settings.append(
        (f'full, seed {row["seed"]}' if len(seeds) > 1 else 'full')
        + f': save cost {details["save_cost_steps"]:.1f} steps ({details["save_cost"]}), '
        f'mean restore {details["mean_restore_s"] or 0:.3f} s, mean step '
        f'{1e3 * details["mean_step_s"]:.2f} ms, expected overhead '
        f'{details.get("expected_overhead_pct", float("nan")):.1f}%'
      )
  reference = _reference(rows, seeds[0])
  if reference is not None and reference.get('bayes_ne'):
    settings.append(f'Bayes NE floor {reference["bayes_ne"]:.4f}' + (f' (seed {seeds[0]})' if len(seeds) > 1 else ''))
  return '\n'.join(lines) + '\n\n' + '; '.join(settings) + '.'


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): full recovery's overhead, the partial modes' shares of it
  on the same seed, the NE (mean and range over the seeds)."""
  rows = result_files.rows(path)
  modes = by_mode(rows)
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
