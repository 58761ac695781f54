"""What real failures cost a job, split as CPR splits it: checkpoint-related time apart from the restarts.

  split = overhead.split(history.read(workdir), step_s=0.0068)
  split['checkpoint_s']   # blocking saves + restores + work trained again (CPR's checkpoint-related overhead)
  split['restart_s']      # from each death to every process training again, its restore left out

Maeng et al. (CPR, MLSys 2021) measure what checkpoints cost a job that fails: the time spent saving them, loading
them, and training again what a rewind lost; a restart's own cost (a process coming back) is the same whatever the
recovery and is kept apart. From the job's history (`parallel.history`), pure:
- saves: every save's blocking time (`save` records: checkpoints, CPR's priority saves, the calibration's save and
  restore), summed per process; the job pays its slowest process's (they save side by side);
- per failure (the launcher's `failure` record, or else the first `peer_lost` of that start): the restore, the
  slowest process's of the next start (`start` records); the work trained again, the most steps a process of
  the next start was rewound (`retrained_steps`) at `step_s`; and the restart: from the death to the last
  process of the next start saying it trains (`ready` records; or, if that start failed first, to its failure; or,
  if it had nothing left to train, to its restore), less the restore.
"""

from collections.abc import Sequence
from typing import Any


def split(records: Sequence[dict[str, Any]], step_s: float) -> dict[str, float]:
  """Seconds by kind (module docstring): save_s, restore_s, retrained_s, checkpoint_s (their sum), restart_s."""
  saves: dict[int, float] = {}
  for record in records:
    if record.get('event') == 'save':
      saves[record['process']] = saves.get(record['process'], 0.0) + record['blocking_s']
  totals = {'save_s': max(saves.values(), default=0.0), 'restore_s': 0.0, 'retrained_s': 0.0, 'restart_s': 0.0}
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
  totals['checkpoint_s'] = totals['save_s'] + totals['restore_s'] + totals['retrained_s']
  return totals


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
