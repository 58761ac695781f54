"""Sharded tables against the one-table math: lookups, the layout, and training steps on 8 devices (numpy reference)."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.model import embedding
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.model import table_placement
from shadowsync_jax.model.dlrm import DLRM

CARDS = [7, 3, 11, 1] + [5] * 21 + [40]  # V = 167: not a multiple of 8, so the last local rows are padding
NUM_ROWS = sum(CARDS)
DIM = 4
MODEL = DLRM(bottom_mlp=(8, DIM), top_mlp=(8, 1))
SHARDS = 8
AXIS = 'replica'


def _mesh(num_devices=SHARDS):
  return jax.make_mesh(
    (num_devices,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:num_devices]
  )


def _batches(seed, batch_size, num_replicas=SHARDS):
  rng = np.random.default_rng(seed)
  sparse = rng.integers(0, CARDS, (num_replicas, batch_size, len(CARDS))).astype(np.int32)
  sparse[:, :3, 25] = 17  # A hot row that every replica looks up several times.
  return Batch(
    dense=rng.standard_normal((num_replicas, batch_size, 13)).astype(np.float32),
    sparse=sparse,
    label=rng.integers(0, 2, (num_replicas, batch_size)).astype(np.float32),
  )


def _interleave(shards_SxVsxD):
  """Sharded table [S, Vs, D] -> the one table [V, D] (local row r of shard s is row r S + s)."""
  shards = np.asarray(shards_SxVsxD)
  return np.swapaxes(shards, 0, 1).reshape(-1, *shards.shape[2:])[:NUM_ROWS]


def _split(table_VxD, num_shards=SHARDS):
  """The inverse of `_interleave`, padding with zero rows."""
  layout = table_placement.ShardLayout(NUM_ROWS, num_shards)
  padded = np.zeros((layout.rows_per_shard * num_shards, *table_VxD.shape[1:]), table_VxD.dtype)
  padded[:NUM_ROWS] = table_VxD
  return np.swapaxes(padded.reshape(layout.rows_per_shard, num_shards, *table_VxD.shape[1:]), 0, 1)


def test_layout_puts_row_e_on_shard_e_mod_s():
  layout = table_placement.ShardLayout(num_rows=20, num_shards=8)
  assert layout.rows_per_shard == 3
  rows = np.arange(20)
  np.testing.assert_array_equal(layout.global_rows(layout.shard_of(rows), layout.local_row(rows)), rows)
  assert set(map(tuple, np.stack([layout.shard_of(rows), layout.local_row(rows)], 1))) == {
    (s, r) for s in range(8) for r in range(3) if r * 8 + s < 20
  }


def test_a_shard_initializes_to_the_rows_of_the_whole_table():
  key = jax.random.key(4)
  whole = np.asarray(jax.jit(lambda k: embedding.init_table(k, CARDS, DIM))(key))
  layout = table_placement.ShardLayout(NUM_ROWS, 3)
  for shard in range(3):
    got = jax.jit(
      lambda k, s=shard: embedding.init_table(
        k, CARDS, DIM, layout.rows_per_shard, functools.partial(layout.global_rows, s)
      )
    )(key)
    rows = layout.global_rows(shard, np.arange(layout.rows_per_shard))
    real = rows < NUM_ROWS
    np.testing.assert_array_equal(np.asarray(got)[real], whole[rows[real]])
    np.testing.assert_array_equal(np.asarray(got)[~real], 0.0)  # padding


@pytest.mark.parametrize('exchange', table_placement.EXCHANGES)
def test_sharded_lookup_reads_the_rows_of_the_one_table(exchange):
  rng = np.random.default_rng(0)
  table_VxD = rng.standard_normal((NUM_ROWS, DIM)).astype(np.float32)
  ids_SxN = rng.integers(0, NUM_ROWS, (SHARDS, 30)).astype(np.int32)
  ids_SxN[:, :5] = 9  # duplicates within and across devices
  ids_SxN[2, :] = 16  # every id of one device on one shard
  placement = table_placement.make('sharded', NUM_ROWS, AXIS, SHARDS, exchange)

  def one(shard_1, ids_1):
    return placement.lookup(shard_1[0], ids_1[0])[0][None]

  lookup = jax.jit(jax.shard_map(one, mesh=_mesh(), in_specs=P(AXIS), out_specs=P(AXIS)))
  np.testing.assert_array_equal(np.asarray(lookup(_split(table_VxD), ids_SxN)), table_VxD[ids_SxN])


def _one_table_reference(table_VxD, mlps, batches, lr, optimizer):
  """One step of R replicas on one logical table, computed densely: every replica's MLP takes its own gradient; the
  table takes the sum of all replicas' gradients (SGD, or row-wise Adagrad in numpy on the summed rows)."""
  offsets = embedding.table_offsets(CARDS)

  def loss(mlp, table, batch):
    logits = MODEL.apply({'params': mlp}, batch.dense, table[batch.sparse + offsets])
    return optax.sigmoid_binary_cross_entropy(logits, batch.label).mean()

  grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
  table_grad = np.zeros_like(table_VxD, np.float64)
  new_mlps = []
  for r, mlp in enumerate(mlps):
    mlp_grad, g_VxD = grad(mlp, table_VxD, jax.tree.map(lambda x, r=r: x[r], batches))
    new_mlps.append(jax.tree.map(lambda p, g: np.asarray(p) - lr * np.asarray(g), mlp, mlp_grad))
    table_grad += np.asarray(g_VxD, np.float64)
  if optimizer == 'sgd':
    return table_VxD - lr * table_grad, None, new_mlps
  acc_V = np.mean(table_grad**2, axis=1)
  return table_VxD - lr * table_grad / (np.sqrt(acc_V) + 1e-8)[:, None], acc_V, new_mlps


@pytest.mark.parametrize('exchange', table_placement.EXCHANGES)
@pytest.mark.parametrize('optimizer', ['sgd', 'rowwise_adagrad'])
def test_a_sharded_step_equals_one_table_trained_by_every_replica(optimizer, exchange):
  """8 replicas, one table sharded over their devices: after a step, the shards put together are the one table
  updated with every replica's summed gradients (duplicate ids across replicas summed before row-wise Adagrad),
  and each replica's MLP took its own gradient."""
  lr, batch_size = 0.3, 6
  emb_opt = embedding.sparse_sgd(lr) if optimizer == 'sgd' else embedding.rowwise_adagrad(lr)
  mlp_opt = optax.sgd(lr)
  one = step_lib.init_train_state(jax.random.key(1), MODEL, CARDS, DIM, mlp_opt, embedding.sparse_sgd(lr))
  table_VxD = np.asarray(one.params['embedding'])
  batches = _batches(3, batch_size)
  placement = table_placement.make('sharded', NUM_ROWS, AXIS, SHARDS, exchange)
  train_step = step_lib.make_train_step(MODEL, CARDS, mlp_opt, emb_opt, placement=placement)
  shard_rows = placement.layout.rows_per_shard

  def per_device(shard_1, mlp_1, batch_1):
    squeeze = lambda tree: jax.tree.map(lambda x: x[0], tree)
    params = {'mlp': squeeze(mlp_1), 'embedding': shard_1[0]}
    state = step_lib.TrainState(params, mlp_opt.init(params['mlp']), emb_opt.init(shard_1[0]), jnp.zeros((), jnp.int32))
    new_state, metrics = train_step(state, squeeze(batch_1))
    acc = getattr(new_state.embedding_opt_state, 'accumulator_V', jnp.zeros((shard_rows,)))
    return jax.tree.map(lambda x: x[None], (new_state.params, acc, metrics['loss']))

  step = jax.jit(jax.shard_map(per_device, mesh=_mesh(), in_specs=P(AXIS), out_specs=P(AXIS)))
  mlps_R = jax.tree.map(lambda x: np.stack([x] * SHARDS), one.params['mlp'])
  params_R, acc_SxVs, _ = jax.device_get(step(_split(table_VxD), mlps_R, batches))

  want_table, want_acc, want_mlps = _one_table_reference(
    table_VxD, [one.params['mlp']] * SHARDS, batches, lr, optimizer
  )
  np.testing.assert_allclose(_interleave(params_R['embedding']), want_table, atol=2e-6)
  if want_acc is not None:
    np.testing.assert_allclose(_interleave(acc_SxVs), want_acc, rtol=1e-5, atol=1e-9)
  for r in range(SHARDS):
    jax.tree.map(
      functools.partial(np.testing.assert_allclose, atol=2e-6),
      jax.tree.map(lambda x, r=r: x[r], params_R['mlp']),
      want_mlps[r],
    )
  np.testing.assert_array_equal(np.asarray(params_R['embedding'])[:, -1][-1], 0.0)  # padding rows stay empty


def test_sharded_sync_sgd_applies_the_replicas_mean_gradient():
  """Under sync SGD the owner applies the mean of the replicas' gradients, as the one-model step on the global batch
  does (SGD: the table moves by lr times the mean)."""
  lr, batch_size, num_replicas = 0.5, 4, 4
  one = step_lib.init_train_state(jax.random.key(2), MODEL, CARDS, DIM, optax.sgd(lr), embedding.sparse_sgd(lr))
  batches = _batches(5, batch_size, num_replicas)
  placement = table_placement.make('sharded', NUM_ROWS, AXIS, num_replicas, mean_gradients=True)
  local_step = step_lib.make_train_step(
    MODEL, CARDS, optax.sgd(lr), embedding.sparse_sgd(lr), grad_axis_name=AXIS, placement=placement
  )

  def per_device(shard_1, mlp_1, batch_1):
    squeeze = lambda tree: jax.tree.map(lambda x: x[0], tree)
    params = {'mlp': squeeze(mlp_1), 'embedding': shard_1[0]}
    state = step_lib.TrainState(params, optax.sgd(lr).init(params['mlp']), (), jnp.zeros((), jnp.int32))
    return jax.tree.map(lambda x: x[None], local_step(state, squeeze(batch_1))[0].params)

  step = jax.jit(jax.shard_map(per_device, mesh=_mesh(num_replicas), in_specs=P(AXIS), out_specs=P(AXIS)))
  mlps_R = jax.tree.map(lambda x: np.stack([x] * num_replicas), one.params['mlp'])
  got = jax.device_get(step(_split(np.asarray(one.params['embedding']), num_replicas), mlps_R, batches))
  global_step = jax.jit(step_lib.make_train_step(MODEL, CARDS, optax.sgd(lr), embedding.sparse_sgd(lr)))
  want, _ = global_step(one, jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), batches))
  shards = np.swapaxes(np.asarray(got['embedding']), 0, 1).reshape(-1, DIM)[:NUM_ROWS]
  np.testing.assert_allclose(shards, np.asarray(want.params['embedding']), atol=2e-6)
  for r in range(num_replicas):
    jax.tree.map(
      functools.partial(np.testing.assert_allclose, atol=2e-6),
      jax.tree.map(lambda x, r=r: x[r], got['mlp']),
      jax.device_get(want.params['mlp']),
    )
