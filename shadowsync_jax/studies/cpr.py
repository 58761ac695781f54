"""The CPR study: one training run per recovery mode, on the same data and the same failure schedule, in a table.

  from experiments.configs import recovery
  from shadowsync_jax.studies import cpr
  rows = cpr.run(recovery.get_config(), root='/tmp/cpr')   # no failures, full, partial, cpr_mfu, cpr_ssu, cpr
  print(cpr.table(rows))

Every run trains the same config but `recovery.mode`; the failure schedule depends on the seed, the MTBF and the
part counts only, so every mode meets the same failures at the same steps (full recovery meets more of them: its
clock runs on through the steps it trains again). The no-failure run saves no checkpoint but the final one: its
time is the failure-free time, and its eval NE the reference. Overhead columns are each run's own accounts
(`recovery.Account`) over its own failure-free step time, so they compare within one study run even on a loaded
machine; wall time is shown beside them as a cross-check.
"""

import copy
import pathlib
from typing import Any

import ml_collections

from shadowsync_jax import train

MODES = ('none', 'full', 'partial', 'cpr_mfu', 'cpr_ssu', 'cpr')


def config_for(base: ml_collections.ConfigDict, mode: str) -> ml_collections.ConfigDict:
  """`base` with `recovery.mode = mode`; the no-failure run checkpoints only at the end."""
  config = copy.deepcopy(base)
  config.recovery.mode = mode
  if mode == 'none':
    config.train.checkpoint_every_steps = 0
  return config


def run(base: ml_collections.ConfigDict, root: str | pathlib.Path, modes: tuple[str, ...] = MODES) -> list[dict]:
  """Trains `base` once per mode in `root/<mode>`; returns the summaries, each with its 'label'."""
  rows = []
  for mode in modes:
    print(f'--- recovery.mode={mode}', flush=True)
    summary = train.train_and_evaluate(config_for(base, mode), pathlib.Path(root) / mode)
    label = {'none': 'no failures', 'cpr': f'cpr (as {summary.get("recovered_as")})'}.get(mode, mode)
    rows.append({**summary, 'label': label})
  return rows


def _pct(value: float | None) -> str:
  return '' if value is None else f'{value:.2f}%'


def _share(row: dict, key: str) -> str:
  details = row.get('recovery') or {}
  if not details.get('failure_free_s'):
    return ''
  return _pct(100 * details[key] / details['failure_free_s'])


def table(rows: list[dict[str, Any]]) -> str:
  """A markdown table of the runs (NE against the run without failures, or else full recovery's) and a line of
  settings."""
  # Without a failure-free run, full recovery's: it ends with exactly the failure-free model.
  reference = next(
    (r for r in rows if r['recovery_mode'] == 'none'), next((r for r in rows if r['recovery_mode'] == 'full'), None)
  )
  full = next((r for r in rows if r['recovery_mode'] == 'full'), None)
  lines = [
    '| run | eval NE | NE vs no failures | failures | checkpoint every | priority every | blocked on saves | '
    're-trained | restores | row counting | **overhead** | overhead / full | estimated PLS | actual PLS | '
    'lost lookups | wall s |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    details = r.get('recovery') or {}
    failure_free = r['recovery_mode'] == 'none'
    ne_vs = '' if reference is None else f'{100 * (r["eval_ne"] / reference["eval_ne"] - 1):+.3f}%'
    saves = (
      ''
      if failure_free
      else _pct(
        100 * (details['blocked_on_saves_s'] + details['blocked_on_priority_saves_s']) / details['failure_free_s']
      )
    )
    vs_full = ''
    if full is not None and not failure_free and full['recovery_overhead_pct']:
      vs_full = f'{r["recovery_overhead_pct"] / full["recovery_overhead_pct"]:.2f}'
    pls = lambda key, r=r: '' if r[key] is None else f'{r[key]:.4f}'
    lines.append(
      ' | '.join(
        [
          f'| {r["label"]}',
          f'{r["eval_ne"]:.5f}',
          ne_vs,
          str(r['num_failures']),
          '' if failure_free else str(r['checkpoint_interval_steps']),
          str(details.get('priority_interval_steps') or ''),
          saves,
          _share(r, 'retrained_s'),
          _share(r, 'restore_s'),
          _share(r, 'row_counting_s'),
          f'**{_pct(r["recovery_overhead_pct"])}**' if r['recovery_overhead_pct'] is not None else '',
          vs_full,
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
        f'full: save cost {details["save_cost_steps"]:.1f} steps ({details["save_cost"]}), '
        f'mean restore {details["mean_restore_s"] or 0:.3f} s, mean step '
        f'{1e3 * details["mean_step_s"]:.2f} ms, expected overhead '
        f'{details.get("expected_overhead_pct", float("nan")):.1f}%'
      )
  if reference is not None and reference.get('bayes_ne'):
    settings.append(f'Bayes NE floor {reference["bayes_ne"]:.4f}')
  return '\n'.join(lines) + '\n\n' + '; '.join(settings) + '.'
