"""What every sync driver shares: which params a round syncs, and the count of rounds and gaps.

synced_L = rounds.select(state_L.params, rounds.SYNCED_GROUPS['dense'])   # {'mlp': ...}
params_L = rounds.with_synced(state_L.params, synced_L)
gaps = rounds.GapTracker(); gaps.merged(step, latency_s); gaps.stats()    # sync_rounds, mean/max sync gap
copy_L = rounds.copy(synced_L)                              # new buffers in one program (the step donates the params)
"""

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any

# Which parameter groups a round synchronizes (`sync.what`). A sharded table is one table, never synced:
# `synced_groups` gives the dense part alone there.
SYNCED_GROUPS = {'dense': ('mlp',), 'all': ('mlp', 'embedding')}


def synced_groups(what: str, placement: str) -> tuple[str, ...]:
  """The groups rounds sync for `sync.what` and `sync.embedding_placement`."""
  return SYNCED_GROUPS['dense' if placement == 'sharded' else what]


class GapTracker:
  """Counts rounds and the sync gap: training steps made between two consecutive merges (docs/design.md §2)."""

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


@jax.jit
def copy(tree: PyTree) -> PyTree:
  """New buffers with the values of `tree`, in one program (a copy per leaf costs a dispatch per leaf, on the
  training thread)."""
  return jax.tree.map(jnp.copy, tree)
