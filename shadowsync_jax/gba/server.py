"""The parameter server of GBA and async SGD: one model, the gradient buffer of a global batch, staleness bookkeeping.

  server = server_lib.Server(state, config.sync.algorithm, config.num_replicas, config.gba, config.optimizer)
  server.receive(server_lib.Gradient(worker, token, loss, mlp_grads, row_ids_N, row_grads_NxD))
  server.state, server.global_step, server.stats()

`gba`: gradients are buffered until they cover a global batch (R local batches), weighted by their staleness
(`aggregation.staleness_weights`) and applied with sync_sgd's optimizers; `async_sgd`: every gradient on arrival,
alone. Both the one-process emulation (`emulated`) and the job of several processes (`processes`) drive it, and
share its checkpoint layout (sync_sgd's: the model stacked on every replica) and its summary.
"""

import pathlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from shadowsync_jax.gba import aggregation
from shadowsync_jax.model import optimizers
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import training_state

ALGORITHMS = ('gba', 'async_sgd')


class Gradient(NamedTuple):
  """What a worker pushes: the token it pulled with and the gradient of its batch (None fields: the worker failed)."""

  worker: int
  token: int
  loss: jax.Array | None
  mlp_grads: Any
  row_ids_N: jax.Array | None
  row_grads_NxD: jax.Array | None


class Server:
  """The parameter server: one train state, the gradient buffer of the current global batch, and the token
  bookkeeping (staleness, decayed and dropped gradients)."""

  def __init__(
    self,
    state: step_lib.TrainState,
    algorithm: str,
    num_workers: int,
    gba_config: ml_collections.ConfigDict,
    optimizer_config: ml_collections.ConfigDict,
    donate: bool = True,
  ):
    """`algorithm` one of `ALGORITHMS`, over `num_workers` workers; a run's `gba` section (the staleness rule) and
    `optimizer` section. `donate`: update the state in place (False when another thread may still read the params
    it replaces)."""
    self.state, self.global_step = state, int(state.step)
    self._aggregating = algorithm == 'gba'
    self._num_gradients = num_workers if self._aggregating else 1
    self._threshold, self._decay = gba_config.staleness_threshold, gba_config.staleness_decay
    mlp_optimizer, embedding_optimizer = optimizers.make_optimizers(optimizer_config)
    apply = step_lib.make_apply_fn(mlp_optimizer, embedding_optimizer)

    def aggregate_and_apply(state, mlp_grads_K, row_ids_K, row_grads_K, weights_K):
      return apply(state, *aggregation.aggregate(mlp_grads_K, row_ids_K, row_grads_K, weights_K, self._num_gradients))

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
    weights_K = (
      aggregation.staleness_weights(staleness_K, self._threshold, self._decay)
      if self._aggregating
      else np.ones(len(staleness_K), np.float32)
    )
    self.staleness.extend(staleness_K.tolist())
    self.weights.extend(weights_K.tolist())
    gradients = self._buffer + [self._buffer[0]] * padding  # Weight 0: a zero update of rows already touched.
    weights_K = np.concatenate([weights_K, np.zeros(padding, np.float32)])
    self.state = self._apply(
      self.state,
      tuple(g.mlp_grads for g in gradients),
      tuple(g.row_ids_N for g in gradients),
      tuple(g.row_grads_NxD for g in gradients),
      weights_K,
    )
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


def stacked_abstract(state: step_lib.TrainState, mesh) -> Any:
  """The checkpoint layout of sync_sgd (the model on every replica of `mesh`), as restore targets."""
  num_replicas, sharding = mesh.shape[replicas.REPLICA_AXIS], replicas.replica_sharding(mesh)
  stacked = jax.tree.map(lambda x: jax.ShapeDtypeStruct((num_replicas, *x.shape), x.dtype, sharding=sharding), state)
  return training_state.training_tree(stacked, None)


def server_state_from_checkpoint(tree: Any, workdir: pathlib.Path) -> step_lib.TrainState:
  """Replica 0 of a checkpoint's stacked train state, after checking that every replica holds the same params
  (a sync_sgd, gba or async_sgd checkpoint does; R independent models do not make one server model)."""
  stacked = tree['train']
  for path, leaf in jax.tree_util.tree_leaves_with_path(stacked.params):
    host = np.asarray(leaf)
    if not all(np.array_equal(host[0], host[r]) for r in range(1, host.shape[0])):
      raise ValueError(
        f'The checkpoint in {workdir} holds different models on its replicas (at params'
        f'{jax.tree_util.keystr(path)}): it comes from a run whose replicas were not one model '
        '(sync.algorithm none or model averaging), and gba/async_sgd resume one server model. '
        'Resume it with its own sync.algorithm, or use a new workdir.'
      )
  return jax.tree.map(lambda x: jnp.asarray(np.asarray(x[0])), stacked)  # Uncommitted, like a fresh state.


def resume(
  checkpointer: checkpointing.Checkpointer,
  state: step_lib.TrainState,
  mesh,
  workdir: pathlib.Path,
  total_steps: int,
) -> tuple[step_lib.TrainState, int]:
  """The server state and step to go on from: the newest checkpoint's (said on stdout), else `state` at step 0."""
  restored = checkpointer.restore_latest(stacked_abstract(state, mesh))
  if restored is None:
    return state, 0
  tree, start_step = restored[0], restored[1]['step']
  state = server_state_from_checkpoint(tree, workdir)
  print(
    f'Resumed from the checkpoint at step {start_step} of {total_steps} in {workdir} (global step {int(state.step)}).'
  )
  return state, start_step


def server_summary(
  eval_metrics: dict[str, Any],
  server: Server,
  start_step: int,
  examples_per_sec_per_process: list[float | None],
  lost_tokens: int,
  *,
  algorithm: str,
  num_workers: int,
  batch_size: int,
  total_steps: int,
) -> dict[str, Any]:
  """The summary.json keys of train.py (docs/design.md §9) for a run of one server model (`algorithm`, `total_steps`
  of `num_workers` batches of `batch_size`), and the server's stats."""
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
    'train_examples': total_steps * num_workers * batch_size,
    'train_steps': total_steps,
    'resumed_from_step': start_step,
    'num_replicas': num_workers,
    'num_processes': len(examples_per_sec_per_process),
    'sync_algorithm': algorithm,
    # Every worker pulls the server model before every step: a sync gap of 1, staleness aside (below).
    'sync_rounds': server.updates,
    'mean_sync_gap': 1.0 if server.updates else None,
    'max_sync_gap': 1 if server.updates else None,
    'mean_round_latency_s': None,
    'replica_divergence': 0.0,
    'straggler_sleep_s': 0.0,
    'straggler_step_s': None,
    'straggler_achieved_slowdown': None,
    'recovery_mode': 'none',
    **memory.summary(memory.state_bytes(server.state)),  # state_bytes, peak_rss_bytes: per process
    **server.stats(),
    'lost_tokens': lost_tokens,
  }
