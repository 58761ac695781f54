"""What both paths of one server model share around their step (docs/design.md §8): the server resumed from the
newest checkpoint, the stream, a save at every checkpoint boundary, and the run's end (a stop, the evaluation, the
summary). `emulated` (workers in emulated time, one process) and `processes` (the job's replicas as workers) differ
only in how the workers' steps reach the server between two boundaries:

  run = gba_run.start(config, workdir, meshes)       # run.server, run.train_source, run.start_step, ...
  for boundary in gba_run.segments(run):             # saves the server model after each
    ...                                              # the workers' steps up to `boundary`
  return gba_run.finish(run, lambda: params, examples_per_sec_per_process, lost_tokens, more=lambda: {...})
"""

from collections.abc import Callable, Iterator
import dataclasses
import pathlib
import time
from typing import Any

import jax
import ml_collections

from shadowsync_jax.data import input_pipeline
from shadowsync_jax.gba import server as server_lib
from shadowsync_jax.metrics import evaluation
from shadowsync_jax.metrics import progress
from shadowsync_jax.metrics import writer as metric_writer
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import training_state


@dataclasses.dataclass
class ServerRun:
  """One run of a server model, from its resume to its summary (`start`)."""

  config: ml_collections.ConfigDict
  workdir: pathlib.Path
  meshes: replicas.ReplicaMeshes
  total_steps: int
  stop_step: int
  start_step: int
  server: server_lib.Server
  checkpointer: checkpointing.Checkpointer
  train_source: input_pipeline.Source
  eval_source: input_pipeline.Source
  writer: metric_writer.MetricWriter
  progress_line: progress.ProgressLine
  wall_start: float


def start(
  config: ml_collections.ConfigDict, workdir: str | pathlib.Path, meshes: replicas.ReplicaMeshes, donate: bool = True
) -> ServerRun:
  """The run of `config` (gba or async_sgd, validated) in `workdir`: the server model at the newest checkpoint's
  step (one of sync_sgd's too), else the initial model at step 0. `donate`: whether the server's updates may donate
  the params they replace (not where a worker may still read them). Process 0 writes the metrics."""
  wall_start = time.perf_counter()
  if config.sync.algorithm not in server_lib.ALGORITHMS:
    raise ValueError(
      f'sync.algorithm={config.sync.algorithm!r}: a server model runs {", ".join(server_lib.ALGORITHMS)}.'
    )
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  num_workers, batch_size = config.num_replicas, config.batch_size
  total_steps = input_pipeline.num_steps(config.data.num_train_examples, num_workers, batch_size)
  state = step_lib.init_from_config(config.seed, config.model, config.optimizer, config.data.cardinalities)
  checkpointer = checkpointing.Checkpointer(workdir / 'checkpoints', meshes, config.train.checkpoint_every_steps)
  state, start_step = server_lib.resume(checkpointer, state, meshes.local, workdir, total_steps)
  train_source, eval_source = input_pipeline.make_sources(config.data, config.seed)
  server = server_lib.Server(state, config.sync.algorithm, num_workers, config.gba, config.optimizer, donate=donate)
  return ServerRun(
    config=config,
    workdir=workdir,
    meshes=meshes,
    total_steps=total_steps,
    stop_step=min(config.train.stop_at_step or total_steps, total_steps),
    start_step=start_step,
    server=server,
    checkpointer=checkpointer,
    train_source=train_source,
    eval_source=eval_source,
    writer=metric_writer.MetricWriter(workdir, enabled=jax.process_index() == 0),
    progress_line=progress.ProgressLine(
      total_steps, num_workers * batch_size, every_seconds=config.train.progress_every_s
    ),
    wall_start=wall_start,
  )


def segments(run: ServerRun) -> Iterator[int]:
  """The checkpoint boundaries from the run's start to its stop; the server model is saved at each once the caller
  trained up to it (sync_sgd's layout: the model on every replica)."""
  for boundary in run.checkpointer.boundaries(run.start_step, run.stop_step):
    yield boundary
    tree = training_state.training_tree(replicas.replicate(run.server.state, run.meshes.local), None)
    run.checkpointer.save(boundary, tree)


def finish(
  run: ServerRun,
  params: Callable[[], Any],
  examples_per_sec_per_process: Callable[[], list[float | None]],
  lost_tokens: int,
  more: Callable[[], dict[str, Any]] = dict,
) -> dict[str, Any]:
  """The run's end: {'stopped_at_step': step} where `train.stop_at_step` stopped it; else the evaluation of
  `params()` (the server model, asked for only then) and the summary (train.py's keys,
  `examples_per_sec_per_process()`'s figures and `more()`'s), written to summary.json by process 0 and returned.
  The last two run after the evaluation, on every process (they may gather across the job)."""
  run.checkpointer.close()
  run.progress_line.finish()
  if run.stop_step < run.total_steps:
    run.writer.close()
    print(f'Stopped at step {run.stop_step} of {run.total_steps}; rerun with the same workdir to resume.')
    return {'stopped_at_step': run.stop_step}
  config = run.config
  predict = evaluation.one_model(config.model, config.data.cardinalities, params())
  eval_metrics = evaluation.evaluate(predict, run.eval_source, config.train.eval_batch_size)
  summary = server_lib.server_summary(
    eval_metrics,
    run.server,
    run.start_step,
    examples_per_sec_per_process(),
    lost_tokens,
    algorithm=config.sync.algorithm,
    num_workers=config.num_replicas,
    batch_size=config.batch_size,
    total_steps=run.total_steps,
  )
  summary.update(more())
  summary.update({'wall_time_s': time.perf_counter() - run.wall_start, 'config': config.to_dict()})
  scalars = {f'eval_{k}': v for k, v in eval_metrics.items() if isinstance(v, (int, float))}
  run.writer.write_scalars(run.total_steps, scalars)
  run.writer.close()
  if jax.process_index() == 0:
    metric_writer.write_summary(run.workdir, summary)
  return summary
