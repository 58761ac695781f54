"""The pure per-replica train step and the predict function of DLRM.

  model = DLRM(bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1))
  mlp_opt, emb_opt = optax.adagrad(0.01), embedding.rowwise_adagrad(0.05)
  state = init_train_state(key, model, cardinalities, 16, mlp_opt, emb_opt)
  train_step = jax.jit(make_train_step(model, cardinalities, mlp_opt, emb_opt), donate_argnums=0)
  state, metrics = train_step(state, batch)  # metrics['loss']: mean log loss of the batch
  probs_B = make_predict_fn(model, cardinalities)(state.params, batch.dense, batch.sparse)

A step touches one replica. For classic synchronous SGD pass `grad_axis_name` and call the step inside
`jax.shard_map` over that mesh axis: MLP gradients are averaged and every replica applies the sparse updates of
all replicas, so replicas stay identical and equal one model trained on the concatenated global batch. Where the
embedding rows are (a table per replica, one shared, or one sharded across the devices) is a `table_placement`:
the step looks its rows up through it and hands it the rows' gradients.

The step is `make_gradient_fn` (loss, MLP gradients, touched rows and their gradients) followed by `make_apply_fn`
(the optimizers); a parameter server that aggregates gradients itself (`gba.server`) uses the two apart.
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import optax

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import embedding
from shadowsync_jax.model import optimizers
from shadowsync_jax.model import table_placement
from shadowsync_jax.model.dlrm import DLRM


class TrainState(NamedTuple):
  params: dict[str, Any]  # {'mlp': flax params, 'embedding': float32 [sum(cardinalities), D]}
  mlp_opt_state: optax.OptState
  embedding_opt_state: Any
  step: jax.Array  # int32 []
  # int32 [V]: for each row of this device's table, the step count after the update that last wrote it (0: none
  # since the start). Which rows changed since a checkpoint: those stamped after it (`recovery.incremental`).
  row_steps: Any = None


def init_train_state(
  key: jax.Array,
  model: DLRM,
  cardinalities: Sequence[int],
  embedding_dim: int,
  mlp_optimizer: optax.GradientTransformation,
  embedding_optimizer: embedding.SparseOptimizer,
  table_rows: int | None = None,
  global_row: Callable[[jax.Array], jax.Array] = lambda rows: rows,
) -> TrainState:
  """The state of ONE replica, jitted: the MLP from `key`, the table built in place (`embedding.init_table`).

  `table_rows` and `global_row` make it one device's shard of a sharded table: `table_rows` local rows, local row r
  holding the concatenated table's row `global_row(r)` (default: the whole table). Every replica, and every shard,
  built from the same key holds the same values for the same rows. Called inside a jitted `shard_map`, it builds
  every device's state where it lives (`train.init_replicated_state`).
  """

  @jax.jit  # one compiled program instead of op-by-op dispatch of the whole init
  def init(key):
    mlp_key, table_key = jax.random.split(key)
    dense_1xF = jnp.zeros((1, NUM_DENSE_FEATURES), jnp.float32)
    emb_1xTxD = jnp.zeros((1, len(cardinalities), embedding_dim), jnp.float32)
    mlp_params = model.init(mlp_key, dense_1xF, emb_1xTxD)['params']
    table_VxD = embedding.init_table(table_key, cardinalities, embedding_dim, table_rows, global_row)
    return TrainState(
      params={'mlp': mlp_params, 'embedding': table_VxD},
      mlp_opt_state=mlp_optimizer.init(mlp_params),
      embedding_opt_state=embedding_optimizer.init(table_VxD),
      step=jnp.zeros((), jnp.int32),
      row_steps=jnp.zeros(table_VxD.shape[:1], jnp.int32),
    )

  return init(key)


def init_from_config(seed: int, model_config, optimizer_config, cardinalities) -> TrainState:
  """The state of ONE replica as a run's `model` and `optimizer` sections name it, from its `seed`: the model every
  replica of a run, and the gba server, start from (its table padded like a replica's, so that the two read each
  other's checkpoints)."""
  mlp_optimizer, embedding_optimizer = optimizers.make_optimizers(optimizer_config)
  cardinalities = list(cardinalities)
  return init_train_state(
    jax.random.key(seed),
    dlrm.from_config(model_config),
    cardinalities,
    model_config.embedding_dim,
    mlp_optimizer,
    embedding_optimizer,
    table_rows=table_placement.rows_held('replicated', sum(cardinalities), 1),
  )


def make_gradient_fn(
  model: DLRM, cardinalities: Sequence[int], placement: table_placement.TablePlacement | None = None
) -> Callable[[dict[str, Any], Batch], tuple[jax.Array, Any, Any, jax.Array]]:
  """gradients(params, batch) -> (loss, mlp_grads, routing, row_grads_NxD) of ONE replica's batch; pure.

  The embedding gradient comes as the gradients of the N = B T rows the batch looked up (repeats allowed), never as
  a table-sized array: what a sparse optimizer (or a parameter server, `gba.server`) consumes. `routing` is how
  `placement` found them (for the default, a table of the replica's own, the rows' ids `row_ids_N`);
  `placement.updates(routing, row_grads_NxD)` says which of them this device's table applies.
  """
  offsets_T = embedding.table_offsets(cardinalities)
  placement = table_placement.Replicated() if placement is None else placement

  def loss_fn(mlp_params, emb_BxTxD, dense_BxF, label_B):
    logits_B = model.apply({'params': mlp_params}, dense_BxF, emb_BxTxD)
    return optax.sigmoid_binary_cross_entropy(logits_B, label_B).mean()

  def gradients(params, batch: Batch):
    row_ids_N = embedding.global_row_ids(batch.sparse, offsets_T).reshape(-1)
    rows_NxD, routing = placement.lookup(params['embedding'], row_ids_N)
    emb_BxTxD = rows_NxD.reshape(*batch.sparse.shape, -1)
    loss, (mlp_grads, emb_grads_BxTxD) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
      params['mlp'], emb_BxTxD, batch.dense, batch.label
    )
    return loss, mlp_grads, routing, emb_grads_BxTxD.reshape(row_ids_N.shape[0], -1)

  return gradients


def make_apply_fn(
  mlp_optimizer: optax.GradientTransformation, embedding_optimizer: embedding.SparseOptimizer
) -> Callable[[TrainState, Any, jax.Array, jax.Array], TrainState]:
  """apply(state, mlp_grads, row_ids_N, row_grads_NxD) -> state with the update applied and `step + 1`; pure."""

  def apply(state: TrainState, mlp_grads, row_ids_N, row_grads_NxD):
    # Every read of the old params (the backward matmuls) happens before the in-place update: without this
    # ordering XLA copies each donated kernel to keep the old value alive.
    mlp_params, mlp_grads, row_grads_NxD = lax.optimization_barrier((state.params['mlp'], mlp_grads, row_grads_NxD))
    updates, mlp_opt_state = mlp_optimizer.update(mlp_grads, state.mlp_opt_state, mlp_params)
    mlp_params = optax.apply_updates(mlp_params, updates)
    table_VxD, embedding_opt_state = embedding_optimizer.update(
      state.params['embedding'], state.embedding_opt_state, row_ids_N, row_grads_NxD
    )
    row_steps = state.row_steps
    if row_steps is not None:  # Every row the optimizer was handed is stamped (ids >= V are dropped, as there).
      row_steps = row_steps.at[row_ids_N].set(state.step + 1, mode='drop')
    return TrainState(
      params={'mlp': mlp_params, 'embedding': table_VxD},
      mlp_opt_state=mlp_opt_state,
      embedding_opt_state=embedding_opt_state,
      step=state.step + 1,
      row_steps=row_steps,
    )

  return apply


def make_train_step(
  model: DLRM,
  cardinalities: Sequence[int],
  mlp_optimizer: optax.GradientTransformation,
  embedding_optimizer: embedding.SparseOptimizer,
  grad_axis_name: str | None = None,
  placement: table_placement.TablePlacement | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
  """train_step(state, batch) -> (state, {'loss': mean log loss of this replica's batch}); pure, not jitted.

  `grad_axis_name` (sync SGD): the MLP gradients are averaged over that axis. `placement` (default: each replica
  its own table, or with `grad_axis_name` a copy per replica updated by every replica's mean gradient) says where
  the rows are looked up and which updates this device's table applies (`table_placement`: `shared` sums every
  replica's sparse gradients into every copy, as trainers pushing to an embedding parameter server; `sharded`
  looks rows up from their owners and applies the updates of the rows this device owns).
  """
  if placement is None:
    placement = (
      table_placement.AllReplicas(grad_axis_name, mean=True)
      if grad_axis_name is not None
      else table_placement.Replicated()
    )
  gradients = make_gradient_fn(model, cardinalities, placement)
  apply = make_apply_fn(mlp_optimizer, embedding_optimizer)

  def train_step(state: TrainState, batch: Batch):
    loss, mlp_grads, routing, row_grads_NxD = gradients(state.params, batch)
    if grad_axis_name is not None:
      mlp_grads = lax.pmean(mlp_grads, grad_axis_name)
    row_ids_M, row_grads_MxD = placement.updates(routing, row_grads_NxD)
    return apply(state, mlp_grads, row_ids_M, row_grads_MxD), {'loss': loss}

  return train_step


def make_predict_fn(
  model: DLRM, cardinalities: Sequence[int]
) -> Callable[[dict[str, Any], jax.Array, jax.Array], jax.Array]:
  """predict(params, dense_BxF, sparse_BxT) -> click probabilities [B]; pure, not jitted."""
  offsets_T = embedding.table_offsets(cardinalities)

  def predict(params, dense_BxF, sparse_BxT):
    emb_BxTxD = embedding.lookup(params['embedding'], embedding.global_row_ids(sparse_BxT, offsets_T))
    return jax.nn.sigmoid(model.apply({'params': params['mlp']}, dense_BxF, emb_BxTxD))

  return predict
