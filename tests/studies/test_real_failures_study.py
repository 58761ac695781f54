"""The real-failures study's job runner: a run that ended keeps what the tables read and drops its saved state."""

import json

import pytest

from shadowsync_jax.parallel import history
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import real_failures


def test_a_run_that_ended_keeps_its_summary_and_history_and_drops_its_saved_state(tmp_path, monkeypatch):
  workdir = tmp_path / 'full_seed0'

  def fake_launch(workdir, launch_flags, train_flags):
    for name in real_failures.SAVED_STATE:
      (workdir / name / 'process_0').mkdir(parents=True)
      (workdir / name / 'process_0' / 'state').write_text('x')
    # Process 0 wrote a baseline, then a differential of a tenth of its rows (over two starts); a priority save
    # is no checkpoint.
    for generation, written, rows, num_bytes in ((0, 'baseline', 1000, 4e6), (1, 'differential', 100, 2e6)):
      record = {'event': 'save', 'kind': 'checkpoint', 'process': 0, 'generation': generation, 'written': written}
      history.append(
        workdir, 'process_0', {**record, 'rows_written': rows, 'rows_held': 1000, 'bytes_written': num_bytes}
      )
    history.append(workdir, 'process_0', {'event': 'save', 'kind': 'priority', 'process': 0, 'generation': 1})
    (workdir / 'summary.json').write_text(json.dumps({'eval_ne': 0.9}))
    return jobs.Job({'eval_ne': 0.9}, wall_s=3.0, peak_rss_bytes=1, error=None)

  monkeypatch.setattr(real_failures.jobs, 'launch', fake_launch)
  workdir.mkdir(parents=True)  # A run cut short left its files: the job starts in an emptied workdir.
  (workdir / 'metrics.jsonl').write_text('{}')
  summary = real_failures.run_job(workdir, [], [])
  assert summary == {
    'eval_ne': 0.9,
    'job_wall_s': 3.0,
    'job_peak_rss_bytes': 1,
    'checkpoint_writes': {'0': {'whole': 0, 'baseline': 1, 'differential': 1}},
    'rows_written_share': [0.55],
    'mb_written_per_s': [2.0],
  }
  assert sorted(p.name for p in workdir.iterdir()) == ['history', real_failures.ROW_FILE, 'summary.json']
  # A study that goes on (`reuse`) reads the row of a run that ended, and runs it again only without `reuse`.
  monkeypatch.setattr(real_failures.jobs, 'launch', lambda *args: pytest.fail('a run that ended was run again'))
  assert real_failures.run_job(workdir, [], [], reuse=True) == summary


def test_whole_checkpoints_are_a_mode_suffix():
  assert real_failures.mode_flags('full') == ['--config.recovery.mode=full']
  assert real_failures.mode_flags('full:whole') == [
    '--config.recovery.mode=full',
    '--config.recovery.incremental=false',
  ]


def test_what_no_part_explains_is_the_wall_overhead_less_every_counted_part():
  reference = {'job_wall_s': 100.0}
  split = {'checkpoint_s': 6.0, 'restart_s': 3.0, 'slower_s': 0.5, 'edges_s': -1.0}
  row = {'job_wall_s': 110.0, 'overhead_s': split}
  assert real_failures.unexplained_s(row, reference) == pytest.approx(10.0 - 6.0 - 3.0 - 0.5 + 1.0)
  assert real_failures.unexplained_share(row, reference) == pytest.approx(0.15)
  assert real_failures.unexplained_s({'job_wall_s': 110.0, 'overhead_s': {}}, reference) is None


def test_a_ratio_to_full_recovery_reads_only_against_a_full_run_that_cost_something():
  """A full run that met no failure can end no slower than the reference (-0.3% once): a mode's ratio over it read
  -8.7 and pulled the mean over the seeds below zero. Such a seed has no ratio; the others keep theirs."""
  rows = [
    {'mode': mode, 'kill_seed': seed, 'overhead_pct': wall, 'checkpoint_overhead_pct': 10.0}
    for mode, seed, wall in [('full', 0, 20.0), ('partial', 0, 10.0), ('full', 1, -0.3), ('partial', 1, 2.6)]
  ]
  assert [real_failures.vs_full(r, rows, wall=True) for r in rows[1::2]] == [0.5, None]
  assert real_failures.vs_full(rows[3], rows) == 1.0  # Its checkpoint-related overhead, above zero, still reads.
