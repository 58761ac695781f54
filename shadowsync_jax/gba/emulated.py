"""GBA and async SGD in one process: a parameter server and R workers, their arrival order emulated (docs/design.md §8).

  config.sync.algorithm = 'gba'                      # or 'async_sgd'; config.gba holds the step-time emulation
  summary = emulated.train_and_evaluate(config, workdir)   # train.train_and_evaluate dispatches here
  summary['eval_ne'], summary['emulated_examples_per_sec'], summary['sync_sgd_emulated_examples_per_sec']

The server (`server.Server`) holds one model (a `step.TrainState`: params, the sync_sgd optimizer states, `step` =
the global step g).
Worker r reads replica r's 1/R of the stream (input_pipeline's layout). A worker takes a token (g at pull time) with
the server's params, computes the gradient of its local batch on them (real math: `step.make_gradient_fn`) and
pushes (gradient, token) after its emulated step time; then it pulls again. The server handles pushes in emulated
time order:
- `gba`: it buffers them until they cover a global batch (R local batches), weights each by its staleness
  (`aggregation.staleness_weights`), applies their weighted mean with sync_sgd's optimizers and advances g;
- `async_sgd`: it applies every gradient on arrival, alone, with the same optimizers (no aggregation).
A worker whose step fails (`gba.failure_prob`) never pushes: its token is lost, its batch is not trained on, and the
server, which waits for gradients rather than for workers, goes on with the others.

Time is emulated: every (worker, step) has a seeded step time (`step_times.WorkerStepTimes`), and the events run in that
order; the gradients are computed for real, one after the other, on one device. The summary reports the emulated
time and examples/sec beside the real ones, and what sync SGD would have taken on the same step times (each global
step waits for its slowest worker). Checkpoints have sync_sgd's layout (the server model stacked R times), so a
run switches between `sync_sgd` and `gba` through its workdir with no other change; at a checkpoint the workers
drain (finish their in-flight steps) so that the stream position is one step for all of them.

In a job of several processes the workers are the job's replicas, running for real: `processes`, which shares the
same `server.Server`, checkpoint layout and summary.
"""

import heapq
import pathlib
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from shadowsync_jax.data import input_pipeline
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.gba import run as gba_run
from shadowsync_jax.gba import server as server_lib
from shadowsync_jax.gba import step_times
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.parallel import replicas


class WorkerData:
  """Worker r's local step k is replica r's slice of global step k; read a chunk of global steps at a time (one
  contiguous read) and kept until every worker has passed it (workers drift apart under stragglers)."""

  def __init__(
    self, source: input_pipeline.Source, num_workers: int, batch_size: int, total_steps: int, chunk_steps: int = 16
  ):
    self._source, self._num_workers, self._batch_size = source, num_workers, batch_size
    self._total_steps, self._chunk_steps = total_steps, chunk_steps
    self._chunks: dict[int, Batch] = {}

  def batch(self, worker: int, step: int) -> Batch:
    chunk = step // self._chunk_steps
    if chunk not in self._chunks:
      first = chunk * self._chunk_steps
      count = min(first + self._chunk_steps, self._total_steps) - first
      flat = self._source.read(
        first * self._num_workers * self._batch_size, count * self._num_workers * self._batch_size
      )
      self._chunks[chunk] = Batch(*(x.reshape(count, self._num_workers, self._batch_size, *x.shape[1:]) for x in flat))
    return Batch(*(x[step % self._chunk_steps, worker] for x in self._chunks[chunk]))

  def forget_before(self, step: int) -> None:
    """No worker reads a step before `step` again."""
    for chunk in [c for c in self._chunks if (c + 1) * self._chunk_steps <= step]:
      del self._chunks[chunk]


class Emulation:
  """The discrete-event loop: workers pull, compute and push in the order their emulated step times give."""

  def __init__(
    self, server: server_lib.Server, data: WorkerData, times: step_times.WorkerStepTimes, gradient_fn, start_step: int
  ):
    self.server, self._data, self._times, self._gradient_fn = server, data, times, gradient_fn
    self.now = 0.0  # Emulated seconds since this run (or its resumption) began.
    self.next_step = [start_step] * times.seconds_RxK.shape[0]
    self._in_flight: list[tuple[float, int, server_lib.Gradient]] = []  # Heap by (arrival time, worker).
    self.lost_tokens = 0
    self.losses: list[jax.Array] = []  # Of the gradients received since the caller last cleared it.

  def run_until(self, boundary: int, after_arrivals=lambda: None) -> None:
    """Every worker trains up to local step `boundary`; returns once all their gradients are in and applied (a
    drain: the emulated clock stands at the last arrival)."""
    for worker, step in enumerate(self.next_step):
      if step < boundary:
        self._pull(worker)
    while self._in_flight:
      self.now = float(self._in_flight[0][0])
      arrived = []
      while self._in_flight and self._in_flight[0][0] == self.now:  # Same instant: all arrive before any pulls.
        arrived.append(heapq.heappop(self._in_flight)[2])
      for gradient in arrived:
        if gradient.mlp_grads is None:
          self.lost_tokens += 1
        else:
          self.losses.append(gradient.loss)
          self.server.receive(gradient)
      after_arrivals()
      for gradient in arrived:
        if self.next_step[gradient.worker] < boundary:
          self._pull(gradient.worker)
      self._data.forget_before(min(self.next_step))
    self.server.flush()

  def _pull(self, worker: int) -> None:
    step = self.next_step[worker]
    token = self.server.global_step
    if self._times.fails_RxK[worker, step]:  # The worker dies mid-step: its token never comes back.
      gradient = server_lib.Gradient(worker, token, None, None, None, None)
    else:
      loss, mlp_grads, row_ids_N, row_grads_NxD = self._gradient_fn(
        self.server.state.params, self._data.batch(worker, step)
      )
      gradient = server_lib.Gradient(worker, token, loss, mlp_grads, row_ids_N, row_grads_NxD)
    heapq.heappush(self._in_flight, (self.now + self._times.seconds_RxK[worker, step], worker, gradient))
    self.next_step[worker] = step + 1


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
  """Trains `config` (sync.algorithm gba or async_sgd; validated by the caller) in `workdir`, resuming from its
  newest checkpoint (one of sync_sgd's too); returns the summary written to summary.json, with train.py's keys and
  the emulated figures. When `config.train.stop_at_step` stops it early, returns {'stopped_at_step': step}."""
  mesh = replicas.make_mesh(config.num_replicas)
  run = gba_run.start(config, workdir, replicas.ReplicaMeshes(mesh, mesh))
  server, total_steps = run.server, run.total_steps
  num_workers, batch_size = config.num_replicas, config.batch_size
  examples_per_step = num_workers * batch_size
  times = step_times.WorkerStepTimes.sample(config.gba, num_workers, total_steps, config.seed)
  gradient_fn = jax.jit(step_lib.make_gradient_fn(dlrm.from_config(config.model), list(config.data.cardinalities)))
  emulation = Emulation(
    server, WorkerData(run.train_source, num_workers, batch_size, total_steps), times, gradient_fn, run.start_step
  )
  clock = _RealClock(run.start_step)
  logged = {'global_step': server.global_step, 'emulated_s': 0.0, 'real_s': time.perf_counter(), 'gradients': 0}

  def after_arrivals():
    clock.after_arrivals(emulation)
    run.progress_line.update(min(server.global_step, total_steps))
    if server.global_step - logged['global_step'] >= config.train.log_every_steps and emulation.losses:
      now, steps = time.perf_counter(), server.global_step - logged['global_step']
      run.writer.write_scalars(
        server.global_step,
        {
          'train_loss': float(np.mean(jax.device_get(emulation.losses))),
          'examples_per_sec': steps * examples_per_step / (now - logged['real_s']),
          'emulated_examples_per_sec': steps * examples_per_step / max(emulation.now - logged['emulated_s'], 1e-12),
          'mean_staleness': float(np.mean(server.staleness[logged['gradients'] :])),
        },
      )
      emulation.losses.clear()
      logged.update(
        global_step=server.global_step, emulated_s=emulation.now, real_s=now, gradients=len(server.staleness)
      )

  for boundary in gba_run.segments(run):
    emulation.run_until(boundary, after_arrivals)
  jax.block_until_ready(server.state)
  real_seconds = clock.seconds(emulation)

  def emulated_figures() -> dict[str, Any]:
    trained_examples = (total_steps - run.start_step) * examples_per_step
    sync_time_s = times.sync_time_s(run.start_step, total_steps)
    return {
      'real_time_s': real_seconds,
      'net_bytes_sent': [None],  # One process: nothing crosses a network.
      'net_bytes_received': [None],
      'emulated_time_s': float(emulation.now),
      'emulated_examples_per_sec': float(trained_examples / emulation.now) if emulation.now > 0 else None,
      'sync_sgd_emulated_time_s': sync_time_s,
      'sync_sgd_emulated_examples_per_sec': trained_examples / sync_time_s if sync_time_s > 0 else None,
    }

  examples_per_sec = lambda: [clock.examples_per_sec(batch_size)]
  return gba_run.finish(
    run, lambda: server.state.params, examples_per_sec, emulation.lost_tokens, more=emulated_figures
  )


class _RealClock:
  """Real seconds and local batches computed from the end of the first update (which paid for compilation) on."""

  def __init__(self, start_step: int):
    self._start_step = start_step
    self._started: tuple[float, int] | None = None  # (time, local batches pulled) at the first update's end.
    self._end = (0.0, 0)

  def after_arrivals(self, emulation: Emulation) -> None:
    if self._started is None and emulation.server.updates:
      jax.block_until_ready(emulation.server.state.step)
      self._started = (time.perf_counter(), self._pulled(emulation))

  def _pulled(self, emulation: Emulation) -> int:
    return sum(step - self._start_step for step in emulation.next_step)

  def seconds(self, emulation: Emulation) -> float:
    self._end = (time.perf_counter(), self._pulled(emulation))
    return self._end[0] - self._started[0] if self._started else 0.0

  def examples_per_sec(self, batch_size: int) -> float | None:
    if self._started is None or self._end[0] <= self._started[0]:
      return None
    return (self._end[1] - self._started[1]) * batch_size / (self._end[0] - self._started[0])
