"""The background thread of ShadowSync across processes (`shadow.ShadowSync`): it paces the rounds, asks the training
thread for each round's contributions, meets this process's sum with every other process's on the host, and hands
the job's mean back, placed on this process's devices.

  thread = RoundThread(meshes)
  thread.start(first_round_after_s=0.0)
  thread.training()                       # this process's training is under way: the first round may start
  if thread.snapshot_wanted.is_set():     # the training thread: a block hands the round's snapshot over ...
    thread.hand_over(contributions_L)     # ... and its contributions (per device) go to the thread
  result = thread.result(wait_s)          # (job_mean, mean_L, latency_s, all_done) of that round, or None
  thread.interval_s = pace_s              # this process's pace (the training thread measures it)
  thread.finish_training()                # rounds go on until every process is done, then the thread ends

Each process runs one such thread, one round after the other, so round n of every process meets round n of the
others. Each round first agrees (`host_meeting`) on whether all processes have finished, and all threads stop after
that same round. The same agreement takes the longest of the processes' paces, and every thread waits that long from
the agreement, which they all leave together: the processes come to the next round at about the same moment. The
first round waits for this process's training to be under way. An exception in the thread is kept for the training
thread (`raise_if_failed`).
"""

import collections
from collections.abc import Callable
import queue
import statistics
import threading
import time
from typing import Any

import jax
import numpy as np

from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import host_meeting

PyTree = Any
POLL_S = 0.05  # How often a waiting thread checks whether it was asked to stop.
_HOST_COST_ROUNDS = 8  # The rounds whose host work's mean is the host cost of a round (`pacing.GapPacer`).


class RoundThread:
  """The rounds' thread of one process (module docstring). `host_cost_s`: the mean CPU seconds of its last rounds'
  host work (their sums read, met and averaged; waits for the peers cost none), a cost of the round on the training
  process's cores; `job_interval_s`: the pace the processes agreed on at the last round (the longest of theirs)."""

  def __init__(self, meshes: replicas.ReplicaMeshes):
    self._meshes = meshes
    self._num_local = meshes.local.shape[replicas.REPLICA_AXIS]
    self._num_replicas = meshes.job.shape[replicas.REPLICA_AXIS]
    self._links = host_meeting.peer_links(meshes)
    self._agree = host_meeting.round_agreement(meshes, self._links)
    self._meet = host_meeting.sums_meeting(meshes, self._links)
    self.interval_s = 0.0  # This process's pace: written by the training thread, read by this one.
    self.job_interval_s: float | None = None
    self.host_cost_s = 0.0
    self._host_costs_s: collections.deque[float] = collections.deque(maxlen=_HOST_COST_ROUNDS)
    self.snapshot_wanted = threading.Event()
    self._snapshots: queue.Queue = queue.Queue(maxsize=1)
    self._results: queue.Queue = queue.Queue(maxsize=1)
    self._stop = threading.Event()  # Abandon rounds now (the run failed).
    self._done = threading.Event()  # This process trained its whole stream; rounds go on until all processes are.
    self._training = threading.Event()  # This process's training is under way.
    self._error: BaseException | None = None
    self._failed = threading.Event()
    self._first_round_after_s = 0.0
    self._thread: threading.Thread | None = None

  @property
  def started(self) -> bool:
    return self._thread is not None

  def start(self, first_round_after_s: float = 0.0) -> None:
    """Starts the thread; its first round comes `first_round_after_s` after `training`."""
    self._first_round_after_s = first_round_after_s
    for event in (self._stop, self._done, self.snapshot_wanted, self._training):
      event.clear()
    self._thread = threading.Thread(target=self._run, name='shadow-sync', daemon=True)
    self._thread.start()

  def training(self) -> None:
    """This process's training is under way (past its compiling block and 'auto''s probe)."""
    self._training.set()

  def hand_over(self, contributions_L: PyTree) -> None:
    """The contributions of the snapshot the thread asked for (`snapshot_wanted`, which the caller clears)."""
    self._snapshots.put(contributions_L)

  def result(self, wait_s: float):
    """The result of the round handed over, waiting up to `wait_s` for it (None if not there by then)."""
    try:
      return self._results.get(timeout=wait_s) if wait_s > 0 else self._results.get_nowait()
    except queue.Empty:
      return None

  def finish_training(self) -> None:
    """This process trained its whole stream: the thread stops after the round every process agrees is the last."""
    self._done.set()

  def abandon(self, join_s: float) -> None:
    """The run is failing: rounds stop now; waits up to `join_s` for the thread (it may be waiting for a dead
    process)."""
    self._stop.set()
    self._thread.join(timeout=join_s)

  def alive(self) -> bool:
    return self._thread.is_alive()

  def join(self, timeout_s: float) -> None:
    self._thread.join(timeout=timeout_s)

  def raise_if_failed(self) -> None:
    if self._failed.is_set():
      raise self._error

  def _run(self) -> None:
    try:
      # The first round waits for this process's training to be under way (past its compiling block and 'auto''s
      # probe): its agreement then finds every process training, and its collective waits for no peer's compile.
      while not (self._training.wait(POLL_S) or self._stop.is_set() or self._done.is_set()):
        continue
      started_s = time.monotonic()
      self._wait(lambda: self._first_round_after_s - (time.monotonic() - started_s))
      while not self._stop.is_set():
        # Agree before asking for the snapshot (module docstring): a wait here for a late peer is no round's cost.
        agreed = self._agree(self._done.is_set(), self.interval_s, self._stop.is_set)
        if agreed is None:
          return
        all_done, self.job_interval_s = agreed
        round_start = time.monotonic()  # The same moment on every process: they all leave the agreement together.
        contributions_L = self._next_snapshot()
        if contributions_L is None:
          return
        started, cpu_started = time.perf_counter(), time.thread_time()
        job_mean = host_meeting.job_mean(self._meet, contributions_L, self._num_replicas, self._stop.is_set)
        if job_mean is None:
          return
        mean_L = self._on_devices(job_mean)  # The exchange of the block that lands it, placed off the steps' thread.
        self._host_costs_s.append(time.thread_time() - cpu_started)  # Waits for the sums and the peers: no CPU.
        self.host_cost_s = statistics.fmean(self._host_costs_s)
        if not self._put_result((job_mean, mean_L, time.perf_counter() - started, all_done)) or all_done:
          return
        self._wait_for_the_next_round(round_start)
    except BaseException as error:  # pylint: disable=broad-except  (handed to the training thread as it is)
      self._error = error
      self._failed.set()
    finally:
      if self._links is not None:  # No round meets after this one: every peer has read this process's last.
        self._links.close()

  def _on_devices(self, job_mean: PyTree) -> PyTree:
    """The job's mean, a copy for each of this process's replicas, on their devices (a block's exchange)."""
    copies = jax.tree.map(lambda leaf: np.broadcast_to(leaf, (self._num_local, *leaf.shape)), job_mean)
    return replicas.shard(copies, self._meshes.local)

  def _wait_for_the_next_round(self, round_start: float) -> None:
    """Until the pace after `round_start`: the longest the processes agreed on at that round, or this process's own
    if it grew since (the training thread may change it meanwhile); at once when this process is done, so that
    `finish_training` does not wait out the pace."""
    self._wait(lambda: max(self.job_interval_s, self.interval_s) - (time.monotonic() - round_start))

  def _wait(self, remaining_s: Callable[[], float]) -> None:
    """Until `remaining_s()` reaches 0 (asked again at every poll), or at once when stopped or this process is
    done."""
    while not (self._stop.is_set() or self._done.is_set()):
      left_s = remaining_s()
      if left_s <= 0:
        return
      self._stop.wait(min(left_s, POLL_S))

  def _next_snapshot(self) -> PyTree | None:
    self.snapshot_wanted.set()
    while not self._stop.is_set():
      try:
        return self._snapshots.get(timeout=POLL_S)
      except queue.Empty:
        continue
    return None

  def _put_result(self, result) -> bool:
    while not self._stop.is_set():
      try:
        self._results.put(result, timeout=POLL_S)
        return True
      except queue.Full:
        continue
    return False
