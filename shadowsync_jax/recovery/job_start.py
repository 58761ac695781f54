"""What a process of a job restores when it starts: its checkpoints, the restart plan carried out, one clear error
when what the plan needs is gone.

  checkpointer = job_start.make_checkpointer(process, state_bytes, initial, keeps_cuts)
  started = job_start.restore(process, checkpointer, live, plan_mode, abstract, initial, priority_rows_from)
  started.state_L, started.sync_state_R, started.position, started.record   # what it restored, written down

Every process tells the others what it holds (its complete checkpoints, its live states, and from the history the
step each reached), one exchange, and all agree on the plan (`restart_plan`): each restores its live state, a
checkpoint or the initial state (rebuilt from the config's seed), and its stream goes on from the plan's position.
Where everyone went back to a common cut, what lies past it is a lost timeline (deleted), and before it nothing any
plan can need. Where the processes restored different steps, they take one sync state, the furthest one's. CPR-MFU/SSU
take the rows of the newest priority save newer than the checkpoint back too (`priority_saves.newer_rows`). A
restart that would restore a checkpoint older than one its process had completed (the newer one deleted or unreadable
since) raises `UnrecoverableError`: one clear error (exit status 3), never a silent rewind.
"""

from collections.abc import Callable
import json
import pathlib
import time
from typing import Any, NamedTuple

import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import history
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import incremental
from shadowsync_jax.recovery import job_process
from shadowsync_jax.recovery import priority_saves
from shadowsync_jax.recovery import restart_plan

PyTree = Any
Checkpoints = checkpointing.Checkpointer | incremental.IncrementalCheckpointer


class UnrecoverableError(RuntimeError):
  """What this process's restart needs is gone: a checkpoint the job wrote is missing, or cannot be read."""


class Started(NamedTuple):
  """What a start restored: the state, the sync state (job-wide, as the sync drivers hold it), the step the stream
  goes on from, what it wrote down in the history (`record`), and the only checkpoint kept before it, if the plan
  deleted the others."""

  state_L: Any
  sync_state_R: PyTree
  position: int
  record: dict[str, Any]
  kept: list[int] | None


def make_checkpointer(
  process: job_process.JobProcess, state_bytes: int, initial: Callable[[], PyTree], keeps_cuts: bool
) -> Checkpoints:
  """This process's checkpoints: whole, or incremental (`recovery.incremental`; the first baseline the `initial`
  tree, rebuilt and never written), keeping what a restart may need: everything a common cut may need
  (`keeps_cuts`: full recovery, `cpr` and lock-step algorithms); else the two newest."""
  config = process.config
  directory, keep = process.workdir / 'checkpoints', None if keeps_cuts else 2
  # Kills at a save (tests): inside its write, so they land in it every time.
  kills_at = process.control.fd is not None and process.control.kill_at_step
  during = (lambda step: _kill_in_write(process, step)) if kills_at or fault_injection.kills_in_saves() else None
  if not incremental.enabled(config, saves_block=checkpointing.saves_block(state_bytes)):
    return checkpointing.Checkpointer(directory, process.meshes, max_to_keep=keep, during_save=during)
  full = checkpointing.Checkpointer(directory, process.meshes, max_to_keep=None, during_save=during)
  return incremental.IncrementalCheckpointer(
    full,
    process.meshes,
    config.recovery.rebaseline_fraction,
    keep=keep,
    initial=initial,
    settings=_settings(config),
    during_write=during,
  )


def _kill_in_write(process: job_process.JobProcess, step: int) -> None:
  """Inside a save's write (not complete yet): a kill point of this save (`fault_injection.kill_in_save`), or the
  launcher's kill at `step`, asked for and waited for (a peer's death first: the save goes on, this process a
  survivor)."""
  fault_injection.kill_in_save(step, 'writing')
  if step == process.control.kill_at_step:
    process.control.step(step)  # Trained (the save waited for it): the launcher's record of where it died.
  process.control.reached(step, stop_waiting=lambda: distributed.peer_lost() is not None)


def restore(
  process: job_process.JobProcess,
  checkpointer: Checkpoints,
  live: Any,
  plan_mode: str,
  abstract: PyTree,
  initial_tree: Callable[[], PyTree],
  priority_rows_from: pathlib.Path | None,
) -> Started:
  """Restores what the restart plan of `plan_mode` gives this process (`abstract`: the training tree's shapes;
  `initial_tree()`, built only then, on a fresh workdir); `live`: its `live_state.LiveKeeper`, if it keeps one;
  `priority_rows_from`: CPR-MFU/SSU's priority saves, whose newer rows it takes back."""
  index, generation = process.index, process.generation
  reached = history.positions_reached(process.workdir, generation - 1) if generation else {}
  live_steps = live.steps() if live is not None else []
  mine = restart_plan.Holdings(tuple(checkpointer.all_steps()), tuple(live_steps), reached)
  everyone = [restart_plan.Holdings.from_json(h) for h in distributed.exchange('holdings', mine.to_json())]
  plan = restart_plan.plan(plan_mode, process.lock_step, everyone)
  source, restored_step = plan.restore[index]
  position = plan.position[index]
  _check_nothing_went_missing(process, checkpointer, source, mine.checkpoints)
  kept = None
  if plan_mode == 'full' or (plan_mode == 'none' and process.lock_step):
    checkpointer.delete_after(restored_step)  # Everyone went back to a common cut: past it, a lost timeline.
    if source == 'checkpoint':  # Every process restores it: no later plan can go back past it.
      checkpointer.delete_before(restored_step)  # (Left to later saves, a run that fails more often than
      kept = [restored_step]  # each process saves twice kept them all: 6 x 1.1 GB a process at Kaggle size.)
  if source == 'init':
    tree = initial_tree()
    if isinstance(checkpointer, incremental.IncrementalCheckpointer):
      checkpointer.note_initial(tree)  # The differentials over it say which initial state they need.
  started = time.perf_counter()
  if source == 'live':
    try:
      tree = live.restore(restored_step, abstract)
    except checkpointing.MismatchError as error:  # Another run's state: say so.
      raise UnrecoverableError(str(error)) from error
  elif source == 'checkpoint':
    try:
      tree, _ = checkpointer.restore(restored_step, abstract)
    except checkpointing.MismatchError as error:  # Another run's checkpoint: say so, not "damaged".
      raise UnrecoverableError(str(error)) from error
    except Exception as error:  # pylint: disable=broad-except  (whatever a truncated or damaged file raises)
      raise UnrecoverableError(
        f'process {index} cannot read its checkpoint of step {restored_step} in '
        f'{checkpointer.directory} (truncated or damaged?): {type(error).__name__}: {str(error)[:300]}'
      ) from error
  state_L, sync_state_L = tree['train'], tree.get('sync')
  priority_step = None
  if priority_rows_from is not None and position > restored_step:  # Its rows saved since, if any.
    state_L, priority_step = priority_saves.newer_rows(priority_rows_from, state_L, restored_step, position)
  if position != restored_step:  # The replicas go on from the new position: their step counters too.
    counters = np.full(state_L.step.shape, position, state_L.step.dtype)
    state_L = state_L._replace(step=jax.device_put(counters, state_L.step.sharding))
  sync_state_L = _agreed_sync_state(process, sync_state_L, plan)
  jax.block_until_ready((state_L, sync_state_L))
  sync_state_R = None if sync_state_L is None else replicas.to_job(sync_state_L, process.meshes)
  restore_s = time.perf_counter() - started
  record = {
    'checkpoints_kept': checkpointer.all_steps(),  # On disk after the plan's deletions.
    'restored': source,
    'restored_step': restored_step,
    'position': position,
    'restore_s': restore_s,
    'priority_rows_step': priority_step,  # CPR-MFU/SSU: the step of the newer priority save restored, if any.
    'skipped_steps': plan.skipped(index),
    # Where the data rewinds (full recovery), the steps this process had trained past its restore are trained again.
    'retrained_steps': max(0, reached.get(index, position) - position),
  }
  history.append(
    process.workdir, process.writer, {'event': 'start', 'generation': generation, 'process': index, **record}
  )
  if process.count == 1 and source == 'checkpoint' and not generation:
    print(f'Resumed from the checkpoint at step {restored_step} of {process.total_steps} in {process.workdir}.')
  elif source != 'init' or generation:
    what = {'live': 'its live state', 'checkpoint': 'its checkpoint', 'init': 'the initial state'}[source]
    print(
      f'Process {index} restored {what} of step {restored_step}; its stream goes on at step {position} '
      f'({plan_mode} plan, start {generation + 1}).'
    )
  return Started(state_L, sync_state_R, position, record, kept)


def _check_nothing_went_missing(
  process: job_process.JobProcess, checkpointer: Checkpoints, source: str, checkpoints: tuple[int, ...]
) -> None:
  """Raises `UnrecoverableError` where this process restores a checkpoint (not its live state) and the newest
  one it had completed is gone (its files deleted or moved since): the plan would otherwise take it, or under a
  common cut every process, silently back to an older one or to the start."""
  if source == 'live':
    return
  mine = [r for r in history.read(process.workdir) if r.get('writer') == process.writer]
  starts = [i for i, r in enumerate(mine) if r.get('event') == 'start']
  if not starts:  # A fresh workdir.
    return
  before = mine[starts[-1] :]  # This process's previous start (whoever numbered it) and what it saved since.
  complete = [r['complete'] for r in before if r.get('event') in ('save', 'saved') and r.get('complete') is not None]
  complete += [r['restored_step'] for r in before[:1] if r['restored'] == 'checkpoint']
  expected = max(complete, default=None)
  if expected is not None and not any(step >= expected for step in checkpoints):
    raise UnrecoverableError(
      f'process {process.index} completed a checkpoint of step {expected} in {checkpointer.directory}, '
      f'and it is gone (complete checkpoints there now: {checkpointer.all_steps() or "none"}): put it back, '
      'or start the job in a new workdir'
    )


def _agreed_sync_state(process: job_process.JobProcess, sync_state_L: PyTree, plan: restart_plan.Plan) -> PyTree:
  """Where the processes restored different steps, one sync state for all (EA's center, BMUF's global model):
  that of the process furthest on, broadcast once before any round runs."""
  if sync_state_L is None or len(set(step for _, step in plan.restore)) <= 1:
    return sync_state_L
  source = max(range(process.count), key=lambda p: (plan.restore[p][1], -p))
  host = jax.tree.map(np.asarray, sync_state_L)
  agreed = multihost_utils.broadcast_one_to_all(host, is_source=process.index == source)
  return jax.tree.map(lambda x, like: jax.device_put(np.asarray(x), like.sharding), agreed, sync_state_L)


def _settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The run's config as {dotted key: JSON value}: each differential carries it, so that a restore it refuses names
  the settings that differ."""
  flat = {}

  def walk(values: dict[str, Any], prefix: str) -> None:
    for key, value in values.items():
      if isinstance(value, dict):
        walk(value, f'{prefix}{key}.')
      else:
        flat[f'{prefix}{key}'] = value

  walk(config.to_dict(), '')
  return json.loads(json.dumps(flat, default=str))
