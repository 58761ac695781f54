"""A block's program and its dispatching (docs/design.md §13): `make_train_block` builds the program that trains a
block of K steps in one dispatch, and `BlockDispatcher` plans each block (`block_plan`), reads the next while this one
trains, dispatches it and keeps one in flight. The loop (`loop.run_blocks`) drives it."""

from collections.abc import Callable
import functools
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from shadowsync_jax import block_plan
from shadowsync_jax.data import batch as batch_lib
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.data import readers as readers_lib
from shadowsync_jax.data import synthetic
from shadowsync_jax.data import synthetic_device
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import optimizers
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.model import table_placement
from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import replicas


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
  step_mesh = meshes.job if steps_are_collective(config) else meshes.local
  replicated_step = replicated(step_fn, step_mesh)
  if step_mesh is meshes.local:
    return replicated_step
  if isinstance(replicated_step, replicas.BlockProgram):
    return replicated_step._replace(job_meshes=meshes)

  def across_processes(state_L, *args_L):
    state_R, metrics_R = replicated_step(replicas.to_job(state_L, meshes), *replicas.to_job(args_L, meshes))
    return replicas.to_local(state_R, meshes), replicas.to_local(metrics_R, meshes)

  return across_processes


def generates_on_device(config: ml_collections.ConfigDict) -> bool:
  """`data.generator`: whether the synthetic stream's blocks are generated on the devices that train them ('auto':
  on accelerators; on CPU the host's readers run beside the steps)."""
  if config.data.generator == 'auto':
    return config.data.source == 'synthetic' and jax.default_backend() != 'cpu'
  return config.data.generator == 'device'


def steps_are_collective(config: ml_collections.ConfigDict) -> bool:
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
    self._collective = steps_are_collective(config)  # A block that needs every peer: the watchdog is told of it.
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
    (`steps_are_collective`), K is the job's, the largest any process chose: every process dispatches the same
    blocks. (Elsewhere each process keeps its own: an exchange here would wait for a peer whose shadow round waits
    for this process's next boundary.) The exchange's wait for a slower peer is training time, as a step's wait in
    a collective is: not paused."""
    if jax.process_count() > 1 and steps_are_collective(self._config):
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
