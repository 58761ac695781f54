"""One training run end to end: R replicas over a one-pass stream, checkpoints, metrics, a final evaluation.

  from shadowsync_jax import config as config_lib, train
  config = config_lib.base_config()
  summary = train.train_and_evaluate(config, workdir='/tmp/run')
  print(summary['eval_ne'], summary['bayes_ne'])

`train_and_evaluate` validates the config before anything compiles, resumes from the newest checkpoint in
`workdir/checkpoints` if there is one, streams scalars to `workdir` (TensorBoard events and `metrics.jsonl`),
prints a progress line, and writes `workdir/summary.json` (DESIGN §9) when the stream is done.
"""

import json
import pathlib
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from shadowsync_jax import checkpointing
from shadowsync_jax import config as config_lib
from shadowsync_jax import embedding
from shadowsync_jax import evaluation
from shadowsync_jax import input_pipeline
from shadowsync_jax import metric_writer
from shadowsync_jax import model as model_lib
from shadowsync_jax import progress
from shadowsync_jax import replicas
from shadowsync_jax import step as step_lib
from shadowsync_jax import sync_drivers


def make_optimizers(config: ml_collections.ConfigDict):
  """(optax optimizer of the MLP weights, sparse optimizer of the embedding tables) from `config.optimizer`."""
  opt = config.optimizer
  mlp = {'sgd': optax.sgd, 'adagrad': optax.adagrad, 'adam': optax.adam}[opt.mlp](opt.mlp_learning_rate)
  tables = {'sgd': embedding.sparse_sgd, 'rowwise_adagrad': embedding.rowwise_adagrad}[opt.embedding](
      opt.embedding_learning_rate)
  return mlp, tables


def init_replicated_state(config: ml_collections.ConfigDict, mesh) -> step_lib.TrainState:
  """R replicas of one freshly initialized train state (all replicas start from the same model)."""
  mlp_optimizer, embedding_optimizer = make_optimizers(config)
  state = step_lib.init_train_state(
      jax.random.key(config.seed), model_lib.from_config(config.model), list(config.data.cardinalities), config.model.embedding_dim,
      mlp_optimizer, embedding_optimizer)
  return replicas.replicate(state, mesh)


def make_train_step(config: ml_collections.ConfigDict, mesh):
  """The jitted step over all replicas; sync SGD averages gradients across them every step, and shared embedding
  placement applies all replicas' sparse gradients to every copy of the table."""
  mlp_optimizer, embedding_optimizer = make_optimizers(config)
  grad_axis = replicas.REPLICA_AXIS if config.sync.algorithm == 'sync_sgd' else None
  shared_axis = replicas.REPLICA_AXIS if config.sync.embedding_placement == 'shared' else None
  step_fn = step_lib.make_train_step(model_lib.from_config(config.model), list(config.data.cardinalities), mlp_optimizer,
                                     embedding_optimizer, grad_axis_name=grad_axis,
                                     shared_embedding_axis_name=shared_axis)
  return replicas.make_replicated_step(step_fn, mesh)


class _LossWindow:
  """Mean train loss and examples/sec between two metric writes, from losses already read back to the host."""

  def __init__(self):
    self.reset(time.perf_counter())

  def reset(self, now: float) -> None:
    self.loss_sum, self.steps, self.start = 0.0, 0, now

  def add(self, loss: float) -> None:
    self.loss_sum += loss
    self.steps += 1


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming if it holds a checkpoint); returns the summary written to summary.json.

  When `config.train.stop_at_step` stops the run early, returns {'stopped_at_step': step} and writes no summary.
  """
  wall_start = time.perf_counter()
  config_lib.validate(config, num_devices=len(jax.devices()))
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  num_replicas, batch_size = config.num_replicas, config.batch_size
  examples_per_step = num_replicas * batch_size
  total_steps = input_pipeline.num_steps(config.data.num_train_examples, num_replicas, batch_size)
  stop_step = min(config.train.stop_at_step or total_steps, total_steps)

  mesh = replicas.make_mesh(num_replicas)
  state = init_replicated_state(config, mesh)
  checkpointer = checkpointing.Checkpointer(workdir / 'checkpoints', config.train.checkpoint_every_steps)
  driver = sync_drivers.make_driver(config, mesh)
  sync_state = driver.initial_sync_state(state)
  restored = checkpointer.restore_latest(checkpointing.abstract_like(_checkpointed(state, sync_state)))
  start_step = 0
  if restored is not None:
    tree, start_step = restored
    state, sync_state = tree['train'], tree.get('sync')
    print(f'Resumed from the checkpoint at step {start_step} of {total_steps} in {workdir}.')
  train_step = make_train_step(config, mesh)
  train_source, eval_source = input_pipeline.make_sources(config.data, config.seed)
  batches = input_pipeline.train_batches(train_source, num_replicas, batch_size, config.data.num_train_examples,
                                         start_step=start_step)
  writer = metric_writer.MetricWriter(workdir, enabled=jax.process_index() == 0)
  progress_line = progress.ProgressLine(total_steps, examples_per_step, every_seconds=config.train.progress_every_s)

  driver.start(state, sync_state)
  step, window = start_step, _LossWindow()
  timed_start, timed_steps, pending_loss = None, 0, None
  try:
    for batch in batches:
      if step >= stop_step:
        break
      state, metrics = train_step(state, replicas.shard(batch, mesh))
      step += 1
      state = driver.after_step(step, state)
      if pending_loss is not None:  # Step N-1's loss: reading it keeps the dispatch queue one step deep.
        window.add(float(np.mean(pending_loss)))
      pending_loss = metrics['loss']
      if timed_start is None:  # The first step compiles: examples/sec counts from its end.
        jax.block_until_ready(pending_loss)
        timed_start = time.perf_counter()
        window.reset(timed_start)
      else:
        timed_steps += 1
      progress_line.update(step)
      if step % config.train.log_every_steps == 0 and window.steps:
        now = time.perf_counter()
        writer.write_scalars(step, {
            'train_loss': window.loss_sum / window.steps,
            'examples_per_sec': window.steps * examples_per_step / (now - window.start),
            'replica_divergence': float(sync_drivers.replica_divergence(state.params)),
            **{k: v for k, v in driver.stats().items() if v is not None}})
        window.reset(now)
      checkpointer.maybe_save(step, _checkpointed(state, driver.sync_state()))
  finally:
    state = driver.finish(state)
  jax.block_until_ready(state)
  timed_seconds = time.perf_counter() - timed_start if timed_start is not None else 0.0
  checkpointer.maybe_save(step, _checkpointed(state, driver.sync_state()), force=True)
  checkpointer.close()
  progress_line.finish()

  if step < total_steps:
    writer.close()
    print(f'Stopped at step {step} of {total_steps}; rerun with the same workdir to resume.')
    return {'stopped_at_step': step}

  eval_metrics = evaluation.evaluate(config, driver.consensus(state.params), state.params, eval_source)
  examples_per_sec = timed_steps * examples_per_step / timed_seconds if timed_seconds > 0 else None
  summary = {
      'eval_ne': eval_metrics['ne'],
      'eval_auc': eval_metrics['auc'],
      'eval_logloss': eval_metrics['logloss'],
      'eval_calibration': eval_metrics['calibration'],
      'bayes_ne': eval_metrics['bayes_ne'],
      'eval_ne_per_replica': eval_metrics.get('ne_per_replica'),
      'examples_per_sec': examples_per_sec,
      'train_examples': step * examples_per_step,
      'train_steps': step,
      'resumed_from_step': start_step,
      'num_replicas': num_replicas,
      'num_processes': jax.process_count(),
      'sync_algorithm': config.sync.algorithm,
      **driver.stats(),  # sync_rounds, mean_sync_gap, max_sync_gap, mean_round_latency_s
      'replica_divergence': float(sync_drivers.replica_divergence(state.params)),
      'wall_time_s': time.perf_counter() - wall_start,
      'config': config.to_dict(),
  }
  writer.write_scalars(step, {f'eval_{k}': v for k, v in eval_metrics.items() if isinstance(v, (int, float))})
  writer.close()
  (workdir / 'summary.json').write_text(json.dumps(summary, indent=2, default=_jsonable) + '\n')
  return summary


def _checkpointed(state_R: step_lib.TrainState, sync_state_R: Any) -> dict[str, Any]:
  """What a checkpoint holds besides the data position: the train state and, for round-based sync, its state."""
  return {'train': state_R} if sync_state_R is None else {'train': state_R, 'sync': sync_state_R}


def _jsonable(value: Any) -> Any:
  if isinstance(value, (np.generic,)):
    return value.item()
  if isinstance(value, tuple):
    return list(value)
  raise TypeError(f'not JSON serializable: {type(value)}')
