"""The real-failures study's job runner: a run that ended keeps what the tables read and drops its saved state."""

import json

from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import real_failures


def test_a_run_that_ended_keeps_its_summary_and_history_and_drops_its_saved_state(tmp_path, monkeypatch):
  workdir = tmp_path / 'full_seed0'

  def fake_launch(workdir, launch_flags, train_flags):
    for name in (*real_failures.SAVED_STATE, 'history'):
      (workdir / name / 'process_0').mkdir(parents=True)
      (workdir / name / 'process_0' / 'state').write_text('x')
    (workdir / 'summary.json').write_text(json.dumps({'eval_ne': 0.9}))
    return jobs.Job({'eval_ne': 0.9}, wall_s=3.0, peak_rss_bytes=1, error=None)

  monkeypatch.setattr(real_failures.jobs, 'launch', fake_launch)
  summary = real_failures.run_job(workdir, [], [])
  assert summary == {'eval_ne': 0.9, 'job_wall_s': 3.0, 'job_peak_rss_bytes': 1}
  assert sorted(p.name for p in workdir.iterdir()) == ['history', 'summary.json']
