"""What real failures cost a job, split as CPR splits it: checkpoint-related time apart from the restarts.

  split = overhead.split(history.read(workdir), step_s=0.0068)
  split['checkpoint_s']   # saves (blocking, and their background work) + restores + work trained again
  split['restart_s']      # from each death to every process training again (and at its pace), its restore left
                          # out; the standbys

Maeng et al. (CPR, MLSys 2021) measure what checkpoints cost a job that fails: the time spent saving them, loading
them, and training again what a rewind lost; a restart's own cost (a process coming back) is the same whatever the
recovery and is kept apart. From the job's history (`parallel.history`), pure:
- saves: every save's blocking time (`save` records: checkpoints, CPR's priority saves, the calibration's save and
  restore), summed per process; the job pays its slowest process's (they save side by side);
- the steps slowed down once at pace: per start and process, from its `paced` record to the end of its training (its
  `ended` record's `trained_at`, or the launcher's time of the start's failure at the step the process had reached:
  `positions`, and half the block in flight), that time less its saves' blocking less those steps at `step_s`
  (half the block in flight at its `paced` boundary counts as trained after it); the slowest process's a start.
  The cause it is charged to is what took the processes' cores beside the steps (each pinned to one, as the
  studies run a job): recovery's own work at the boundaries on the training thread, its saves and live takes left
  out (`boundary_s`, which the process writes down: history, reports, deleting old checkpoints), the CPU of the
  threads that write checkpoints (`WRITE_THREADS`: the differential writer,
  orbax's and tensorstore's), of priority saves (`PRIORITY_THREADS`: the lookup counter and the rows' writer) and
  of live copies (the `live-state` thread, and the takes' own time on the devices, which the process writes down:
  `live_s`), from the launcher's `generation` records (`cpu_while_training`: read from outside, so a process killed
  counts to its last half second), the slowest process's a group. Each group is charged its share of the slowdown,
  at most its CPU (background work that ran while the cores would have idled, the steps waiting for a peer in a
  collective, slowed nothing); what slowed the steps beyond all of it is `slower_s`, slowed steps with no recovery
  work beside them to blame (it may be negative: steps faster than the reference's);
- per failure (the launcher's `failure` record, or else the first `peer_lost` of that start): the restore, the
  slowest process's of the next start (`start` records); the work trained again, the most steps a process of
  the next start was rewound (`retrained_steps`) at `step_s`; and the restart: from the death to the last
  process of the next start saying it trains (`ready` records; or, if that start failed first, to its failure; or,
  if it had nothing left to train, to its restore), less the restore; then its warm-up: from `ready` to `paced`
  (its compiling block and 'auto''s probe), beyond those steps' time at `step_s`; and the warm standbys: the CPU
  the next start's processes took on their cores beside each start, used or not (`standby_beside_cpu_s`: their
  imports, which run as that start warms up: a warm-up counts what is left of it beyond them), unless they waited
  at the lowest priority (`standby_waited_idle`: then they took the cores' idle time).
"""

from collections.abc import Sequence
from typing import Any

from shadowsync_jax.parallel import cpu_time

# `cpu_time` groups: threads that write checkpoints, and priority saves' (OS names: 15 bytes).
WRITE_THREADS = tuple(
  cpu_time.os_name(name)
  for name in (
    'differential-writer',
    'ts_pool_worker',
    'async_save',
    'serialize_shard',
    'save_finalize',
    'write_metadata_',
    'array_type_handler',
    'metadata_store',
  )
)
PRIORITY_THREADS = tuple(cpu_time.os_name(name) for name in ('lookup-counter', 'priority-rows-writer'))
LIVE_THREADS = (cpu_time.os_name('live-state'),)
# The parts charged with the steps' slowdown, by what took the training cores beside them.
BESIDE = ('boundary_s', 'write_s', 'priority_s', 'live_s')
PARTS = (
  'save_s',
  *BESIDE,
  'slower_s',
  'restore_s',
  'retrained_s',
  'restart_s',
  'warmup_s',
  'standby_s',
)


def split(records: Sequence[dict[str, Any]], step_s: float) -> dict[str, float]:
  """Seconds by kind (module docstring): each of `PARTS`, checkpoint_s (saves, the steps they slowed, restores and
  work again), restart_s (restarts and standbys) and slower_s (steps slowed by nothing recovery ran)."""
  saves: dict[int, float] = {}
  for record in records:
    if record.get('event') == 'save':
      saves[record['process']] = saves.get(record['process'], 0.0) + record['blocking_s']
  totals = dict.fromkeys(PARTS, 0.0)
  totals['save_s'] = max(saves.values(), default=0.0)
  _beside_the_steps(records, totals, step_s)
  totals['warmup_s'] = _warmups(records, step_s)
  deaths = _deaths(records)
  for generation, died_at in deaths.items():
    nxt = generation + 1
    starts = [r for r in records if r.get('event') == 'start' and r.get('generation') == nxt]
    restore = max((s.get('restore_s', 0.0) for s in starts), default=0.0)
    totals['restore_s'] += restore
    totals['retrained_s'] += step_s * max((s.get('retrained_steps', 0) for s in starts), default=0)
    ready = [r['time'] for r in records if r.get('event') == 'ready' and r.get('generation') == nxt]
    # Not training again: the next start failed first (until then), or had nothing left to train (until it restored).
    back = max(ready) if ready else deaths.get(nxt, max((s['time'] for s in starts), default=None))
    if back is not None:
      totals['restart_s'] += max(0.0, back - died_at - restore)
  checkpoint = ('save_s', *BESIDE, 'restore_s', 'retrained_s')
  return {
    **totals,
    'checkpoint_s': sum(totals[part] for part in checkpoint),
    'restart_s': totals['restart_s'] + totals['warmup_s'] + totals['standby_s'],
    'restarts_only_s': totals['restart_s'],
  }


def _beside_the_steps(records: Sequence[dict[str, Any]], totals: dict[str, float], step_s: float) -> None:
  """Adds to `totals` the steps' slowdown start by start, charged to what ran beside them (module docstring)."""
  written = {'live_s': {}, 'boundary_s': {}}  # By (generation, process): the seconds it wrote down last.
  for record in records:
    for name, seconds in written.items():
      if name in record and 'generation' in record and 'process' in record:
        key = (record['generation'], record['process'])
        seconds[key] = max(seconds.get(key, 0.0), record[name])
  live, boundary = written['live_s'], written['boundary_s']
  slowdowns = slowed_steps(records, step_s)
  for record in records:
    if record.get('event') != 'generation' or record.get('writer') != 'launcher':
      continue
    cpu = record.get('cpu_while_training') or []
    spent = lambda names, cpu=cpu: max((sum(c.get(n, 0.0) for n in names) for c in cpu), default=0.0)
    generation = record['generation']
    takes = [live.get((generation, p), 0.0) + sum(c.get(n, 0.0) for n in LIVE_THREADS) for p, c in enumerate(cpu)]
    beside = {
      'boundary_s': max((boundary.get((generation, p), 0.0) for p in range(len(cpu))), default=0.0),
      'write_s': spent(WRITE_THREADS),
      'priority_s': spent(PRIORITY_THREADS),
      'live_s': max(takes, default=0.0),
    }
    charged = charge(slowdowns.get(generation, 0.0), beside)
    for part, seconds in charged.items():
      totals[part] += seconds
    totals['standby_s'] += _standby_s(record)


def charge(slowdown_s: float, beside: dict[str, float]) -> dict[str, float]:
  """The steps' slowdown of a start split over what ran beside them (`beside`: CPU seconds by part): each part its
  share, at most its CPU; the rest `slower_s` (negative where the steps ran faster than the reference's)."""
  busy = sum(beside.values())
  scale = min(1.0, max(0.0, slowdown_s) / busy) if busy > 0 else 0.0
  charged = {part: seconds * scale for part, seconds in beside.items()}
  return {**charged, 'slower_s': slowdown_s - sum(charged.values())}


def slowed_steps(records: Sequence[dict[str, Any]], step_s: float) -> dict[int, float]:
  """Per start: the seconds its steps took beyond `step_s` once at pace, the slowest process's (module docstring)."""
  failed = {r['generation']: r['failed_at'] for r in records if r.get('event') == 'failure'}
  reached = {r['generation']: r['steps'] for r in records if r.get('event') == 'positions'}
  chosen = [r['steps_per_dispatch'] for r in records if r.get('event') == 'steps_per_dispatch']
  in_flight = chosen[-1] / 2 if chosen and isinstance(chosen[-1], int) else 0  # A block half done at a death.
  per_start: dict[int, float] = {}
  for paced in records:
    if paced.get('event') != 'paced':
      continue
    generation, process = paced['generation'], paced.get('process')
    end = _training_end(records, generation, process, failed, reached, in_flight)
    if end is None:
      continue
    end_time, end_step = end
    blocked = sum(
      r['blocking_s']
      for r in records
      if r.get('event') == 'save'
      and r.get('generation') == generation
      and r.get('process') == process
      and paced['time'] < r['time'] <= end_time
    )
    # Steps after the paced boundary: from there the block in flight (`trained` to `step`) was half done, give or take.
    start_step = (paced['step'] + paced.get('trained', paced['step'])) / 2
    extra = end_time - paced['time'] - blocked - (end_step - start_step) * step_s
    per_start[generation] = max(per_start.get(generation, extra), extra)
  return per_start


def _training_end(records, generation, process, failed, reached, in_flight) -> tuple[float, float] | None:
  """(time, step) where a process's training in a start ended: its last step before the final save, or where it
  was when the start failed (the last step it reported, and half the block in flight, `in_flight` steps; None if
  neither is known)."""
  if generation in failed:
    steps = reached.get(generation) or []
    step = steps[process] if process is not None and process < len(steps) else None
    return None if step is None else (failed[generation], step + in_flight)
  for record in records:
    if (
      record.get('event') == 'ended'
      and record.get('generation') == generation
      and record.get('process') == process
      and 'trained_at' in record
    ):
      return record['trained_at'], record['step']
  return None


def edges(records: Sequence[dict[str, Any]]) -> dict[str, float] | None:
  """A job's time outside its starts' steps at either end (None where its history lacks either): `startup_s`, from
  the launcher starting the first start to its last process at pace (`paced`: imports, restore, compiles, 'auto''s
  probe), its saves' blocking meanwhile left out (the slowest process's: their own part); `end_s`, from the last
  start's steps' end (its processes' `trained_at`, the latest) to the launcher seeing that start end (the final
  save, the evaluation, the summary, the exit). A study sets them against its reference's."""
  launched = {r['generation']: r for r in records if r.get('event') == 'generation' and r.get('writer') == 'launcher'}
  paced = [r for r in records if r.get('event') == 'paced' and r.get('generation') == 0]
  ended = [r['trained_at'] for r in records if r.get('event') == 'ended' and 'trained_at' in r]
  if 0 not in launched or not paced or not ended:
    return None
  paced_at = max(r['time'] for r in paced)
  blocked: dict[Any, float] = {}
  for r in records:
    if r.get('event') == 'save' and r.get('generation') == 0 and r['time'] <= paced_at:
      blocked[r.get('process')] = blocked.get(r.get('process'), 0.0) + r['blocking_s']
  startup = paced_at - launched[0]['started'] - max(blocked.values(), default=0.0)
  return {'startup_s': startup, 'end_s': launched[max(launched)]['ended'] - max(ended)}


def _warmups(records: Sequence[dict[str, Any]], step_s: float) -> float:
  """Seconds the starts after the first took to be back at their pace, beyond their steps at `step_s`: from a
  process's `ready` to its `paced` record (its compiling block and 'auto''s probe: blocks waited for and timed, and
  the programs of the K chosen), the slowest process's, its saves and live copies meanwhile left out (`hooks_s`:
  their own parts); less the next start's standby, which the launcher starts
  as this one trains (its imports slow these first steps, and count as the standby's)."""
  standbys = {
    r['generation']: _standby_s(r) for r in records if r.get('event') == 'generation' and r.get('writer') == 'launcher'
  }
  marks: dict[tuple[int, str | None], dict[str, dict]] = {}
  for record in records:
    if record.get('event') in ('ready', 'paced') and record.get('generation'):
      marks.setdefault((record['generation'], record.get('writer')), {})[record['event']] = record
  per_start: dict[int, float] = {}
  for (generation, _), seen in marks.items():
    if 'ready' in seen and 'paced' in seen:
      ready, paced = seen['ready'], seen['paced']
      extra = paced['time'] - ready['time'] - (paced['step'] - ready['step']) * step_s - paced.get('hooks_s', 0.0)
      per_start[generation] = max(per_start.get(generation, 0.0), extra, 0.0)
  return sum(max(0.0, extra - standbys.get(generation, 0.0)) for generation, extra in per_start.items())


def _standby_s(generation: dict[str, Any]) -> float:
  """What the next start's standby took of the training beside a start (its launcher record): its CPU on the
  slower core; none where it waited at the lowest priority (`children.standby_waits_idle`: it took the cores'
  idle time, and a restart that came before it was done waited for the rest, in the restart's time)."""
  if generation.get('standby_waited_idle'):
    return 0.0
  return max(generation.get('standby_beside_cpu_s') or [0.0])


def _deaths(records: Sequence[dict[str, Any]]) -> dict[int, float]:
  """When each failed start lost its process: the launcher's time of the failure, else the first survivor's word."""
  deaths: dict[int, float] = {}
  for record in records:
    if record.get('event') == 'failure':
      deaths[record['generation']] = record['failed_at']
  for record in records:
    if record.get('event') == 'peer_lost' and record['generation'] not in deaths:
      deaths[record['generation']] = record['time']
  return deaths
