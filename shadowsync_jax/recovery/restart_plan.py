"""What each process restores when a job of several processes starts again, and where the stream goes on.

  mine = restart_plan.Holdings(checkpoints=[500, 1000], live=[1130], seen_peer_steps={1: 1187})
  everyone = distributed.exchange('holdings', mine.to_json())           # one per process, in process order
  plan = restart_plan.plan(mode, lock_step, [restart_plan.Holdings.from_json(h) for h in everyone])
  plan.restore[p]    # ('live', 1130), ('checkpoint', 1000) or ('init', 0): what process p reads
  plan.position[p]   # the step process p's stream goes on from (its replicas skip what lies in between)

Pure: every process computes the same plan from the same holdings (docs/design.md §7, real failures).
- Resume (`recovery.mode='none'`, or a first start): every process its own newest checkpoint; a lock-step
  algorithm (`sync_sgd`, `fr_*`, `gba`: every process makes the same collectives at the same steps) the newest
  step every process has.
- `full`: every process restores the newest checkpoint that every process has (a consistent cut; the live states
  of survivors are not used) and the data rewinds there; states past the cut belong to an abandoned timeline.
- `partial` (and `cpr_mfu`, `cpr_ssu`): a process that kept its live state when a peer died restores it; one
  without (the one that died) restores its newest checkpoint. Nobody rewinds: a process goes on from where it was
  when the job stopped (`seen_peer_steps`: what the launcher or the survivors saw), and under a lock-step
  algorithm every process from the furthest position of all. The steps a process skips lose its replicas'
  updates: the PLS.
"""

from collections.abc import Sequence
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Holdings:
  """What one process can restore: the steps of its complete checkpoints and live states, and the steps at which
  it last saw each peer (written with a live state)."""

  checkpoints: tuple[int, ...] = ()
  live: tuple[int, ...] = ()
  seen_peer_steps: dict[int, int] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict[str, Any]:
    return {
      'checkpoints': list(self.checkpoints),
      'live': list(self.live),
      'seen_peer_steps': {str(k): v for k, v in self.seen_peer_steps.items()},
    }

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> 'Holdings':
    return cls(tuple(data['checkpoints']), tuple(data['live']), {int(k): v for k, v in data['seen_peer_steps'].items()})


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per process: what it restores, ('live' | 'checkpoint' | 'init', step), and the step its stream goes on from."""

  restore: list[tuple[str, int]]
  position: list[int]

  def skipped(self, process: int) -> int:
    """Steps of `process`'s share of the stream that nobody trains (0 but under partial recovery)."""
    return self.position[process] - self.restore[process][1]


def plan(mode: str, lock_step: bool, holdings: Sequence[Holdings]) -> Plan:
  """The plan of `mode` ('none', 'full' or a partial one) for processes holding `holdings` (module docstring)."""
  if mode == 'full' or (mode == 'none' and lock_step):
    common = set.intersection(*({0, *h.checkpoints} for h in holdings))
    cut = max(common)
    return Plan([_source(h, cut, live=False) for h in holdings], [cut] * len(holdings))
  if mode == 'none':
    restore = [_source(h, max((0, *h.checkpoints)), live=False) for h in holdings]
    return Plan(restore, [step for _, step in restore])
  restore = [_source(h, max((0, *h.live, *h.checkpoints)), live=True) for h in holdings]
  position = []
  for process, (_, step) in enumerate(restore):
    # Where it was when the job stopped (a dead process's last step, or a survivor's past an older live copy).
    seen = [h.seen_peer_steps.get(process, 0) for h in holdings]
    position.append(max(step, *seen))
  if lock_step:
    position = [max(position)] * len(holdings)
  return Plan(restore, position)


def _source(holdings: Holdings, step: int, live: bool) -> tuple[str, int]:
  if step == 0 and 0 not in holdings.checkpoints and 0 not in holdings.live:
    return ('init', 0)
  return ('live', step) if live and step in holdings.live else ('checkpoint', step)
