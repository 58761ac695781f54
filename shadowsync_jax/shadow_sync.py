"""ShadowSync (Zheng et al. 2020, arXiv:2003.03477): sync rounds in a background thread, off the training path.

  driver = ShadowSync(algorithm, 'ma', mesh, groups=('mlp',), min_interval_s=0.0)
  driver.start(state_R, driver.initial_sync_state(state_R))   # starts the thread
  for step in ...:
    state_R, _ = train_step(state_R, batch_R)    # no cross-replica collective in here
    state_R = driver.after_step(step, state_R)   # never waits for a round
  state_R = driver.finish(state_R)               # stops and joins the thread

A round: the thread asks for a snapshot; at its next step boundary the training loop dispatches a copy `s` of the
synced params (a copy, so donating the params to the next step cannot delete what the thread reads) and hands it
over; the thread computes the synced `s'` (its collectives are the only ones) and posts `(s, s')`; at the next step
boundary after that, the loop merges `w <- w + (s' - s)`, keeping the local steps made while the round ran. An
exception in the thread is re-raised by `after_step` at the first step boundary after it happened.
"""

import queue
import threading
import time
from typing import Any

import jax

from shadowsync_jax import replicas
from shadowsync_jax import sync_algorithms
from shadowsync_jax import sync_drivers

PyTree = Any
_POLL_S = 0.05  # How often a waiting thread checks whether it was asked to stop.


@jax.jit
def _merge(params_R: PyTree, snapshot_R: PyTree, synced_R: PyTree) -> PyTree:
  return jax.tree.map(lambda w, s, s_new: w + (s_new - s), params_R, snapshot_R, synced_R)


def _copy(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: x.copy(), tree)


class ShadowSync:
  """`shadow_*`: one background thread loops rounds, no faster than one per `min_interval_s`."""

  def __init__(self, algorithm: sync_algorithms.SyncAlgorithm, name: str, mesh, groups: tuple[str, ...],
               min_interval_s: float = 0.0):
    self._name, self._groups, self._min_interval_s = name, groups, min_interval_s
    self._init_R, self._sync_R = sync_algorithms.stacked(algorithm, mesh)
    self._consensus_R = sync_algorithms.stacked_consensus(name, mesh)
    self._sync_state_R = None  # That of the last merged round; the thread runs ahead on its own copy.
    self._snapshot_wanted = threading.Event()
    self._snapshots: queue.Queue = queue.Queue(maxsize=1)
    self._results: queue.Queue = queue.Queue(maxsize=1)
    self._stop = threading.Event()
    self._error: BaseException | None = None
    self._failed = threading.Event()
    self._thread: threading.Thread | None = None
    self._gaps = sync_drivers.GapTracker()

  def initial_sync_state(self, state_R: Any) -> PyTree:
    return self._init_R(sync_drivers.select(state_R.params, self._groups))

  def start(self, state_R: Any, sync_state_R: PyTree) -> None:
    self._sync_state_R = sync_state_R
    self._gaps.reset(int(state_R.step[0]))
    self._thread = threading.Thread(target=self._run, name='shadow-sync', daemon=True)
    self._thread.start()

  def after_step(self, step: int, state_R: Any) -> Any:
    """At a step boundary: raise the thread's error, merge a finished round, hand over a wanted snapshot."""
    self._raise_if_failed()
    try:
      snapshot_R, synced_R, sync_state_R, latency_s = self._results.get_nowait()
    except queue.Empty:
      pass
    else:
      synced_groups = _merge(sync_drivers.select(state_R.params, self._groups), snapshot_R, synced_R)
      state_R = state_R._replace(params=sync_drivers.with_synced(state_R.params, synced_groups))
      self._sync_state_R = sync_state_R
      self._gaps.merged(step, latency_s)
    if self._snapshot_wanted.is_set():
      self._snapshot_wanted.clear()
      self._snapshots.put(_copy(sync_drivers.select(state_R.params, self._groups)))
    return state_R

  def finish(self, state_R: Any) -> Any:
    """Stops and joins the thread (a round in flight is dropped, sync state and all); raises its error if it failed."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    self._raise_if_failed()
    return state_R

  def consensus(self, params_R: PyTree) -> PyTree:
    synced = self._consensus_R(sync_drivers.select(params_R, self._groups), self._sync_state_R)
    return sync_drivers.with_synced(replicas.replica_mean(params_R), synced)

  def stats(self) -> dict[str, Any]:
    return self._gaps.stats()

  def sync_state(self) -> PyTree:
    """The sync state of the last merged round, so it matches the params `after_step` returned (safe to save)."""
    return self._sync_state_R

  def wait_for_rounds(self, rounds: int, step_boundary, timeout_s: float = 60.0) -> None:
    """Test helper: calls `step_boundary()` until `rounds` rounds were merged (or raises TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    while self._gaps.rounds < rounds:
      if time.monotonic() > deadline:
        raise TimeoutError(f'only {self._gaps.rounds} of {rounds} shadow rounds in {timeout_s} s.')
      step_boundary()

  def _raise_if_failed(self) -> None:
    if self._failed.is_set():
      raise self._error

  def _run(self) -> None:
    sync_state_R = self._sync_state_R
    try:
      while not self._stop.is_set():
        round_start = time.monotonic()
        snapshot_R = self._next_snapshot()
        if snapshot_R is None:
          return
        started = time.perf_counter()
        synced_R, sync_state_R = self._sync_R(snapshot_R, sync_state_R)
        jax.block_until_ready(synced_R)
        if not self._put_result((snapshot_R, synced_R, sync_state_R, time.perf_counter() - started)):
          return
        self._stop.wait(max(0.0, self._min_interval_s - (time.monotonic() - round_start)))
    except BaseException as error:  # pylint: disable=broad-except  (handed to the training thread as it is)
      self._error = error
      self._failed.set()

  def _next_snapshot(self) -> PyTree | None:
    self._snapshot_wanted.set()
    while not self._stop.is_set():
      try:
        return self._snapshots.get(timeout=_POLL_S)
      except queue.Empty:
        continue
    return None

  def _put_result(self, result) -> bool:
    while not self._stop.is_set():
      try:
        self._results.put(result, timeout=_POLL_S)
        return True
      except queue.Full:
        continue
    return False
