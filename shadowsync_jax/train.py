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
trains, `dispatch.make_train_block` runs a block in one dispatch, and the hooks act at its boundary (`next_due`,
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
from typing import Any

import jax
from jax import lax
from jax.sharding import PartitionSpec as P
import ml_collections
import psutil

from shadowsync_jax import block_plan
from shadowsync_jax import config as config_lib
from shadowsync_jax import dispatch
from shadowsync_jax import hooks
from shadowsync_jax import loop
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.gba import emulated as gba_emulated
from shadowsync_jax.gba import processes as gba_processes
from shadowsync_jax.metrics import evaluation
from shadowsync_jax.metrics import log as metric_log
from shadowsync_jax.metrics import progress
from shadowsync_jax.metrics import writer as metric_writer
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import optimizers
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.model import table_placement
from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import network
from shadowsync_jax.parallel import program_store
from shadowsync_jax.parallel import replicas
from shadowsync_jax.parallel import straggler
from shadowsync_jax.recovery import policies as recovery_policies
from shadowsync_jax.recovery import training_state
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
  return program_store.stored('initial_state', jax.jit(built, out_shardings=replicas.replica_sharding(meshes.local)))


def check_memory(config: ml_collections.ConfigDict, abstract_state_L: step_lib.TrainState) -> int:
  """This process's train state (`abstract_state_L`: its shapes) in bytes; raises ConfigError, before anything is
  allocated, if the job's processes cannot hold theirs (`memory.shortfall`), naming what to change."""
  needed = memory.state_bytes(abstract_state_L)
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
  notes its own start). `make_block`: a study's block program in place of `dispatch.make_train_block`
  (`dispatch.BlockDispatcher`; `studies.loop` times the loop around one that does no work). `extra_hooks`: hooks of
  the loop's own (`hooks`), acting at each boundary after the run's (the sync driver, the metric log, the progress
  line, recovery).

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
  # One program builds the state: traced once for its shapes, the memory check and the build (a restart's ~0.1 s),
  # and kept compiled in the job's program store (`program_store`).
  build_state, key = _state_builder(config, meshes), lambda: jax.random.key(config.seed)
  abstract_state_L = program_store.output_shapes(build_state, key())
  state_bytes = check_memory(config, abstract_state_L)
  # A restart of a job under 'auto' dispatches the K its first start chose: no probe, its warm-up one block.
  steps_per_dispatch = recovery_policies.steps_per_dispatch(config, workdir)
  warmup_steps = block_plan.steps_until_chosen(steps_per_dispatch)
  keep_params = sync_drivers.keeps_params(config.recovery.mode)
  driver = sync_drivers.make(config.sync, meshes, num_replicas, keep_params, first_round_after=warmup_steps)
  warmup_blocks = block_plan.blocks_until_chosen(steps_per_dispatch)
  recovery = recovery_policies.make(config, meshes, workdir, total_steps, warmup_steps, warmup_blocks)  # Owns saves.

  # Built only where nothing is restored: a restore never builds the tables first.
  fresh = training_state.FreshState(lambda: build_state(key()), driver.initial_sync_state, abstract_state_L, meshes)
  state, sync_state, start_step = recovery.resume(fresh)
  train_source, eval_source = input_pipeline.make_sources(config.data, config.seed)
  delay = straggler.from_config(config.straggler, process_index, first_step=start_step)
  blocks = dispatch.BlockDispatcher(
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
  log = metric_log.MetricLog(
    writer,
    config.train.log_every_steps,
    config.train.log_every_s,
    examples_per_step,
    tables_sharded=config.sync.embedding_placement == 'sharded',
  )
  progress_line = progress.ProgressLine(total_steps, examples_per_step, every_seconds=config.train.progress_every_s)

  driver.start(state, sync_state)
  recovery.start(start_step, state, sync_state)
  log.prepare(state.params, start_step, stop_step)

  b = hooks.Boundary(start_step, state, driver)
  try:  # This process's own pace is timed here: its wait below for slower processes is not part of it.
    after = [log, progress_line, recovery, *extra_hooks]
    timing = loop.run_blocks(b, stop_step, blocks, hooks_before=[delay], hooks_after=after)
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
  divergence = _job_replica_divergence(
    metric_log.replicated_part(state.params, config.sync.embedding_placement == 'sharded'), meshes
  )
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
    'programs_loaded': program_store.loaded(),  # Compiled programs this start found in its workdir (`program_store`).
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


def _job_replica_divergence(params_L: Any, meshes: replicas.ReplicaMeshes) -> float:
  divergence = replicas.whole_on_job(replicas.replica_divergence, meshes)(replicas.to_job(params_L, meshes))
  return float(replicas.fetch(divergence))
