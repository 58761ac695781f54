"""GBA and async SGD in one process: a parameter server and R workers, their arrival order emulated (DESIGN §8).

  config.sync.algorithm = 'gba'                      # or 'async_sgd'; config.gba holds the step-time emulation
  summary = gba_training.train_and_evaluate(config, workdir)   # train.train_and_evaluate dispatches here
  summary['eval_ne'], summary['emulated_examples_per_sec'], summary['sync_sgd_emulated_examples_per_sec']

The server holds one model (a `step.TrainState`: params, the sync_sgd optimizer states, `step` = the global step g).
Worker r reads replica r's 1/R of the stream (input_pipeline's layout). A worker takes a token (g at pull time) with
the server's params, computes the gradient of its local batch on them (real math: `step.make_gradient_fn`) and
pushes (gradient, token) after its emulated step time; then it pulls again. The server handles pushes in emulated
time order:
- `gba`: it buffers them until they cover a global batch (R local batches), weights each by its staleness
  (`gba.staleness_weights`), applies their weighted mean with sync_sgd's optimizers and advances g;
- `async_sgd`: it applies every gradient on arrival, alone, with the same optimizers (no aggregation).
A worker whose step fails (`gba.failure_prob`) never pushes: its token is lost, its batch is not trained on, and the
server, which waits for gradients rather than for workers, goes on with the others.

Time is emulated: every (worker, step) has a seeded step time (`gba.WorkerStepTimes`), and the events run in that
order; the gradients are computed for real, one after the other, on one device. The summary reports the emulated
time and examples/sec beside the real ones, and what sync SGD would have taken on the same step times (each global
step waits for its slowest worker). Checkpoints have sync_sgd's layout (the server model stacked R times), so a
run switches between `sync_sgd` and `gba` through its workdir with no other change; at a checkpoint the workers
drain (finish their in-flight steps) so that the stream position is one step for all of them.

In a job of several processes the workers are the job's replicas, running for real: `gba_processes`, which shares
this module's `Server`, checkpoint layout and summary.
"""

import heapq
import pathlib
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from shadowsync_jax import checkpointing
from shadowsync_jax import evaluation
from shadowsync_jax import gba
from shadowsync_jax import input_pipeline
from shadowsync_jax import metric_writer
from shadowsync_jax import model as model_lib
from shadowsync_jax import progress
from shadowsync_jax import replicas
from shadowsync_jax import step as step_lib
from shadowsync_jax.batch import Batch

ALGORITHMS = ('gba', 'async_sgd')


class Gradient(NamedTuple):
  """What a worker pushes: the token it pulled with and the gradient of its batch (None fields: the worker failed)."""
  worker: int
  token: int
  loss: jax.Array | None
  mlp_grads: Any
  row_ids_N: jax.Array | None
  row_grads_NxD: jax.Array | None


class WorkerData:
  """Worker r's local step k is replica r's slice of global step k; read a chunk of global steps at a time (one
  contiguous read) and kept until every worker has passed it (workers drift apart under stragglers)."""

  def __init__(self, source: input_pipeline.Source, num_workers: int, batch_size: int, total_steps: int,
               chunk_steps: int = 16):
    self._source, self._num_workers, self._batch_size = source, num_workers, batch_size
    self._total_steps, self._chunk_steps = total_steps, chunk_steps
    self._chunks: dict[int, Batch] = {}

  def batch(self, worker: int, step: int) -> Batch:
    chunk = step // self._chunk_steps
    if chunk not in self._chunks:
      first = chunk * self._chunk_steps
      count = min(first + self._chunk_steps, self._total_steps) - first
      flat = self._source.read(first * self._num_workers * self._batch_size,
                               count * self._num_workers * self._batch_size)
      self._chunks[chunk] = Batch(*(x.reshape(count, self._num_workers, self._batch_size, *x.shape[1:])
                                    for x in flat))
    return Batch(*(x[step % self._chunk_steps, worker] for x in self._chunks[chunk]))

  def forget_before(self, step: int) -> None:
    """No worker reads a step before `step` again."""
    for chunk in [c for c in self._chunks if (c + 1) * self._chunk_steps <= step]:
      del self._chunks[chunk]


class Server:
  """The parameter server: one train state, the gradient buffer of the current global batch, and the token
  bookkeeping (staleness, decayed and dropped gradients)."""

  def __init__(self, state: step_lib.TrainState, config: ml_collections.ConfigDict, donate: bool = True):
    """`donate`: update the state in place (False when another thread may still read the params it replaces)."""
    self.state, self.global_step = state, int(state.step)
    self._aggregating = config.sync.algorithm == 'gba'
    self._num_gradients = config.num_replicas if self._aggregating else 1
    self._threshold, self._decay = config.gba.staleness_threshold, config.gba.staleness_decay
    mlp_optimizer, embedding_optimizer = make_optimizers(config)
    apply = step_lib.make_apply_fn(mlp_optimizer, embedding_optimizer)

    def aggregate_and_apply(state, mlp_grads_K, row_ids_K, row_grads_K, weights_K):
      return apply(state, *gba.aggregate(mlp_grads_K, row_ids_K, row_grads_K, weights_K, self._num_gradients))

    self._apply = jax.jit(aggregate_and_apply, donate_argnums=0 if donate else ())
    self._buffer: list[Gradient] = []
    self.staleness: list[int] = []
    self.weights: list[float] = []
    self.updates = 0

  def receive(self, gradient: Gradient) -> None:
    self._buffer.append(gradient)
    if len(self._buffer) == self._num_gradients:
      self._apply_buffer()

  def flush(self) -> None:
    """Applies a partly filled global batch (lost tokens leave one at a drain): its missing gradients count as
    zero, so the update is as small as the examples that arrived."""
    if self._buffer:
      missing = self._num_gradients - len(self._buffer)
      self._apply_buffer(padding=missing)

  def _apply_buffer(self, padding: int = 0) -> None:
    staleness_K = np.array([self.global_step - g.token for g in self._buffer])
    weights_K = (gba.staleness_weights(staleness_K, self._threshold, self._decay) if self._aggregating
                 else np.ones(len(staleness_K), np.float32))
    self.staleness.extend(staleness_K.tolist())
    self.weights.extend(weights_K.tolist())
    gradients = self._buffer + [self._buffer[0]] * padding  # Weight 0: a zero update of rows already touched.
    weights_K = np.concatenate([weights_K, np.zeros(padding, np.float32)])
    self.state = self._apply(self.state, tuple(g.mlp_grads for g in gradients), tuple(g.row_ids_N for g in gradients),
                             tuple(g.row_grads_NxD for g in gradients), weights_K)
    self._buffer = []
    self.global_step += 1
    self.updates += 1

  def stats(self) -> dict[str, Any]:
    staleness, weights = np.array(self.staleness), np.array(self.weights)
    return {
        'gba_global_steps': self.global_step,
        'gba_server_updates': self.updates,
        'mean_staleness': float(staleness.mean()) if staleness.size else None,
        'max_staleness': int(staleness.max()) if staleness.size else None,
        'decayed_gradients': int(np.sum((weights < 1) & (weights > 0))),
        'dropped_gradients': int(np.sum(weights == 0)),
    }


class Emulation:
  """The discrete-event loop: workers pull, compute and push in the order their emulated step times give."""

  def __init__(self, server: Server, data: WorkerData, times: gba.WorkerStepTimes, gradient_fn, start_step: int):
    self.server, self._data, self._times, self._gradient_fn = server, data, times, gradient_fn
    self.now = 0.0  # Emulated seconds since this run (or its resumption) began.
    self.next_step = [start_step] * times.seconds_RxK.shape[0]
    self._in_flight: list[tuple[float, int, Gradient]] = []  # Heap by (arrival time, worker).
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
      gradient = Gradient(worker, token, None, None, None, None)
    else:
      loss, mlp_grads, row_ids_N, row_grads_NxD = self._gradient_fn(self.server.state.params,
                                                                    self._data.batch(worker, step))
      gradient = Gradient(worker, token, loss, mlp_grads, row_ids_N, row_grads_NxD)
    heapq.heappush(self._in_flight, (self.now + self._times.seconds_RxK[worker, step], worker, gradient))
    self.next_step[worker] = step + 1


def make_optimizers(config: ml_collections.ConfigDict):
  """sync_sgd's optimizers, from the same function train.py uses: the tuning-free switch needs the very same ones."""
  from shadowsync_jax import train  # pylint: disable=g-import-not-at-top  (train imports this module)
  return train.make_optimizers(config)


def init_server_state(config: ml_collections.ConfigDict) -> step_lib.TrainState:
  """The model every run of `config` starts from (train.py's replica 0, from the same seed)."""
  mlp_optimizer, embedding_optimizer = make_optimizers(config)
  return step_lib.init_train_state(
      jax.random.key(config.seed), model_lib.from_config(config.model), list(config.data.cardinalities),
      config.model.embedding_dim, mlp_optimizer, embedding_optimizer)


def stacked_abstract(state: step_lib.TrainState, mesh) -> Any:
  """The checkpoint layout of sync_sgd (the model on every replica of `mesh`), as restore targets."""
  num_replicas, sharding = mesh.shape[replicas.REPLICA_AXIS], replicas.replica_sharding(mesh)
  stacked = jax.tree.map(lambda x: jax.ShapeDtypeStruct((num_replicas, *x.shape), x.dtype, sharding=sharding), state)
  return checkpointing.training_tree(stacked, None)


def server_state_from_checkpoint(tree: Any, workdir: pathlib.Path) -> step_lib.TrainState:
  """Replica 0 of a checkpoint's stacked train state, after checking that every replica holds the same params
  (a sync_sgd, gba or async_sgd checkpoint does; R independent models do not make one server model)."""
  stacked = tree['train']
  for path, leaf in jax.tree_util.tree_leaves_with_path(stacked.params):
    host = np.asarray(leaf)
    if not all(np.array_equal(host[0], host[r]) for r in range(1, host.shape[0])):
      raise ValueError(f'The checkpoint in {workdir} holds different models on its replicas (at params'
                       f'{jax.tree_util.keystr(path)}): it comes from a run whose replicas were not one model '
                       '(sync.algorithm none or model averaging), and gba/async_sgd resume one server model. '
                       'Resume it with its own sync.algorithm, or use a new workdir.')
  return jax.tree.map(lambda x: jnp.asarray(np.asarray(x[0])), stacked)  # Uncommitted, like a fresh state.


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
  """Trains `config` (sync.algorithm gba or async_sgd; validated by the caller) in `workdir`, resuming from its
  newest checkpoint (one of sync_sgd's too); returns the summary written to summary.json, with train.py's keys and
  the emulated figures. When `config.train.stop_at_step` stops it early, returns {'stopped_at_step': step}."""
  wall_start = time.perf_counter()
  if config.sync.algorithm not in ALGORITHMS:
    raise ValueError(f'sync.algorithm={config.sync.algorithm!r}: gba_training runs {", ".join(ALGORITHMS)}.')
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  num_workers, batch_size = config.num_replicas, config.batch_size
  examples_per_step = num_workers * batch_size
  total_steps = input_pipeline.num_steps(config.data.num_train_examples, num_workers, batch_size)
  stop_step = min(config.train.stop_at_step or total_steps, total_steps)

  state = init_server_state(config)
  mesh = replicas.make_mesh(num_workers)
  checkpointer = checkpointing.Checkpointer(workdir / 'checkpoints', config.train.checkpoint_every_steps)
  restored = checkpointer.restore_latest(stacked_abstract(state, mesh))
  start_step = 0
  if restored is not None:
    tree, start_step = restored
    state = server_state_from_checkpoint(tree, workdir)
    print(f'Resumed from the checkpoint at step {start_step} of {total_steps} in {workdir} '
          f'(global step {int(state.step)}).')
  train_source, eval_source = input_pipeline.make_sources(config.data, config.seed)
  times = gba.WorkerStepTimes.sample(config.gba, num_workers, total_steps, config.seed)
  gradient_fn = jax.jit(step_lib.make_gradient_fn(model_lib.from_config(config.model),
                                                  list(config.data.cardinalities)))
  server = Server(state, config)
  emulation = Emulation(server, WorkerData(train_source, num_workers, batch_size, total_steps), times, gradient_fn,
                        start_step)
  writer = metric_writer.MetricWriter(workdir)
  progress_line = progress.ProgressLine(total_steps, examples_per_step, every_seconds=config.train.progress_every_s)
  clock = _RealClock(start_step)
  logged = {'global_step': server.global_step, 'emulated_s': 0.0, 'real_s': time.perf_counter(), 'gradients': 0}

  def after_arrivals():
    clock.after_arrivals(emulation)
    progress_line.update(min(server.global_step, total_steps))
    if server.global_step - logged['global_step'] >= config.train.log_every_steps and emulation.losses:
      now, steps = time.perf_counter(), server.global_step - logged['global_step']
      writer.write_scalars(server.global_step, {
          'train_loss': float(np.mean(jax.device_get(emulation.losses))),
          'examples_per_sec': steps * examples_per_step / (now - logged['real_s']),
          'emulated_examples_per_sec': steps * examples_per_step / max(emulation.now - logged['emulated_s'], 1e-12),
          'mean_staleness': float(np.mean(server.staleness[logged['gradients']:]))})
      emulation.losses.clear()
      logged.update(global_step=server.global_step, emulated_s=emulation.now, real_s=now,
                    gradients=len(server.staleness))

  boundaries = checkpointer.boundaries(start_step, stop_step)
  for boundary in boundaries:
    emulation.run_until(boundary, after_arrivals)
    checkpointer.save(boundary, checkpointing.training_tree(replicas.replicate(server.state, mesh), None))
  jax.block_until_ready(server.state)
  real_seconds = clock.seconds(emulation)
  checkpointer.close()
  progress_line.finish()
  if stop_step < total_steps:
    writer.close()
    print(f'Stopped at step {stop_step} of {total_steps}; rerun with the same workdir to resume.')
    return {'stopped_at_step': stop_step}

  eval_metrics = evaluation.evaluate(config, jax.tree.map(np.asarray, server.state.params), None, eval_source)
  trained_examples = (total_steps - start_step) * examples_per_step
  sync_time_s = times.sync_time_s(start_step, total_steps)
  examples_per_sec = clock.examples_per_sec(batch_size)
  summary = server_summary(config, eval_metrics, server, start_step, [examples_per_sec], emulation.lost_tokens)
  summary.update({
      'real_time_s': real_seconds,
      'emulated_time_s': float(emulation.now),
      'emulated_examples_per_sec': float(trained_examples / emulation.now) if emulation.now > 0 else None,
      'sync_sgd_emulated_time_s': sync_time_s,
      'sync_sgd_emulated_examples_per_sec': trained_examples / sync_time_s if sync_time_s > 0 else None,
      'wall_time_s': time.perf_counter() - wall_start,
      'config': config.to_dict(),
  })
  writer.write_scalars(total_steps, {f'eval_{k}': v for k, v in eval_metrics.items() if isinstance(v, (int, float))})
  writer.close()
  metric_writer.write_summary(workdir, summary)
  return summary


def server_summary(config: ml_collections.ConfigDict, eval_metrics: dict[str, Any], server: Server, start_step: int,
                   examples_per_sec_per_process: list[float | None], lost_tokens: int) -> dict[str, Any]:
  """The summary.json keys of train.py (DESIGN §9) for a run of one server model, and the server's statistics."""
  total_steps = input_pipeline.num_steps(config.data.num_train_examples, config.num_replicas, config.batch_size)
  known = [x for x in examples_per_sec_per_process if x is not None]
  return {
      'eval_ne': eval_metrics['ne'],
      'eval_auc': eval_metrics['auc'],
      'eval_logloss': eval_metrics['logloss'],
      'eval_calibration': eval_metrics['calibration'],
      'bayes_ne': eval_metrics['bayes_ne'],
      'eval_ne_per_replica': None,
      'examples_per_sec': sum(known) if known else None,
      'examples_per_sec_per_process': examples_per_sec_per_process,
      'train_examples': total_steps * config.num_replicas * config.batch_size,
      'train_steps': total_steps,
      'resumed_from_step': start_step,
      'num_replicas': config.num_replicas,
      'num_processes': len(examples_per_sec_per_process),
      'sync_algorithm': config.sync.algorithm,
      # Every worker pulls the server model before every step: a sync gap of 1, staleness aside (below).
      'sync_rounds': server.updates,
      'mean_sync_gap': 1.0 if server.updates else None,
      'max_sync_gap': 1 if server.updates else None,
      'mean_round_latency_s': None,
      'replica_divergence': 0.0,
      'straggler_sleep_s': 0.0,
      'recovery_mode': 'none',
      **server.stats(),
      'lost_tokens': lost_tokens,
  }


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

