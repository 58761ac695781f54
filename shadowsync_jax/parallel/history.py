"""The job's history across restarts: what each process and the launcher wrote down, and what it adds up to.

Written by the training processes (`recovery.real`: what each restored, when it lost a peer) and by the
supervisor (`supervisor`: every failure it saw), read back for summary.json and by the real-failures benchmark.

  history.append(workdir, 'process_1', {'event': 'start', 'generation': 2, 'restored': 'checkpoint', ...})
  history.append(workdir, 'launcher', {'event': 'failure', 'process': 1, 'how': 'killed by SIGKILL', ...})
  history.read(workdir)          # every record of every writer, in time order
  history.summarize(workdir, ...)   # num_failures, restarts, what each process restored, lost steps, the PLS

Every writer appends JSON lines to its own file (`WORKDIR/history/<writer>.jsonl`), so no two processes write one
file and a record outlives the process that wrote it. Records carry `time` (seconds since the epoch) and, from a
training process, its `generation` (the launcher's count of restarts; 0 for a first start).
"""

import json
import pathlib
import time
from typing import Any

DIRECTORY = 'history'


def append(workdir: str | pathlib.Path, writer: str, record: dict[str, Any]) -> None:
  """Appends `record` (with the time) to `writer`'s file, flushed to disk before returning."""
  directory = pathlib.Path(workdir) / DIRECTORY
  directory.mkdir(parents=True, exist_ok=True)
  with open(directory / f'{writer}.jsonl', 'a') as file:
    file.write(json.dumps({'time': time.time(), 'writer': writer, **record}) + '\n')
    file.flush()


def read(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
  """Every record of every writer, oldest first (a half-written last line of a killed writer is skipped)."""
  records = []
  for path in sorted((pathlib.Path(workdir) / DIRECTORY).glob('*.jsonl')):
    for line in path.read_text().splitlines():
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return sorted(records, key=lambda r: r['time'])


def latest(workdir: str | pathlib.Path, event: str) -> dict[str, Any] | None:
  """The newest record of `event`, or None."""
  matching = [r for r in read(workdir) if r.get('event') == event]
  return matching[-1] if matching else None


def positions_reached(workdir: str | pathlib.Path, generation: int) -> dict[int, int]:
  """How far each process had got when `generation` ended: the steps the launcher read from its control pipes
  (exact), the step a survivor wrote down when it lost a peer, and the step its peers last saw it at (a
  heartbeat's, a second old at most: all a cluster's restart loop without our launcher leaves)."""
  reached: dict[int, int] = {}
  for record in read(workdir):
    if record.get('generation') != generation:
      continue
    if record.get('event') == 'positions':  # The launcher's: exactly where each process was.
      for process, step in enumerate(record['steps']):
        if step is not None:
          reached[process] = max(reached.get(process, 0), step)
      continue
    if record.get('event') != 'peer_lost':
      continue
    reached[record['process']] = max(reached.get(record['process'], 0), record['step'])
    for peer, step in record.get('peer_steps', {}).items():
      reached[int(peer)] = max(reached.get(int(peer), 0), step)
  return reached


def summarize(workdir: str | pathlib.Path, total_steps: int, num_processes: int) -> dict[str, Any]:
  """What summary.json says of the job's failures: every failure the launcher saw, every restart and what each
  process restored, the steps each skipped (partial recovery) or trained again (full), and the PLS they make."""
  records = read(workdir)
  failures = [r for r in records if r.get('event') == 'failure']
  starts = [r for r in records if r.get('event') == 'start']
  restarts = sorted({r['generation'] for r in starts if r['generation'] > 0})
  skipped = sum(r.get('skipped_steps', 0) for r in starts)
  retrained = sum(r.get('retrained_steps', 0) for r in starts)
  peer_losses = [r for r in records if r.get('event') == 'peer_lost']
  return {
    'num_failures': len(failures) if failures else len(restarts),
    'num_restarts': len(restarts),
    'failures': [{k: v for k, v in r.items() if k != 'writer'} for r in failures],
    'restored': [
      {k: r[k] for k in ('generation', 'process', 'restored', 'restored_step', 'position', 'restore_s') if k in r}
      for r in starts
      if r['generation'] > 0
    ],
    'peer_losses': [
      {k: r[k] for k in ('generation', 'process', 'reason', 'step', 'live_saved') if k in r} for r in peer_losses
    ],
    'skipped_steps': skipped,
    'retrained_steps': retrained,
    # Each skipped step of one process loses its replicas' share of one global step: 1 / num_processes of it.
    'actual_pls': skipped / (num_processes * total_steps) if total_steps else 0.0,
  }
