"""One training run end to end: R replicas over a one-pass stream, checkpoints, metrics, a final evaluation.

  from shadowsync_jax import config as config_lib
  from shadowsync_jax import train
  config = config_lib.base_config()
  summary = train.train_and_evaluate(config, workdir='/tmp/run')
  print(summary['eval_ne'], summary['bayes_ne'])

`train_and_evaluate` validates the config before anything compiles, resumes from the newest checkpoints in
`workdir/checkpoints` if there are any, streams scalars to `workdir` (TensorBoard events and `metrics.jsonl`),
prints a progress line, and writes `workdir/summary.json` (docs/design.md §9) when the stream is done. The recovery
policy owns the checkpoints (`recovery.policies`): in one process with `recovery.mode` set, failures are emulated and
recovered from at block boundaries; otherwise failures are real, and a job started again restores what its
restart plan says (docs/design.md §7).

The loop dispatches blocks of steps (docs/design.md §13): `block_plan` sizes each (K steps, or fewer where a hook is
due: a log step, a checkpoint, a round, a failure), `input_pipeline.BlockReader` reads the next block while this one
trains, `make_train_block` runs a block in one dispatch, and the hooks act at its boundary (`next_due`,
`at_boundary`). Nothing is read back from the device inside a block: the losses wait on the device for the next
metric write.

In a job of several processes (`distributed.initialize` first; `experiments.launch` starts them) every process
calls it with the same config and workdir: each trains its own replicas on its own part of the stream and
checkpoints them at its own pace, the sync driver couples them, all of them evaluate the same consensus model, and
process 0 writes the metrics and `summary.json`. Every process returns the summary.
"""

from collections.abc import Callable, Sequence
import functools
import pathlib
import socket
import time
from typing import Any, NamedTuple

import jax
from jax import lax
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np
import psutil

from shadowsync_jax import block_plan
from shadowsync_jax import config as config_lib
from shadowsync_jax import hooks
from shadowsync_jax.data import batch as batch_lib
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.data import readers as readers_lib
from shadowsync_jax.data import synthetic
from shadowsync_jax.data import synthetic_device
from shadowsync_jax.gba import emulated as gba_emulated
from shadowsync_jax.gba import processes as gba_processes
from shadowsync_jax.metrics import evaluation
from shadowsync_jax.metrics import progress
from shadowsync_jax.metrics import writer as metric_writer
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import optimizers
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.model import table_placement
from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import network
from shadowsync_jax.parallel import replicas
from shadowsync_jax.parallel import straggler
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import policies as recovery_policies
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import drivers as sync_drivers


def init_replicated_state(config: ml_collections.ConfigDict, meshes: replicas.ReplicaMeshes) -> step_lib.TrainState:
  """This process's part of the job's train state, [L, ...] on `meshes.local`, each device's built where it lives:
  its replica's copy of the model (every replica of the job starts from the same one: every process builds it from
  the same seed) and, with sharded tables, its own shard of them (`table_placement`)."""
  return _state_builder(config, meshes)(jax.random.key(config.seed))


def abstract_state(config: ml_collections.ConfigDict, meshes: replicas.ReplicaMeshes) -> step_lib.TrainState:
  """The shapes and dtypes of `init_replicated_state`, without allocating it."""
  return jax.eval_shape(_state_builder(config, meshes), jax.random.key(config.seed))


def _state_builder(config: ml_collections.ConfigDict, meshes: replicas.ReplicaMeshes):
  mlp_optimizer, embedding_optimizer = optimizers.make_optimizers(config.optimizer)
  cardinalities, placement = list(config.data.cardinalities), config.sync.embedding_placement
  layout = table_placement.ShardLayout(int(sum(cardinalities)), config.num_replicas)
  num_local = meshes.local.shape[replicas.REPLICA_AXIS]
  first_shard = jax.process_index() * num_local

  rows = table_placement.rows_held(placement, layout.num_rows, layout.num_shards)

  def one_device(key):
    global_row = lambda local_rows: local_rows
    if placement == 'sharded':
      global_row = functools.partial(layout.global_rows, first_shard + lax.axis_index(replicas.REPLICA_AXIS))
    state = step_lib.init_train_state(
      key,
      dlrm.from_config(config.model),
      cardinalities,
      config.model.embedding_dim,
      mlp_optimizer,
      embedding_optimizer,
      table_rows=rows,
      global_row=global_row,
    )
    return replicas.unsqueeze(state)

  spec = P(replicas.REPLICA_AXIS)
  built = jax.shard_map(one_device, mesh=meshes.local, in_specs=P(), out_specs=spec, check_vma=False)
  return jax.jit(built, out_shardings=replicas.replica_sharding(meshes.local))


def make_train_step(config: ml_collections.ConfigDict, meshes: replicas.ReplicaMeshes):
  """`train_step(state_L, batch_L) -> (state_L, metrics_L)`, jitted over this process's replicas (the batch placed
  on `meshes.local` with `replicas.shard`).

  It stays inside the process (`meshes.local`), but where every replica of the job takes part in every step: sync
  SGD averages gradients across the job, and sharded tables are looked up and updated across it (`meshes.job`).
  Shared embedding placement applies all the process's replicas' sparse gradients to every copy of the table.
  """
  return _on_meshes(replicas.make_replicated_step, config, meshes)


def make_train_block(config: ml_collections.ConfigDict, meshes: replicas.ReplicaMeshes, between=None):
  """`train_block(state_L, block_L, steps_L) -> (state_L, metrics_LxK)`: the first `steps` of a block's K batches
  ([L, K, B, ...], `input_pipeline.read_block`), trained one after the other in one dispatch
  (`replicas.make_replicated_block`); `steps_L` is [L] int32 of one value, `replicas.shard`ed like the block. The
  step is `make_train_step`'s, collectives and all. With `between` (a sync driver's rounds fused into the block,
  `SyncDriver.between_steps`) the block takes and returns its carry as well."""
  return _on_meshes(functools.partial(replicas.make_replicated_block, between=between), config, meshes)


def _on_meshes(replicated, config: ml_collections.ConfigDict, meshes: replicas.ReplicaMeshes):
  """The one-replica train step of `config`, made replicated by `replicated(step_fn, mesh)` on the mesh its
  collectives need, taking and returning this process's replicas."""
  mlp_optimizer, embedding_optimizer = optimizers.make_optimizers(config.optimizer)
  sync_sgd = config.sync.algorithm == 'sync_sgd'
  placement = table_placement.make(
    config.sync.embedding_placement,
    int(sum(config.data.cardinalities)),
    replicas.REPLICA_AXIS,
    config.num_replicas,
    config.sync.shard_exchange,
    mean_gradients=sync_sgd,
  )
  step_fn = step_lib.make_train_step(
    dlrm.from_config(config.model),
    list(config.data.cardinalities),
    mlp_optimizer,
    embedding_optimizer,
    grad_axis_name=replicas.REPLICA_AXIS if sync_sgd else None,
    placement=placement,
  )
  step_mesh = meshes.job if _steps_are_collective(config) else meshes.local
  replicated_step = replicated(step_fn, step_mesh)
  if step_mesh is meshes.local:
    return replicated_step
  if isinstance(replicated_step, replicas.BlockProgram):
    return replicated_step._replace(job_meshes=meshes)

  def across_processes(state_L, *args_L):
    state_R, metrics_R = replicated_step(replicas.to_job(state_L, meshes), *replicas.to_job(args_L, meshes))
    return replicas.to_local(state_R, meshes), replicas.to_local(metrics_R, meshes)

  return across_processes


def check_memory(config: ml_collections.ConfigDict, meshes: replicas.ReplicaMeshes) -> int:
  """This process's train state in bytes; raises ConfigError, before anything is allocated, if the job's processes
  cannot hold theirs (`memory.shortfall`), naming what to change."""
  needed = memory.state_bytes(abstract_state(config, meshes))
  everyone = distributed.exchange('memory', {'host': socket.gethostname(), 'state_bytes': needed})
  problem = memory.shortfall([p['state_bytes'] for p in everyone], [p['host'] for p in everyone], jax.process_index())
  if problem is None:
    return needed
  placement = config.sync.embedding_placement
  cardinalities = config.data.cardinalities
  table_bytes = int(sum(cardinalities)) * config.model.embedding_dim * 4
  hints = ['lower data.cardinalities (the rows of each table) or model.embedding_dim']
  if placement != 'sharded' and config.num_replicas > 1:
    sharded = table_bytes / config.num_replicas * (config.num_replicas // jax.process_count())
    hints.insert(0, f'set sync.embedding_placement=sharded (each row held once: {memory.gb(sharded)} of tables here)')
  elif placement == 'sharded':
    hints.insert(0, 'spread the shards over more processes or hosts')
  raise config_lib.ConfigError(
    f'the train state ({memory.gb(table_bytes)} of tables, {placement}, {config.num_replicas // jax.process_count()} '
    f'replica(s) in this process) {problem}: {"; or ".join(hints)}.'
  )


# A write's replica divergence reads every replicated param: a write by seconds carries it no more often than costs
# this share of the time between (8 replicas of Criteo Kaggle's 2.3 GB of tables: about 3 s a divergence on 2 cores,
# which written every second held the job to a seventh of its pace). Writes at the steps asked for carry it all.
DIVERGENCE_SHARE = 0.02


class _MetricLog(hooks.Hook):
  """The metric stream's writes (train loss, examples/sec, replica divergence, the driver's statistics) every
  `train.log_every_steps` steps (a block ends there) or `train.log_every_s` seconds (at the first boundary after);
  the divergence with every write by steps, and with those by seconds no more often than its cost allows
  (`DIVERGENCE_SHARE`, timed in `prepare`).
  The blocks' losses stay on the device, and a write reads them one block late, at the next boundary, when the next
  block is already dispatched (docs/design.md §13: nothing read back inside a block, no bubble in the device's
  queue)."""

  def __init__(self, writer: metric_writer.MetricWriter, config: ml_collections.ConfigDict, examples_per_step: int):
    self._writer, self._config, self._examples_per_step = writer, config, examples_per_step
    self._every_steps, self._every_s = config.train.log_every_steps, config.train.log_every_s
    self._losses: list[tuple[jax.Array, int]] = []  # Each block's [L, K] losses and how many of its steps ran.
    self._pending: tuple[int, list[tuple[jax.Array, int]], float, jax.Array | None, dict[str, Any]] | None = None
    self._blocks = 0
    self._start = time.perf_counter()
    self._divergence_every_s, self._last_divergence = 0.0, 0.0

  def prepare(self, params: Any, first_step: int, stop_step: int) -> None:
    """Before the steps (not among the timed ones), where writes will come: compiles the replica divergence and
    times one, which sets how often writes carry it."""
    if not (bool(self._every_s) or stop_step // self._every_steps > first_step // self._every_steps):
      return
    replicated = _replicated_part(params, self._config)
    replicas.replica_divergence.lower(replicated).compile()
    started = time.perf_counter()
    jax.block_until_ready(replicas.replica_divergence(replicated))
    self._divergence_every_s = (time.perf_counter() - started) / DIVERGENCE_SHARE

  def next_due(self, step: int) -> int:
    return (step // self._every_steps + 1) * self._every_steps

  def at_boundary(self, b: hooks.Boundary) -> None:
    step, state, steps, metrics, driver = b.step, b.state, b.steps, b.metrics, b.driver
    self.flush()  # The write due at the last boundary: that block is done, or nearly.
    self._blocks += 1
    now = time.perf_counter()
    if self._blocks == 1:  # The first block compiled: the window starts after it (and the divergence's pace).
      self._start = self._last_divergence = now
      return
    self._losses.append((metrics['loss'], steps))
    by_steps = step % self._every_steps == 0
    if not by_steps and not (self._every_s and now - self._start >= self._every_s):
      return
    divergence = None
    if by_steps or now - self._last_divergence >= self._divergence_every_s:  # The steps asked for carry it all.
      # This process's replicas only: a job-wide figure would need a collective beside the shadow thread's.
      divergence = replicas.replica_divergence(_replicated_part(state.params, self._config))  # Dispatched, not read.
      self._last_divergence = now
    stats = {k: v for k, v in driver.stats().items() if v is not None}
    self._pending = (step, self._losses, now - self._start, divergence, stats)
    self._losses, self._start = [], now

  def end(self, b: hooks.Boundary) -> None:
    self.flush()

  def flush(self) -> None:
    """Writes the pending write, reading its values from the device."""
    if self._pending is None:
      return
    step, losses, seconds, divergence, stats = self._pending
    self._pending = None
    steps = sum(n for _, n in losses)
    loss_sum = sum(float(np.asarray(losses_LxK)[:, :n].mean(axis=0).sum()) for losses_LxK, n in losses)
    self._writer.write_scalars(
      step,
      {
        'train_loss': loss_sum / steps,
        'examples_per_sec': steps * self._examples_per_step / seconds,
        **({} if divergence is None else {'replica_divergence': float(divergence)}),
        **stats,
      },
    )


def generates_on_device(config: ml_collections.ConfigDict) -> bool:
  """`data.generator`: whether the synthetic stream's blocks are generated on the devices that train them ('auto':
  on accelerators; on CPU the host's readers run beside the steps)."""
  if config.data.generator == 'auto':
    return config.data.source == 'synthetic' and jax.default_backend() != 'cpu'
  return config.data.generator == 'device'


def _steps_are_collective(config: ml_collections.ConfigDict) -> bool:
  """Whether every step is a collective of the job: sync SGD's gradient mean, sharded tables' lookups."""
  return config.sync.algorithm == 'sync_sgd' or config.sync.embedding_placement == 'sharded'


class BlockDispatcher:
  """The loop's dispatching (docs/design.md §13): plans each block (`block_plan`), takes its batches from the reader
  (read while the block before trained), dispatches it, starts reading the next, and keeps one block in flight; while
  'auto' probes, times the blocks, then compiles the K it chose. `train_and_evaluate` and the timed windows of
  `studies.shadow_overhead` loop over it."""

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    meshes: replicas.ReplicaMeshes,
    source,
    stop_step: int,
    between=None,
    steps_per_dispatch: int | str | None = None,
    chosen: Callable[[int], None] = lambda steps: None,
    make_block: Callable[..., Any] | None = None,
  ):
    """`between`: a sync driver's rounds fused into the blocks (`SyncDriver.between_steps`); each `dispatch` is then
    given the driver (`rounds`) for the blocks' carry. `steps_per_dispatch`: K, or 'auto' (default: the config's);
    `chosen(K)` is called once 'auto' chose it (the job's, where the processes agree on one). `make_block`: what
    builds the block program from (config, meshes, between) (default `make_train_block`; a study's stand-in)."""
    self._config, self._meshes = config, meshes
    self._num_local = meshes.local.shape[replicas.REPLICA_AXIS]
    first = jax.process_index() * self._num_local
    max_steps = block_plan.max_steps_for(self._num_local * config.batch_size)
    if steps_per_dispatch is None:
      steps_per_dispatch = config.train.steps_per_dispatch
    self.plan = block_plan.BlockPlan(steps_per_dispatch, stop_step, max_steps)
    self._chosen = chosen
    local_replicas = range(first, first + self._num_local)
    if generates_on_device(config) and isinstance(getattr(source, 'source', None), synthetic.SyntheticSource):
      generator = synthetic_device.DeviceGenerator(source.source)
      self.reader = synthetic_device.DeviceBlockReader(
        generator,
        config.num_replicas,
        config.batch_size,
        self.plan.block_steps,
        local_replicas,
        meshes.local,
        replicas.REPLICA_AXIS,
        offset=source.offset,
      )
    else:
      self.reader = input_pipeline.BlockReader(
        source,
        config.num_replicas,
        config.batch_size,
        self.plan.block_steps,
        replicas=local_replicas,
        readers=readers_lib.count(config.data.readers),
        processes=config.data.reader_processes,
        place=lambda block: replicas.shard(block, meshes.local),
      )
    self._train_block = (make_block or make_train_block)(config, meshes, between)
    self._fused = between is not None
    self._rounds: Any = None  # The driver of the fused rounds, as the last `dispatch` was given it.
    self._in_flight = None
    self._placed_counts: dict[int, Any] = {}  # Steps of a block -> that count on each local device (never donated).
    self._collective = _steps_are_collective(config)  # A block that needs every peer: the watchdog is told of it.
    self._all_steps_compiled: int | None = None  # The K whose all-steps program is compiled (0: none will be).
    self.paused_s = 0.0  # Compiling the K 'auto' chose: no training time.
    self.waited = False  # The last dispatch waited for its own block ('auto' timing it): no block is in flight.

  def next_block(self, step: int, due_steps: Callable[[int], list[int | None]]) -> int:
    """The steps of the next block from `step`, cut at `due_steps(step)` (the steps where hooks act next, seen
    from a step)."""
    return self.plan.next_block(step, due_steps(step))

  def dispatch(
    self, state_L: Any, step: int, steps: int, due_steps: Callable[[int], list[int | None]], rounds: Any = None
  ) -> tuple[Any, dict, batch_lib.Batch]:
    """(state, metrics, block): the block of `steps` from `step` (`next_block`'s), dispatched; the block before it
    done. The block after it is read meanwhile, as long as `due_steps` of its first step says it will be: blocks
    cut short by events every few steps read no more than they train (a CPR run's priority saves every 7 steps had
    K=64 steps of data read for each). `rounds`: the sync driver whose rounds the blocks fuse (`block_carry`,
    `after_block`), where `between` was given."""
    self._rounds = rounds
    probing, started = self.plan.probing, time.perf_counter()
    self.waited = probing
    block, placed = self.reader.take(step, steps)
    # The next block is read and placed while this one is dispatched and trains; not while 'auto' probes (a timed
    # block's read is in its own time, and none beside it: `block_plan`).
    if step + steps < self.plan.stop_step and self.plan.steps_per_dispatch is not None:
      ahead = self.plan.peek(step + steps, due_steps(step + steps))
      self.reader.prefetch(step + steps, min(self.reader.block_steps, ahead))
    steps_L = self._placed_counts.get(steps)
    if steps_L is None:  # A few counts recur (K, the cuts at events): each placed once, not a device_put a block.
      steps_L = self._placed_counts[steps] = replicas.shard(
        np.full(self._num_local, steps, np.int32), self._meshes.local
      )
    full = steps == self.reader.block_steps == self._all_steps_compiled  # All K: the program with a static count.
    state_L, metrics = self._run_block(state_L, step, steps, placed, steps_L, full)
    if self._collective:
      distributed.block_dispatched(steps)
    # One block in flight, no more (docs/design.md §3): the last one is done before this one's boundary, so a boundary's
    # times are the device's pace and a snapshot or a save waits for one block at most.
    jax.block_until_ready(self._in_flight)
    self._in_flight = metrics
    if probing:  # 'auto' times its first blocks; then every process dispatches blocks of the same K.
      jax.block_until_ready(metrics)
      self.plan.observe(steps, time.perf_counter() - started)
      if self.plan.steps_per_dispatch is not None:
        state_L = self._use_steps_per_dispatch(state_L)
    elif self._all_steps_compiled is None and self.plan.steps_per_dispatch is not None:
      self._compile_all_steps(state_L)  # A K given in the config: at the first block, before the timed ones.
    return state_L, metrics, block

  def close(self) -> None:
    self.reader.close()
    if self._collective:
      distributed.block_dispatched(None)  # No block in flight from here on.

  def _use_steps_per_dispatch(self, state_L: Any) -> Any:
    """Once 'auto' chose K: blocks of that many steps from now on, their two programs compiled now (a block of no
    step, and `_compile_all_steps`; the time added to `paused_s`). Where the steps are collectives of the job
    (`_steps_are_collective`), K is the job's, the largest any process chose: every process dispatches the same
    blocks. (Elsewhere each process keeps its own: an exchange here would wait for a peer whose shadow round waits
    for this process's next boundary.) The exchange's wait for a slower peer is training time, as a step's wait in
    a collective is: not paused."""
    if jax.process_count() > 1 and _steps_are_collective(self._config):
      self.plan.agree(distributed.exchange('steps_per_dispatch', self.plan.steps_per_dispatch))
    self._chosen(self.plan.steps_per_dispatch)
    started = time.perf_counter()
    if self.plan.steps_per_dispatch != self.reader.block_steps:  # Its programs, of K steps (full blocks: all K).
      self.reader.resize(self.plan.steps_per_dispatch)
      state_L, metrics = self._run_block(state_L, None, 0, *self._block_of_no_step(), full=False)
      jax.block_until_ready((state_L, metrics))
    self._compile_all_steps(state_L)
    self.paused_s += time.perf_counter() - started
    return state_L

  def _compile_all_steps(self, state_L: Any) -> None:
    """Compiles the block program of all K steps (`replicas.make_replicated_block`'s `full`) now: full blocks run
    it from now on. Without `train.all_steps_program`, or a program without one (a study's stand-in), every block
    runs the one program."""
    compile_all_steps = getattr(self._train_block, 'compile_all_steps', None)
    if not self._config.train.all_steps_program:
      compile_all_steps = None
    if compile_all_steps is not None:
      carry = (self._rounds.block_carry(None, 0),) if self._fused else ()
      compile_all_steps(state_L, *self._block_of_no_step(), *carry)
    self._all_steps_compiled = self.reader.block_steps if compile_all_steps is not None else 0

  def _run_block(self, state_L: Any, step: int | None, steps: int, placed, steps_L, full: bool) -> tuple[Any, Any]:
    """The block program on `placed`; with fused rounds, their carry from the driver and back to it (`step` None:
    a block of no step, not in the run)."""
    if not self._fused:
      return self._train_block(state_L, placed, steps_L, full=full)
    carry = self._rounds.block_carry(step, steps)
    state_L, metrics, carry = self._train_block(state_L, placed, steps_L, carry, full=full)
    self._rounds.after_block(carry)
    return state_L, metrics

  def _block_of_no_step(self) -> tuple[Any, Any]:
    """(batches, steps) of a block of zeros that trains no step, placed: what compiles a block's programs."""
    nothing = batch_lib.zeros(self._num_local, self.reader.block_steps, self._config.batch_size)
    return replicas.shard((nothing, np.zeros(self._num_local, np.int32)), self._meshes.local)


class Timing(NamedTuple):
  """A loop's timed steps: those after its first block (which compiles; all of them where the caller times every
  block), their seconds less the loop's pauses (compiling the K 'auto' chose), and when that first block was done
  (`time.time()`; None where no block is left untimed)."""

  steps: int
  seconds: float
  first_block_done_at: float | None


def run_blocks(
  b: hooks.Boundary,
  until: int,
  blocks: BlockDispatcher,
  hooks_before: Sequence[hooks.Hook] = (),
  hooks_after: Sequence[hooks.Hook] = (),
  first_block_untimed: bool = True,
) -> Timing:
  """The training loop (docs/design.md §13): blocks from `b.step` to `until`, moving `b` on as it goes (an error
  leaves it where it was). At each boundary the hooks act in order: `hooks_before`, the sync driver (`b.driver`,
  which a hook may replace), `hooks_after` (`hooks` module); before a block, the driver first. The loop's clock:
  `b.waited`, `b.paused_s`, and `b.work_s` (what `hooks_after` took at the last boundary). `first_block_untimed`:
  the loop's first block is waited for and left out of its timing (a run's first compiles;
  `studies.shadow_overhead`'s windows time every block)."""
  paused_at_start = blocks.paused_s
  timed_start, timed_steps, first_done_at = None if first_block_untimed else time.perf_counter(), 0, None

  def every_hook() -> list[Any]:
    return [*hooks_before, b.driver, *hooks_after]

  def hooks_due(at: int) -> list[int | None]:
    return [until, *(hook.next_due(at) for hook in every_hook())]

  while b.step < until:
    paused_before = blocks.paused_s
    b.steps = blocks.next_block(b.step, hooks_due)
    # The driver's first (a round's snapshot leaves before a straggler's sleep), then the others' (that sleep).
    for hook in [b.driver, *hooks_before, *hooks_after]:
      hook.before_block(b)
    b.state, b.metrics, b.block = blocks.dispatch(b.state, b.step, b.steps, hooks_due, rounds=b.driver)
    b.trained, b.step = b.step, b.step + b.steps  # The block before this one is done (one stays in flight).
    # Blocks the loop waits for before their boundary (none is left in flight): the first (it compiles), 'auto''s
    # probes, and those a hook asks for (a straggler's, stretched; one whose last step recovery must find trained).
    first = timed_start is None
    b.waited = first or blocks.waited or any(hook.waits_for(b) for hook in every_hook())
    if b.waited:
      jax.block_until_ready(b.metrics)
      b.trained = b.step
    if first:  # Examples/sec counts from the end of the first block.
      timed_start, first_done_at = time.perf_counter(), time.time()
    else:
      timed_steps += b.steps
    b.paused_s = blocks.paused_s - paused_before
    b.rewind_to = None
    for hook in hooks_before:
      hook.at_boundary(b)
    b.driver.at_boundary(b)  # Shadow paces time the blocks that ended since the last boundary.
    work_start = time.perf_counter()
    for hook in hooks_after:
      hook.at_boundary(b)
    b.work_s = time.perf_counter() - work_start  # A shadow pace leaves the next interval out if it held a save.
    if b.rewind_to is not None:  # Full recovery: the data restarts at the restored checkpoint.
      b.step = b.rewind_to
  for hook in every_hook():
    hook.end(b)
  jax.block_until_ready(b.state)
  seconds = 0.0 if timed_start is None else time.perf_counter() - timed_start - (blocks.paused_s - paused_at_start)
  return Timing(timed_steps, seconds, first_done_at)


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str | pathlib.Path,
  started_at: float | None = None,
  make_block: Callable[..., Any] | None = None,
  extra_hooks: Sequence[hooks.Hook] = (),
) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming if it holds a checkpoint); returns the summary written to summary.json.

  `started_at` (`time.time()`): when the caller's program started, from which the summary's `startup_s` counts;
  default: the process's creation (a shell that `exec`s the binary after work of its own created it, so a binary
  notes its own start). `make_block`: a study's block program in place of `make_train_block` (`BlockDispatcher`;
  `studies.loop` times the loop around one that does no work). `extra_hooks`: hooks of the loop's own (`hooks`),
  acting at each boundary after the run's (the sync driver, the metric log, the progress line, recovery).

  When `config.train.stop_at_step` stops the run early, returns {'stopped_at_step': step} and writes no summary.
  """
  wall_start = time.perf_counter()
  num_processes, process_index = jax.process_count(), jax.process_index()
  config = config_lib.resolve(config, num_processes)
  config_lib.validate(config, num_devices=len(jax.devices()), num_processes=num_processes)
  if config.sync.algorithm in config_lib.PARAMETER_SERVER_ALGORITHMS:  # One server model (docs/design.md §8).
    # One process: its workers in emulated time; several: the job's replicas as workers, for real.
    return (gba_processes if num_processes > 1 else gba_emulated).train_and_evaluate(config, workdir)
  traffic = network.TrafficCounter()  # Bytes this process puts on the wire (null on 127.0.0.1).
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  num_replicas, batch_size = config.num_replicas, config.batch_size
  num_local = num_replicas // num_processes
  examples_per_step = num_replicas * batch_size
  total_steps = input_pipeline.num_steps(config.data.num_train_examples, num_replicas, batch_size)
  stop_step = min(config.train.stop_at_step or total_steps, total_steps)

  meshes = replicas.make_meshes(num_replicas)
  state_bytes = check_memory(config, meshes)
  # A restart of a job under 'auto' dispatches the K its first start chose: no probe, its warm-up one block.
  steps_per_dispatch = recovery_policies.steps_per_dispatch(config, workdir)
  warmup_steps = block_plan.steps_until_chosen(steps_per_dispatch)
  keep_params = sync_drivers.keeps_params(config.recovery.mode)
  driver = sync_drivers.make(config.sync, meshes, num_replicas, keep_params, first_round_after=warmup_steps)
  warmup_blocks = block_plan.blocks_until_chosen(steps_per_dispatch)
  recovery = recovery_policies.make(config, meshes, workdir, total_steps, warmup_steps, warmup_blocks)  # Owns saves.

  def fresh_state():  # Built only where nothing is restored: a restore never builds the tables first.
    state = init_replicated_state(config, meshes)
    return state, driver.initial_sync_state(state)

  state, sync_state, start_step = recovery.resume(checkpointing.FreshState(fresh_state, meshes))
  train_source, eval_source = input_pipeline.make_sources(config.data, config.seed)
  delay = straggler.from_config(config.straggler, process_index, first_step=start_step)
  blocks = BlockDispatcher(
    config,
    meshes,
    train_source,
    stop_step,
    between=driver.between_steps(),
    steps_per_dispatch=steps_per_dispatch,
    chosen=functools.partial(recovery_policies.note_steps_per_dispatch, workdir),
    make_block=make_block,
  )
  writer = metric_writer.MetricWriter(workdir, enabled=process_index == 0)
  log = _MetricLog(writer, config, examples_per_step)
  progress_line = progress.ProgressLine(total_steps, examples_per_step, every_seconds=config.train.progress_every_s)

  driver.start(state, sync_state)
  recovery.start(start_step, state, sync_state)
  log.prepare(state.params, start_step, stop_step)

  b = hooks.Boundary(start_step, state, driver)
  try:  # This process's own pace is timed here: its wait below for slower processes is not part of it.
    after = [log, progress_line, recovery, *extra_hooks]
    timing = run_blocks(b, stop_step, blocks, hooks_before=[delay], hooks_after=after)
  except BaseException as error:
    recovery.on_error(error, b.step, b.state, b.driver)  # A collective that lost its partner: save and exit there.
    b.driver.finish(b.state, abandon=True)
    raise
  finally:
    blocks.close()
  state, step, driver, timed_steps, timed_seconds = b.state, b.step, b.driver, timing.steps, timing.seconds
  startup_s = None
  if timing.first_block_done_at is not None:  # From the program's start: imports, init, compile, the first block.
    startup_s = timing.first_block_done_at - (psutil.Process().create_time() if started_at is None else started_at)
  distributed.report(step, 'finish')  # It may wait long below for slower processes: no peer takes it for hung.
  state = driver.finish(state)  # Shadow rounds end together on every process: cross-process calls are safe below.
  distributed.wait_for_every_process('trained')  # Without rounds, a fast process may be far ahead of a slow one.
  recovery.finish(step, state, driver.sync_state())
  progress_line.finish()

  if step < total_steps:
    writer.close()
    print(f'Stopped at step {step} of {total_steps}; rerun with the same workdir to resume.')
    return {'stopped_at_step': step}

  rule, sync_state = driver.consensus_rule(), driver.sync_state()
  per_replica = config.train.eval_per_replica
  predict = consensus.make_predict(config.model, config.data.cardinalities, meshes, rule, per_replica=per_replica)
  eval_metrics = evaluation.evaluate(
    lambda dense, sparse: predict(state.params, sync_state, dense, sparse),
    eval_source,
    config.train.eval_batch_size,
    per_replica,
  )
  local_examples_per_sec = timed_steps * num_local * batch_size / timed_seconds if timed_seconds > 0 else 0.0
  examples_per_sec_per_process = [float(x) for x in replicas.gather_from_processes(local_examples_per_sec)]
  straggler_figures = straggler.summary(delay, config.straggler.process)
  net_bytes_sent, net_bytes_received = (network.per_process(count) for count in traffic.bytes())
  fingerprint = consensus.fingerprint(rule, state.params, sync_state, meshes)
  divergence = _job_replica_divergence(_replicated_part(state.params, config), meshes)
  summary = {
    'eval_ne': eval_metrics['ne'],
    'eval_auc': eval_metrics['auc'],
    'eval_logloss': eval_metrics['logloss'],
    'eval_calibration': eval_metrics['calibration'],
    'bayes_ne': eval_metrics['bayes_ne'],
    'eval_ne_per_replica': eval_metrics.get('ne_per_replica'),
    'examples_per_sec': sum(examples_per_sec_per_process) if timed_seconds > 0 else None,
    'examples_per_sec_per_process': examples_per_sec_per_process,
    'startup_s': startup_s,  # Process 0's, from its start to its first step done (None: no step was run).
    **blocks.plan.stats(),  # steps_per_dispatch (K), and what 'auto' measured to choose it
    'net_bytes_sent': net_bytes_sent,  # Per process; null on 127.0.0.1 (parallel/network.py).
    'net_bytes_received': net_bytes_received,
    'train_examples': step * examples_per_step,
    'train_steps': step,
    'resumed_from_step': start_step,
    'num_replicas': num_replicas,
    'num_processes': num_processes,
    'sync_algorithm': config.sync.algorithm,
    **driver.stats(),  # sync_rounds, mean_sync_gap, max_sync_gap, mean_round_latency_s (of process 0)
    'replica_divergence': divergence,
    'consensus_fingerprint_per_process': [f'{int(x):08x}' for x in replicas.gather_from_processes(fingerprint)],
    **memory.summary(state_bytes),  # state_bytes, peak_rss_bytes: per process, by the end of the evaluation
    **straggler_figures,  # straggler_sleep_s, straggler_step_s: the straggler process's (parallel/straggler.py)
    **recovery.summary(),  # recovery_overhead_pct, num_failures, estimated_pls, actual_pls, ...
    'wall_time_s': time.perf_counter() - wall_start,
    'config': config.to_dict(),
  }
  writer.write_scalars(step, {f'eval_{k}': v for k, v in eval_metrics.items() if isinstance(v, (int, float))})
  writer.close()
  if process_index == 0:
    metric_writer.write_summary(workdir, summary)
  return summary


def _replicated_part(params_L: Any, config: ml_collections.ConfigDict) -> Any:
  """The params the replicas hold each a copy of: a sharded table is one table, not R copies."""
  return {'mlp': params_L['mlp']} if config.sync.embedding_placement == 'sharded' else params_L


def _job_replica_divergence(params_L: Any, meshes: replicas.ReplicaMeshes) -> float:
  divergence = replicas.whole_on_job(replicas.replica_divergence, meshes)(replicas.to_job(params_L, meshes))
  return float(replicas.fetch(divergence))
