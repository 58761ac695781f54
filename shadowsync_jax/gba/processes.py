"""GBA and async SGD across processes, for real: each process holds a copy of the server, a thread exchanges gradients.

  # every process of a `jax.distributed` job, with sync.algorithm 'gba' or 'async_sgd':
  summary = processes.train_and_evaluate(config, workdir)   # train.train_and_evaluate dispatches here

The one-process `emulated` orders its workers' pushes by emulated step times; here the workers are the job's R
replicas, L on each process, really running at their own pace (a straggler: `straggler.process`/`slowdown`). The
server of docs/design.md §8 is kept as one identical copy per process (a `server.Server`):

- the training loop (each process's L workers, one vmapped gradient per local step) takes the newest server params
  and global step g (the token), computes its L gradients on them and pushes them to the process's outbox. It
  never issues a collective. It waits while `gba.max_in_flight_steps` of its steps are not yet in the server copy:
  with 1 (the default) a worker pushes, then pulls a server that holds its gradient, as a parameter-server worker
  does; more overlaps computing with the exchange, at the price of staleness;
- the exchange thread, the only issuer of cross-process collectives (docs/design.md §3), loops rounds: it takes
  everything in the outbox, gathers every process's part (one all-gather of a `Codec`-packed array: the gradients
  and whether the process is done), and feeds them to its server copy in one order that every process shares (by
  process, then local step, then worker). Every copy applies the same gradients in the same order with the same jitted
  function, so all stay one model: bit for bit on CPU, where XLA is deterministic; the summary's
  `consensus_fingerprint_per_process` shows it (on GPUs scatter-adds are not deterministic and the copies may
  drift apart by rounding, which the fingerprints would show; not tried on a GPU).

Staleness is real: g advances while a gradient is computed and waits in an outbox. `gba.failure_prob` loses tokens
as in the emulation (the gradient is computed, never sent). Checkpoints have sync_sgd's layout and are taken at
step boundaries where the exchange has drained (the thread ends once every process reached the boundary and all
gradients are applied; the training loop then saves with no other collective running), so a run switches between
`sync_sgd`, `gba` and `async_sgd` across processes as it does in one.
"""

from collections.abc import Sequence
import functools
import pathlib
import threading
import time
from typing import Any, NamedTuple

import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from shadowsync_jax.data import input_pipeline
from shadowsync_jax.gba import run as gba_run
from shadowsync_jax.gba import server as server_lib
from shadowsync_jax.gba import step_times
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.parallel import network
from shadowsync_jax.parallel import replicas
from shadowsync_jax.parallel import straggler

PyTree = Any
_POLL_S = 0.05  # How often a waiting thread checks for an error or a stop.
# A thread with an empty outbox waits this long for it before it enters the round anyway, doubling after every
# round that carried nothing anywhere: a busy job's rounds follow each other at once (a process with nothing to send
# would otherwise hold every other process's gradients for its wait), an idle job's spin slowly.
_IDLE_WAIT_MIN_S = 1e-4
_IDLE_WAIT_MAX_S = 0.005
_ABANDON_JOIN_S = 5.0  # How long a failing run waits for the thread to notice.


class StepGradients(NamedTuple):
  """What a process's L workers push after one local step: the token (global step g their params had), the step,
  which workers failed (their tokens are lost), and the stacked gradients ([L, ...] leaves)."""

  token: int
  step: int
  failed_L: np.ndarray  # bool [L]
  loss_L: Any
  mlp_grads_L: Any
  row_ids_LxN: Any
  row_grads_LxNxD: Any


class Codec:
  """Packs a process's part of one exchange round, up to `capacity` `StepGradients` and whether it is done, into
  one float32 array [1 + capacity, W] (one all-gather per round; integers travel bit for bit as float32 bits).
  Built from the shapes of one entry (`jax.eval_shape` of the gradient): a process can unpack before it computed
  anything."""

  def __init__(self, example: StepGradients, capacity: int):
    self.capacity = capacity
    self._mlp_def = jax.tree.structure(example.mlp_grads_L)
    self._float_shapes = [
      np.shape(x) for x in [example.loss_L, *jax.tree.leaves(example.mlp_grads_L), example.row_grads_LxNxD]
    ]
    self._ids_shape = np.shape(example.row_ids_LxN)
    self._num_workers = len(example.failed_L)
    self._num_ints = 2 + self._num_workers + int(np.prod(self._ids_shape))
    self._width = self._num_ints + sum(int(np.prod(shape)) for shape in self._float_shapes)

  def pack(self, entries: list[StepGradients], done: bool) -> np.ndarray:
    """Row 0: (number of entries, done); then one row per entry; zeros after."""
    if len(entries) > self.capacity:
      raise ValueError(f'{len(entries)} entries exceed the capacity of {self.capacity}.')
    packed = np.zeros((1 + self.capacity, self._width), np.float32)
    ints = packed.view(np.int32)  # The same memory: integers stored as they are.
    ints[0, :2] = len(entries), done
    for k, entry in enumerate(entries, start=1):
      ints[k, : self._num_ints] = np.concatenate(
        [[entry.token, entry.step], entry.failed_L, np.ravel(entry.row_ids_LxN)]
      )
      leaves = [entry.loss_L, *jax.tree.leaves(entry.mlp_grads_L), entry.row_grads_LxNxD]
      packed[k, self._num_ints :] = np.concatenate([np.ravel(np.asarray(x, np.float32)) for x in leaves])
    return packed

  def unpack(self, packed: np.ndarray) -> tuple[list[StepGradients], bool]:
    """A process's entries (numpy leaves) and whether it is done, from its packed array."""
    ints = np.ascontiguousarray(packed).view(np.int32)
    count, done = int(ints[0, 0]), bool(ints[0, 1])
    entries = []
    for k in range(1, 1 + count):
      leaves, offset = [], self._num_ints
      for shape in self._float_shapes:
        size = int(np.prod(shape))
        leaves.append(packed[k, offset : offset + size].reshape(shape))
        offset += size
      loss_L, *mlp_leaves, row_grads_LxNxD = leaves
      failed_L = ints[k, 2 : 2 + self._num_workers].astype(bool)
      row_ids_LxN = ints[k, 2 + self._num_workers : self._num_ints].reshape(self._ids_shape)
      entries.append(
        StepGradients(
          int(ints[k, 0]),
          int(ints[k, 1]),
          failed_L,
          loss_L,
          jax.tree.unflatten(self._mlp_def, mlp_leaves),
          row_ids_LxN,
          row_grads_LxNxD,
        )
      )
    return entries, done


class GradientExchange:
  """The exchange thread of one segment of training (up to a checkpoint or the end) and the outbox it drains.

  exchange = GradientExchange(server, codec, max_in_flight_steps)
  exchange.start()                     # the thread reserves the job's collectives until it ends
  params, token = exchange.pull()      # training loop: the newest server params and global step, once fewer
                                       # than max_in_flight_steps of its steps are not yet in the server copy
  exchange.push(StepGradients(...))    # raises the thread's error
  exchange.finish()                    # this process is at the boundary: returns when every process is, and every
                                       # gradient of the job is applied (the servers then agree)
  """

  def __init__(self, server: server_lib.Server, codec: Codec, max_in_flight_steps: int):
    self.server, self._codec, self._max_in_flight = server, codec, max_in_flight_steps
    self._pushed = self._applied = 0  # This process's local steps pushed, and applied by the server copy.
    self._latest = (server.state.params, server.global_step)
    self._outbox: list[StepGradients] = []
    self._changed = threading.Condition()
    self._done = False  # This process pushed its last gradients of the segment.
    self._stop = threading.Event()
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._run, name='gba-exchange', daemon=True)
    self._idle_wait_s = _IDLE_WAIT_MIN_S
    self.rounds = 0
    self._first_global_step = server.global_step
    self._first_update_round: int | None = None  # The round in which the server copy first updated, if it has.
    self.lost_tokens = 0
    self.losses: list[float] = []  # Of the gradients applied, for the train-loss metric; the caller clears it.

  def start(self) -> None:
    replicas.reserve_collectives(self._thread)
    self._thread.start()

  def pull(self) -> tuple[PyTree, int]:
    """(server params, global step), after waiting for room: fewer than `max_in_flight_steps` pushed steps of this
    process not yet received by the server copy."""
    with self._changed:
      while self._pushed - self._applied >= self._max_in_flight and self._error is None:
        self._changed.wait(timeout=_POLL_S)
      self._raise_if_failed()
      return self._latest

  def warmed_up(self) -> bool:
    """Whether every copy of the server has updated, so compiled its programs: a round has ended since this copy's
    first update (every copy applies the same gradients in the same round, and a round waits for every process)."""
    first = self._first_update_round
    return first is not None and self.rounds > first

  def push(self, gradients: StepGradients) -> None:
    with self._changed:
      self._raise_if_failed()
      self._outbox.append(gradients)
      self._pushed += 1
      self._changed.notify_all()

  def finish(self) -> None:
    with self._changed:
      self._done = True
      self._changed.notify_all()
    try:
      while self._thread.is_alive():
        self._thread.join(timeout=_POLL_S)
    finally:
      replicas.reserve_collectives(None)
    self._raise_if_failed()

  def abandon(self) -> None:
    """The run is failing: stop the thread (it may be stuck in a collective with a dead process: not forever)."""
    self._stop.set()
    self._thread.join(timeout=_ABANDON_JOIN_S)
    replicas.reserve_collectives(None)

  def _raise_if_failed(self) -> None:
    if self._error is not None:
      raise self._error

  def _run(self) -> None:
    try:
      while not self._stop.is_set():
        if not self._round():
          self.server.flush()  # Lost tokens can leave a global batch part full at the boundary.
          self._publish()
          return
    except BaseException as error:  # pylint: disable=broad-except  (handed to the training thread as it is)
      with self._changed:
        self._error = error
        self._changed.notify_all()

  def _take_unsent(self) -> tuple[list[StepGradients], bool]:
    """Everything in the outbox (waiting a moment when it is empty) and whether this process is done."""
    with self._changed:
      if not self._outbox and not self._done:
        self._changed.wait(timeout=self._idle_wait_s)
      entries, self._outbox = self._outbox, []
      return entries, self._done

  def _round(self) -> bool:
    """One exchange; False once every process is done and nothing is left to apply anywhere."""
    entries, done = self._take_unsent()
    packed_P = np.asarray(_gather(self._codec.pack(entries, done)))
    self.rounds += 1
    parts = [self._codec.unpack(packed) for packed in packed_P]
    if all(done and not received for received, done in parts):
      return False
    busy = any(received for received, _ in parts)
    self._idle_wait_s = _IDLE_WAIT_MIN_S if busy else min(2 * self._idle_wait_s, _IDLE_WAIT_MAX_S)
    for process, (received, _) in enumerate(parts):  # One order on every process: by process, then local step.
      for entry in received:
        self._receive(process, entry)
    if self._first_update_round is None and self.server.global_step > self._first_global_step:
      self._first_update_round = self.rounds
    self._publish()
    with self._changed:
      self._applied += len(entries)
      self._changed.notify_all()
    return True

  def _receive(self, process: int, entry: StepGradients) -> None:
    num_local = len(entry.failed_L)
    for local in range(num_local):
      if entry.failed_L[local]:
        self.lost_tokens += 1
        continue
      pick = lambda x, local=local: x[local]
      self.losses.append(float(entry.loss_L[local]))
      self.server.receive(
        server_lib.Gradient(
          process * num_local + local,
          entry.token,
          entry.loss_L[local],
          jax.tree.map(pick, entry.mlp_grads_L),
          entry.row_ids_LxN[local],
          entry.row_grads_LxNxD[local],
        )
      )

  def _publish(self) -> None:
    self._latest = (self.server.state.params, self.server.global_step)


def _gather(tree: PyTree) -> PyTree:
  """Every process's `tree` (host arrays of one shape everywhere), stacked on a new leading axis: a collective."""
  replicas.check_collective_thread('the gradient exchange')
  return multihost_utils.process_allgather(tree)


def make_local_gradient_fn(model_config: ml_collections.ConfigDict, cardinalities: Sequence[int]):
  """`gradients(params, batch_L) -> (loss_L, mlp_grads_L, row_ids_LxN, row_grads_LxNxD)`: the L local workers'
  gradients on the same params (one jitted, vmapped `step.make_gradient_fn`) of a run's `model` section."""
  gradient_fn = step_lib.make_gradient_fn(dlrm.from_config(model_config), list(cardinalities))
  return jax.jit(jax.vmap(gradient_fn, in_axes=(None, 0)))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
  """Trains `config` (gba or async_sgd, validated by the caller) as every process of the job, resuming from the
  newest checkpoint in `workdir` (one of sync_sgd's too); returns the summary (process 0 writes summary.json), or
  {'stopped_at_step': step} when `config.train.stop_at_step` stops it early."""
  traffic = network.TrafficCounter()  # Bytes this process puts on the wire (null on 127.0.0.1).
  num_processes, process_index = jax.process_count(), jax.process_index()
  num_workers, batch_size = config.num_replicas, config.batch_size
  num_local = num_workers // num_processes
  workers = range(process_index * num_local, (process_index + 1) * num_local)
  # The training loop may still read replaced params: no donation.
  run = gba_run.start(config, workdir, replicas.make_meshes(num_workers), donate=False)
  server, start_step, total_steps = run.server, run.start_step, run.total_steps
  batches = input_pipeline.train_batches(
    run.train_source, num_workers, batch_size, config.data.num_train_examples, start_step=start_step, replicas=workers
  )
  fails_RxK = step_times.WorkerStepTimes.sample(config.gba, num_workers, total_steps, config.seed).fails_RxK
  gradient_fn = make_local_gradient_fn(config.model, config.data.cardinalities)
  example_batch = input_pipeline.read_global_batch(run.train_source, num_workers, batch_size, 0, replicas=workers)
  codec = Codec(
    StepGradients(0, 0, np.zeros(num_local, bool), *jax.eval_shape(gradient_fn, server.state.params, example_batch)),
    capacity=config.gba.max_in_flight_steps,
  )  # At most that many steps wait in the outbox.
  delay = straggler.from_config(config.straggler, process_index)

  step, rounds, lost_tokens = start_step, 0, 0
  warm, busy_s, busy_steps, window = False, 0.0, 0, (time.perf_counter(), step)
  for boundary in gba_run.segments(run):
    exchange = GradientExchange(server, codec, config.gba.max_in_flight_steps)
    exchange.start()
    try:
      # This process's own pace: its steps, not the waits at boundaries for the others, nor the warm-up: the first
      # step compiles the gradient, and the server copies compile their update when the first global batch is full,
      # a wait of a second or more for every process (on a loaded machine, as long as a short run's steps).
      segment_start, results = time.perf_counter(), None
      while step < boundary:
        params, token = exchange.pull()
        if not warm and exchange.warmed_up():
          warm, segment_start = True, time.perf_counter()
          delay.restart()  # The wait for the servers' compilation is not a step: a straggler does not multiply it.
        batch = next(batches)
        delay.sleep_before(1)  # A straggler sleeps before its step.
        results = gradient_fn(params, batch)
        jax.block_until_ready(results)  # A worker computes one gradient at a time: it pulls again after pushing.
        delay.time_block(results[0], 1)  # One step a dispatch: a worker pulls after every push.
        exchange.push(StepGradients(token, step, fails_RxK[workers.start : workers.stop, step], *results))
        step += 1
        if warm:
          busy_steps += 1
        else:
          segment_start = time.perf_counter()  # Not yet a step of its pace (nothing timed).
        run.progress_line.update(step)
        if step % config.train.log_every_steps == 0 and exchange.losses:
          now = time.perf_counter()
          run.writer.write_scalars(
            step,
            {
              'train_loss': float(np.mean(exchange.losses)),
              'examples_per_sec': (step - window[1]) * num_local * batch_size / (now - window[0]),
              'gba_global_steps': server.global_step,
            },
          )
          exchange.losses.clear()
          window = (now, step)
      jax.block_until_ready(results)
      busy_s += time.perf_counter() - segment_start
      exchange.finish()  # Every process at the boundary, every gradient applied: the servers agree.
    except BaseException:
      exchange.abandon()
      raise
    rounds, lost_tokens = rounds + exchange.rounds, lost_tokens + exchange.lost_tokens

  # The server model on the host, read once and only where the run evaluates it (not where it stopped early).
  params = functools.cache(lambda: jax.tree.map(np.asarray, server.state.params))
  local_examples_per_sec = busy_steps * num_local * batch_size / busy_s if busy_s > 0 else 0.0

  def job_figures() -> dict[str, Any]:
    net_bytes_sent, net_bytes_received = (network.per_process(count) for count in traffic.bytes())
    return {
      'net_bytes_sent': net_bytes_sent,  # Per process; null on 127.0.0.1 (parallel/network.py).
      'net_bytes_received': net_bytes_received,
      'consensus_fingerprint_per_process': replicas.fingerprints_per_process(params()),
      **straggler.summary(delay, config.straggler.process),  # straggler_sleep_s, straggler_step_s
      'exchange_rounds': rounds,
    }

  examples_per_sec = lambda: [float(x) for x in replicas.gather_from_processes(local_examples_per_sec)]
  return gba_run.finish(run, params, examples_per_sec, lost_tokens, more=job_figures)
