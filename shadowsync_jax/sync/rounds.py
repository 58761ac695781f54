"""What every sync driver shares: which params a round syncs, the model to evaluate, and the count of rounds and gaps.

synced_L = rounds.select(state_L.params, rounds.SYNCED_GROUPS['dense'])   # {'mlp': ...}
params_L = rounds.with_synced(state_L.params, synced_L)
gaps = rounds.GapTracker(); gaps.merged(step, latency_s); gaps.stats()    # sync_rounds, mean/max sync gap
params = rounds.consensus(consensus_R, groups, params_L, sync_state_R, meshes)   # DESIGN §3's evaluation model
"""

from typing import Any

from shadowsync_jax.parallel import replicas

PyTree = Any

# Which parameter groups a round synchronizes (`sync.what`).
SYNCED_GROUPS = {'dense': ('mlp',), 'all': ('mlp', 'embedding')}


class GapTracker:
  """Counts rounds and the sync gap: training steps made between two consecutive merges (DESIGN §2)."""

  def __init__(self):
    self.rounds, self.gaps, self.latencies_s = 0, [], []
    self._last_merge_step = 0

  def reset(self, step: int) -> None:
    self._last_merge_step = step

  def merged(self, step: int | None, latency_s: float) -> None:
    """A round merged at `step`; None: after the last step (it counts as a round, not as a sync gap)."""
    self.rounds += 1
    self.latencies_s.append(latency_s)
    if step is not None:
      self.gaps.append(step - self._last_merge_step)
      self._last_merge_step = step

  def stats(self) -> dict[str, Any]:
    return {
      'sync_rounds': self.rounds,
      'mean_sync_gap': sum(self.gaps) / len(self.gaps) if self.gaps else None,
      'max_sync_gap': max(self.gaps) if self.gaps else None,
      'mean_round_latency_s': sum(self.latencies_s) / len(self.latencies_s) if self.latencies_s else None,
    }


def select(params: PyTree, groups: tuple[str, ...]) -> PyTree:
  """The synced part of the params: {group: params[group]} for the configured groups."""
  return {group: params[group] for group in groups}


def with_synced(params: PyTree, synced: PyTree) -> PyTree:
  """`params` with its synced groups replaced."""
  return {**params, **synced}


def consensus(
  consensus_R, groups: tuple[str, ...], params_L: PyTree, sync_state_R: PyTree, meshes: replicas.ReplicaMeshes
) -> PyTree:
  """The model to evaluate: the algorithm's consensus (`consensus_R`) of the synced groups, the job's replica mean
  of the rest; whole on every device of the job."""
  replicas.check_collective_thread('the consensus')
  synced = consensus_R(replicas.to_job(select(params_L, groups), meshes), sync_state_R)
  return with_synced(replicas.job_mean(params_L, meshes), synced)
