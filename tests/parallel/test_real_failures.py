"""Real failures of a job of 2 processes on 127.0.0.1 (the tiny config), restarted by `experiments.launch`.

Each process is SIGKILLed by the launcher when it reaches a given step (deterministic, and a real kill): process 1
first, then process 0 after the restart. Full recovery must end with exactly the model of the run that never
failed; partial recovery must leave the survivors' state where it was and count what the dead process lost.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from shadowsync_jax.parallel import children
from shadowsync_jax.parallel import history
from shadowsync_jax.recovery import schedule

pytestmark = pytest.mark.xdist_group('jobs')  # Jobs of real processes run one at a time (pytest.ini).

REPO = pathlib.Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 600  # Only reached when something hangs.
STEPS = 128  # The tiny config's 65,536 examples on 4 replicas of batch 128.
EVERY = 16  # Checkpoint interval (explicit: the tests check where restores land).


def _launch(workdir: pathlib.Path, *flags: str, launcher_flags: tuple[str, ...] = ()) -> tuple[int, str]:
  command = [
    sys.executable,
    '-m',
    'experiments.launch',
    '--num_processes=2',
    '--cpu_devices=2',
    '--peer_timeout_s=10',
    '--grace_s=30',
    *launcher_flags,
    '--',
    f'--workdir={workdir}',
    '--config=experiments/configs/default.py:tiny',
    '--config.num_replicas=4',
    f'--config.recovery.checkpoint_every_steps={EVERY}',
    '--config.train.progress_every_s=100',
    *flags,
  ]
  result = subprocess.run(
    command,
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': str(REPO)},
    capture_output=True,
    text=True,
    timeout=JOB_TIMEOUT_S,
    check=False,
  )
  return result.returncode, result.stdout + result.stderr


def _starts(workdir: pathlib.Path, generation: int) -> dict[int, dict]:
  return {r['process']: r for r in history.read(workdir) if r.get('event') == 'start' and r['generation'] == generation}


_SHARDED_FR_MA = ('--config.sync.algorithm=fr_ma', '--config.sync.embedding_placement=sharded')


@pytest.fixture(scope='module')
def failure_free(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('failure_free')
  code, output = _launch(workdir, *_SHARDED_FR_MA, '--config.recovery.mode=full')
  assert code == 0, output[-3000:]
  return json.loads((workdir / 'summary.json').read_text())


@pytest.mark.slow  # Three starts of a 2-process job.
def test_full_recovery_from_killing_process_1_then_process_0_ends_with_the_failure_free_model(tmp_path, failure_free):
  """The tables sharded over both processes, so each death loses real shards and leaves the survivor stuck in a
  lookup's collective until the launcher stops it: both restart from the newest checkpoint both have, each
  restoring its own shards, and end with the model of the run that never failed (which saved whole checkpoints).
  Checkpoints here are incremental: differentials of the initial state, never written (kept from adding up to a new
  baseline: the tiny tables' rows nearly all change between two saves), each restore the initial state built again
  and one differential over it. (A kill in a baseline's write, and its restore: tests/recovery/test_recovery.py, in
  one process.)"""
  # 'auto': the first start probes, its restarts dispatch the K it chose (and end bit for bit with the failure-free
  # run's K of 16: blocks change no result).
  auto = ['--config.train.steps_per_dispatch=auto']
  # A compilation cache of its own: the first start compiles its programs and keeps them (`program_store`; the
  # suite's cache would have them already, and an executable it loads is not kept), and the restarts load them,
  # neither traced nor lowered again.
  own_cache = [f'--compilation_cache_dir={tmp_path / "cache"}']
  code, output = _launch(
    tmp_path,
    *_SHARDED_FR_MA,
    '--config.recovery.mode=full',
    '--config.recovery.incremental=true',
    '--config.recovery.rebaseline_fraction=1000',
    *auto,
    *own_cache,
    # Both at a checkpoint step: the kills land in the middle of its save's write (a differential held unfinished),
    # so that save is never restored and the steps since the one before are trained again.
    launcher_flags=('--max_restarts=2', '--kill_at=1@48,0@96'),
  )
  assert code == 0, output[-4000:]
  assert '[launch] process 1 was killed by SIGKILL at step 48' in output, output[-4000:]
  assert '[launch] process 0 was killed by SIGKILL at step 96' in output, output[-4000:]
  assert '[launch] all 2 processes succeeded after 2 restarts.' in output
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['num_failures'] == 2 and summary['recovery']['num_restarts'] == 2, summary['recovery']
  assert [(f['process'], f['step']) for f in summary['recovery']['failures']] == [(1, 48), (0, 96)]
  rewound = []  # Steps each restore went back past its kill.
  for generation, killed_at in ((1, 48), (2, 96)):
    starts = _starts(tmp_path, generation)
    # Both processes restore the newest complete checkpoint both have (a save cut short is none); the data rewinds.
    cut = starts[0]['restored_step']
    assert all(s['restored'] == 'checkpoint' and s['restored_step'] == s['position'] == cut for s in starts.values())
    assert cut == killed_at - EVERY, starts
    # No later plan can go back past the cut: each process keeps it alone (older ones once piled up on restarts).
    assert all(s['checkpoints_kept'] == [cut] for s in starts.values()), starts
    rewound.append(killed_at - cut)
  retrained = summary['recovery']['retrained_steps']
  # Every process of the job trains the rewound steps again (their steps are collectives: the survivor had trained
  # as far as the dead one), and a survivor also what it trained past the kill before it stopped.
  assert retrained >= 2 * sum(rewound) and summary['actual_pls'] == 0.0, (retrained, rewound)
  # CPR's split: saves, restores and the rewound steps apart from the two restarts, each a share of the steps' time.
  costs = summary['recovery']['overhead_s']
  assert costs['save_s'] > 0 and costs['restore_s'] > 0 and costs['restart_s'] > 0
  assert (costs['retrained_s'] > 0) == (retrained > 0)
  assert summary['recovery_checkpoint_overhead_pct'] == pytest.approx(
    100 * costs['checkpoint_s'] / costs['failure_free_s']
  )
  assert summary['recovery_restart_overhead_pct'] == pytest.approx(100 * costs['restart_s'] / costs['failure_free_s'])
  # What ran beside the steps, read by the launcher: each start's threads by name, the standby beside each start
  # but the last (none after it), and when each start was back at its pace.
  records = history.read(tmp_path)
  generations = [r for r in records if r.get('event') == 'generation']
  assert [r['generation'] for r in generations] == [0, 1, 2]
  assert all('main' in cpu for r in generations for cpu in r['cpu_while_training']), generations
  assert any('block-reader' in cpu for r in generations for cpu in r['cpu_while_training'])  # Named for the OS.
  assert [len(r['standby_beside_cpu_s']) for r in generations] == [2, 2, 0]  # --max_restarts=2: no third.
  # Their imports so far: none yet is possible where a standby waits at the lowest priority on busy cores.
  assert all(r['standby_waited_idle'] == children.standby_waits_idle() for r in generations)
  assert all(seconds >= 0 for r in generations[:2] for seconds in r['standby_beside_cpu_s']), generations
  paced = {(r['generation'], r['process']) for r in records if r.get('event') == 'paced'}
  assert paced == {(g, p) for g in range(3) for p in range(2)}
  chosen = [(r['generation'], r['steps_per_dispatch']) for r in records if r.get('event') == 'steps_per_dispatch']
  assert chosen == [(0, summary['steps_per_dispatch'])], chosen  # By the first start's probe; no restart again.
  # Nothing lost, nothing trained twice: bit for bit the model of the run that never failed.
  assert summary['consensus_fingerprint_per_process'] == failure_free['consensus_fingerprint_per_process']
  assert summary['eval_ne'] == failure_free['eval_ne'] and summary['train_steps'] == STEPS
  assert all(n > 0 for n in summary['checkpoint_saves']), summary
  assert summary['checkpoint_baselines'] == [0, 0], summary
  assert summary['incremental'] == [True, True] and failure_free['incremental'] == [False, False]
  # Process 0's last start: the state builder (a restore over the initial state) and its block.
  assert sorted(summary['programs_loaded']) == ['block', 'initial_state'], summary


@pytest.mark.slow  # Three starts of a 2-process job.
def test_partial_recovery_keeps_the_survivors_state_and_loses_only_the_dead_process_updates(tmp_path):
  code, output = _launch(
    tmp_path,
    '--config.sync.algorithm=shadow_ma',
    '--config.sync.min_interval_s=0.05',
    '--config.recovery.mode=partial',
    launcher_flags=('--max_restarts=2', '--kill_at=1@40,0@90'),
  )
  assert code == 0, output[-4000:]
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['num_failures'] == 2 and summary['recovery']['num_restarts'] == 2, summary['recovery']
  lost = {r['generation']: r for r in history.read(tmp_path) if r.get('event') == 'peer_lost'}
  # The kills land in the order listed, whichever process is ahead (their steps are not collectives, and on a
  # loaded machine one process can be far behind the other: process 0 once reached 90 while process 1 was at 25):
  # a process at its kill step before the kills listed before its own waits there (`KillSchedule.is_next`).
  failures = [(f['process'], f['step']) for f in summary['recovery']['failures']]
  assert failures == [(1, 40), (0, 90)], failures
  skipped = 0
  for generation, (dead, killed_at) in enumerate(failures, start=1):
    survivor = 1 - dead
    starts, before = _starts(tmp_path, generation), _starts(tmp_path, generation - 1)
    stopped = lost.get(generation - 1)
    if stopped is None:
      # The survivor had trained its whole stream (and saved it) before its peer died, and starts again where it
      # ended (their steps are not coupled: on a loaded machine one process ran from 40 to 128 while the other,
      # slowed, went from 25 to 90).
      assert starts[survivor]['position'] == starts[survivor]['restored_step'] == STEPS, starts
      assert starts[survivor]['restored'] == 'checkpoint', starts
    else:
      # The survivor saved its live state and goes on from where it was: its step counter did not go back. It
      # restores the newest of its states: its live state of its last step, or where its devices were stuck behind
      # the dead peer's collective, its newest host copy (a fraction of a second old) or its newest checkpoint.
      assert stopped['process'] == survivor and stopped['live_saved'], lost
      assert starts[survivor]['position'] == stopped['step'] > before[survivor]['position'], starts
      if starts[survivor]['restored'] == 'live':
        assert starts[survivor]['restored_step'] == stopped['live_step'], starts
      else:  # A checkpoint newer than its stuck host copy.
        restored_step = starts[survivor]['restored_step']
        assert restored_step % EVERY == 0 and restored_step > stopped['live_step'], starts
    # The dead process reloads its newest saved state and goes on from where it died: nobody rewinds. That is its
    # newest checkpoint, or the live state it saved as the survivor of the death before when that is newer (seen
    # once: process 0 ran ahead to 80 while process 1 died at 40, then died at 90, before its checkpoint of 96).
    assert starts[dead]['position'] == killed_at, starts
    restored_step = starts[dead]['restored_step']
    if starts[dead]['restored'] == 'live':
      saved_as_survivor = lost.get(generation - 2)
      assert saved_as_survivor is not None and saved_as_survivor['process'] == dead, (starts, lost)
      assert restored_step == saved_as_survivor['live_step'] > killed_at - 2 * EVERY, (starts, lost)
    else:
      assert starts[dead]['restored'] == 'checkpoint', starts
      assert restored_step % EVERY == 0 and killed_at - 2 * EVERY < restored_step < killed_at, starts
    skipped += sum(s['position'] - s['restored_step'] for s in starts.values())
  assert summary['recovery']['skipped_steps'] == skipped and summary['recovery']['retrained_steps'] == 0
  assert summary['actual_pls'] == pytest.approx(skipped / (2 * STEPS)) and summary['actual_pls'] > 0
  assert summary['train_steps'] == STEPS and 0 < summary['eval_ne'] < 1.0
  fingerprints = summary['consensus_fingerprint_per_process']
  assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]


@pytest.mark.slow  # Two starts of a 2-process job.
def test_a_survivor_that_trained_its_whole_stream_saves_its_last_step_when_its_peer_dies(tmp_path):
  """Process 1 is a straggler (5 times slower from its third block on) and dies at 112: process 0 has trained all
  its steps and waits for it at the end (serving it shadow rounds), so its training thread never reaches another
  boundary; it saves the state of its last step, not nothing (CI once: such a survivor went back to its checkpoint),
  and restarts from it."""
  code, output = _launch(
    tmp_path,
    '--config.sync.algorithm=shadow_ma',
    '--config.sync.min_interval_s=0.05',
    '--config.recovery.mode=partial',
    '--config.straggler.process=1',
    '--config.straggler.slowdown=5',
    '--config.straggler.warmup_steps=0',
    '--config.straggler.calibration_steps=1',
    launcher_flags=('--max_restarts=1', '--kill_at=1@112'),
  )
  assert code == 0, output[-4000:]
  (lost,) = [r for r in history.read(tmp_path) if r.get('event') == 'peer_lost']
  assert (lost['process'], lost['step'], lost['live_step']) == (0, STEPS, STEPS), lost
  starts = _starts(tmp_path, 1)
  assert (starts[0]['restored'], starts[0]['restored_step'], starts[0]['position']) == ('live', STEPS, STEPS), starts
  assert starts[1]['position'] == 112 and starts[1]['restored'] == 'checkpoint', starts
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['num_failures'] == 1 and summary['train_steps'] == STEPS, summary['recovery']


@pytest.mark.slow  # Two starts of a 2-process job.
def test_cpr_mfu_on_sharded_tables_restores_only_the_dead_process_shards_and_nobody_rewinds(tmp_path):
  """Process 0 (the one that writes summary.json) holds half of every table's rows and dies: it restores its own
  shards from its checkpoint and, newer, its shards' most used rows from its priority save; process 1 keeps its
  live shards and replicas. Both go on from where the job stopped, together (their steps are collectives).
  Checkpoints are incremental, so the live states are differentials over their baseline (the initial state)."""
  code, output = _launch(
    tmp_path,
    *_SHARDED_FR_MA,
    '--config.recovery.mode=cpr_mfu',
    '--config.recovery.incremental=true',
    '--config.recovery.rebaseline_fraction=1000',
    f'--config.recovery.priority_every_steps={EVERY // 4}',  # Every one saved (0: paced by their cost).
    '--config.recovery.live_max_overhead=1',  # Live copies as often as their cost allows,
    '--config.recovery.target_pls=0.001',  # and their PLS needs: every 3 steps (at 0.01 the checkpoints would do).
    # Then process 1, two steps after the job came back: two deaths close together.
    launcher_flags=('--max_restarts=2', '--kill_at=0@40,1@44'),
  )
  assert code == 0, output[-4000:]
  assert '[launch] process 0 was killed by SIGKILL at step 40' in output, output[-4000:]
  assert '[launch] process 1 was killed by SIGKILL at step 44' in output, output[-4000:]
  starts = _starts(tmp_path, 1)
  dead, survivor = starts[0], starts[1]
  assert survivor['restored'] == 'live' and dead['restored'] == 'checkpoint', starts
  assert dead['position'] == survivor['position'] >= 40, starts  # Nobody rewinds; lock-step: one position.
  # The survivor's live copy is of step 32 or newer: copies go no more often than their cost allows (one at a time,
  # `recovery.live_state`), and on a loaded machine (the full suite on 2 cores) the copy of step 32 was the newest
  # once when process 0 died at 40.
  assert dead['restored_step'] == 32 and survivor['restored_step'] >= 32, starts
  # Priority saves every EVERY / 4 steps: the newest before the position, newer than the checkpoint.
  assert dead['priority_rows_step'] is not None and 32 < dead['priority_rows_step'] <= dead['position'], dead
  assert dead['priority_rows_step'] % (EVERY // 4) == 0
  # The survivor's live state: of its last step, or its newest host copy, over which its newer priority rows go.
  assert survivor['priority_rows_step'] is None or survivor['priority_rows_step'] > survivor['restored_step']
  # Process 1's turn: it restores its newest own state (the live state it saved when process 0 died, newer than
  # its checkpoint; its priority save of step 44, cut short by the kill, is none); process 0 its live state.
  again = _starts(tmp_path, 2)
  assert again[0]['restored'] == 'live' and again[0]['position'] == again[1]['position'] >= 44, again
  assert again[1]['restored_step'] >= 32 and again[1]['position'] > again[1]['restored_step'], again
  assert again[1]['priority_rows_step'] is None or again[1]['priority_rows_step'] > again[1]['restored_step']
  summary = json.loads((tmp_path / 'summary.json').read_text())
  skipped = sum(s['position'] - s['restored_step'] for g in (1, 2) for s in _starts(tmp_path, g).values())
  assert summary['recovery']['num_restarts'] == 2
  assert summary['recovery']['skipped_steps'] == skipped and summary['recovery']['retrained_steps'] == 0
  assert summary['actual_pls'] == pytest.approx(skipped / (2 * STEPS)) and summary['train_steps'] == STEPS
  assert summary['recovered_as'] == 'cpr_mfu' and 0 < summary['eval_ne'] < 1.0


def test_without_restarts_a_killed_process_fails_the_job_naming_each_failure(tmp_path):
  code, output = _launch(
    tmp_path, '--config.sync.algorithm=shadow_ma', launcher_flags=('--max_restarts=0', '--kill_at=1@20')
  )
  assert code == 128 + 9, output[-3000:]  # The exit status of the failure: SIGKILL.
  assert '[launch] process 1 was killed by SIGKILL at step 20 (--kill_at).' in output, output[-3000:]
  assert (
    '[launch] FAILED: the job failed 1 time and --max_restarts=0 allows no more restarts: generation 0: '
    'process 1 was killed by SIGKILL at step 20 (--kill_at).' in output
  ), output[-3000:]
  assert 'Traceback' not in output, output[-3000:]


@pytest.fixture(scope='module')
def killed_without_restarts(tmp_path_factory):
  """A partial-recovery job whose process 1 was killed at step 40 and not restarted: checkpoints of steps 16 and 32
  on disk, process 0's live state."""
  workdir = tmp_path_factory.mktemp('killed')
  code, output = _launch(
    workdir,
    '--config.sync.algorithm=shadow_ma',
    '--config.recovery.mode=partial',
    launcher_flags=('--max_restarts=0', '--kill_at=1@40'),
  )
  assert code == 128 + 9, output[-3000:]
  return workdir


def _restarted_after(damage, workdir: pathlib.Path, killed: pathlib.Path) -> tuple[int, str]:
  shutil.copytree(killed, workdir, dirs_exist_ok=True)
  damage(workdir / 'checkpoints' / 'process_1')
  return _launch(
    workdir,
    '--config.sync.algorithm=shadow_ma',
    '--config.recovery.mode=partial',
    launcher_flags=('--max_restarts=3',),
  )


def test_a_restart_that_finds_a_checkpoint_gone_stops_naming_it(tmp_path, killed_without_restarts):
  code, output = _restarted_after(
    lambda d: [shutil.rmtree(step) for step in d.iterdir()], tmp_path, killed_without_restarts
  )
  assert code == 3, output[-3000:]
  # Its newest checkpoint known complete: 32, or 16 where the write of 32 was still going on at the kill.
  assert re.search(r'error: process 1 completed a checkpoint of step (16|32) in \S+, and it is gone', output), output
  assert '[launch] FAILED: process 1 cannot restore what its restart needs' in output
  assert 'restart 1 of' not in output and 'Traceback' not in output, output[-3000:]


def test_a_restart_that_finds_a_checkpoint_truncated_stops_naming_it(tmp_path, killed_without_restarts):
  newest = []

  def truncate(directory):  # Its newest complete checkpoint (32, or 16 where the kill cut the write of 32 short).
    newest.append(max(int(step.name) for step in directory.iterdir() if step.name.isdigit()))
    for path in (directory / str(newest[0])).rglob('*'):
      if path.is_file() and path.stat().st_size > 64:
        with open(path, 'r+b') as file:
          file.truncate(path.stat().st_size // 2)

  code, output = _restarted_after(truncate, tmp_path, killed_without_restarts)
  assert code == 3, output[-3000:]
  assert f'error: process 1 cannot read its checkpoint of step {newest[0]} in ' in output, output[-3000:]
  assert '[launch] FAILED: process 1 cannot restore what its restart needs' in output


def test_full_recovery_calibrates_its_interval_on_a_differential_then_on_the_mean_of_its_saves(tmp_path):
  """The calibration's save is already a differential (over the initial state: nothing whole is written first), so
  Young's interval comes from a differential's cost, on every process alike (one exchange); every
  `RECALIBRATE_EVERY` checkpoints it is computed again from their mean blocking (one exchange each, a name each),
  and every save falls on the interval then in force."""
  code, output = _launch(
    tmp_path,
    *_SHARDED_FR_MA,
    '--config.recovery.mode=full',
    '--config.recovery.checkpoint_every_steps=0',  # Calibrated.
    '--config.recovery.mtbf_steps=2',  # Short intervals: enough saves for a recalibration in the tiny run.
    '--config.recovery.incremental=true',
    '--config.recovery.rebaseline_fraction=1000',
    launcher_flags=('--max_restarts=0',),
  )
  assert code == 0, output[-3000:]
  calibrations = [r for r in history.read(tmp_path) if r.get('event') == 'calibration']
  assert len(calibrations) >= 2 and all(c['differential'] for c in calibrations), calibrations
  assert [c['saves'] for c in calibrations[1:]] == [
    schedule.RECALIBRATE_EVERY * (i + 1) for i in range(len(calibrations) - 1)
  ], calibrations
  saves = [r for r in history.read(tmp_path) if r.get('event') == 'save']
  assert {r['written'] for r in saves if r['kind'] == 'checkpoint'} == {'differential'}, saves
  checkpoints = [r['step'] for r in saves if r['kind'] == 'checkpoint' and r['process'] == 0 and r['step'] < STEPS]
  for calibration, after in zip(calibrations, calibrations[1:] + [{'step': STEPS}]):
    start = calibration.get('step') or next(r['step'] for r in saves if r['kind'] == 'calibration')
    steps = [step for step in checkpoints if start < step <= after['step']]
    assert steps and all(step % calibration['interval'] == 0 for step in steps), (steps, calibration)
  assert summary_of(tmp_path)['checkpoint_interval_steps'] == calibrations[-1]['interval']


def summary_of(workdir: pathlib.Path) -> dict:
  return json.loads((workdir / 'summary.json').read_text())
