"""A sync driver started again mid-run (full recovery), from a checkpoint's sync state.

  driver = driver.restarted(state_L, sync_state_R)   # every driver has it (`drivers.SyncDriver`)

A driver whose rounds run on the training thread (`foreground`) starts again itself. One with a thread of its own
(`shadow`, `scheduled`) ends at once (its thread, its round in flight and its own copy of the sync state belong to
the lost run) and a fresh one like it (`fresh()`: the same settings, its first round a step after the restart)
takes over, inside a `RestartedSync` whose stats count every driver's rounds.
"""

from typing import Any

from shadowsync_jax import hooks
from shadowsync_jax.sync import consensus

PyTree = Any


def restart(driver: Any, state_L: Any, sync_state_R: PyTree) -> 'RestartedSync':
  """`driver` ended at once and a fresh one like it (`driver.fresh()`) started from (`state_L`, `sync_state_R`)."""
  driver.finish(state_L, abandon=True)
  restarted = RestartedSync(driver.fresh(), [driver.stats()])
  restarted.start(state_L, sync_state_R)
  return restarted


class RestartedSync(hooks.Hook):
  """A sync driver restarted: delegates to the new driver; its stats count every driver's rounds (the mean gap and
  latency weighted by rounds). `previous`: the stats of the drivers before it, in order."""

  def __init__(self, driver: Any, previous: list[dict[str, Any]]):
    self._driver = driver
    self._previous = previous

  def restarted(self, state_L: Any, sync_state_R: PyTree) -> 'RestartedSync':
    self._driver.finish(state_L, abandon=True)
    restarted = RestartedSync(self._driver.fresh(), self._previous + [self._driver.stats()])
    restarted.start(state_L, sync_state_R)
    return restarted

  def initial_sync_state(self, state_L: Any) -> PyTree:
    return self._driver.initial_sync_state(state_L)

  def start(self, state_L: Any, sync_state_R: PyTree) -> None:
    self._driver.start(state_L, sync_state_R)

  def sync_state(self) -> PyTree:
    return self._driver.sync_state()

  def settled(self, state_L: Any) -> tuple[Any, PyTree]:
    return self._driver.settled(state_L)

  def next_due(self, step: int) -> int | None:
    return self._driver.next_due(step)

  def between_steps(self) -> Any:
    return self._driver.between_steps()

  def block_carry(self, step: int | None, steps: int) -> Any:
    return self._driver.block_carry(step, steps)

  def after_block(self, carry: Any) -> None:
    self._driver.after_block(carry)

  def before_block(self, b: hooks.Boundary) -> None:
    self._driver.before_block(b)

  def waits_for(self, b: hooks.Boundary) -> bool:
    return self._driver.waits_for(b)

  def at_boundary(self, b: hooks.Boundary) -> None:
    self._driver.at_boundary(b)

  def end(self, b: hooks.Boundary) -> None:
    self._driver.end(b)

  def finish(self, state_L: Any, abandon: bool = False) -> Any:
    return self._driver.finish(state_L, abandon)

  def consensus_rule(self) -> consensus.Rule:
    return self._driver.consensus_rule()

  def consensus(self, params_L: PyTree) -> PyTree:
    return self._driver.consensus(params_L)

  def stats(self) -> dict[str, Any]:
    """The rounds of every driver, and the rest (a shadow driver's pace) of the current one."""
    every = self._previous + [self._driver.stats()]
    rounds = [s['sync_rounds'] for s in every]

    def weighted_mean(key):
      pairs = [(s[key], n) for s, n in zip(every, rounds) if s[key] is not None and n]
      total = sum(n for _, n in pairs)
      return sum(v * n for v, n in pairs) / total if total else None

    gaps = [s['max_sync_gap'] for s in every if s['max_sync_gap'] is not None]
    return {
      **every[-1],
      'sync_rounds': sum(rounds),
      'mean_sync_gap': weighted_mean('mean_sync_gap'),
      'max_sync_gap': max(gaps) if gaps else None,
      'mean_round_latency_s': weighted_mean('mean_round_latency_s'),
    }
