"""The train step against a dense reference, its sync-SGD mode against one big batch, and learning."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.model import embedding
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.model.dlrm import DLRM

CARDS = [7, 3, 11] + [5] * 23  # small tables: ids repeat within and across replicas
DIM = 4
MODEL = DLRM(bottom_mlp=(8, DIM), top_mlp=(8, 1))


def _batch(seed, batch_size, learnable=False):
  rng = np.random.default_rng(seed)
  sparse = rng.integers(0, CARDS, (batch_size, len(CARDS))).astype(np.int32)
  dense = rng.standard_normal((batch_size, 13)).astype(np.float32)
  if learnable:  # a click iff feature 0 is positive or table 1's id is 0
    label = ((dense[:, 0] > 0) | (sparse[:, 1] == 0)).astype(np.float32)
  else:
    label = rng.integers(0, 2, batch_size).astype(np.float32)
  return Batch(dense=dense, sparse=sparse, label=label)


def _init(mlp_opt, emb_opt, seed=0):
  return step_lib.init_train_state(jax.random.key(seed), MODEL, CARDS, DIM, mlp_opt, emb_opt)


def test_init_train_state_shapes():
  state = _init(optax.adagrad(0.1), embedding.rowwise_adagrad(0.1))
  assert state.params['embedding'].shape == (sum(CARDS), DIM)
  assert state.embedding_opt_state.accumulator_V.shape == (sum(CARDS),)
  assert state.params['mlp']['top']['Dense_0']['kernel'].shape == (DIM + 27 * 26 // 2, 8)
  assert state.step.dtype == jnp.int32 and int(state.step) == 0


def test_sgd_step_equals_dense_sgd_on_all_params():
  """With SGD everywhere, the sparse step must equal plain SGD on {mlp, whole table} via jax.grad."""
  lr = 0.5
  state = _init(optax.sgd(lr), embedding.sparse_sgd(lr))
  batch = _batch(0, 16)
  offsets = embedding.table_offsets(CARDS)

  def dense_loss(params):
    emb_BxTxD = params['embedding'][batch.sparse + offsets]
    logits = MODEL.apply({'params': params['mlp']}, batch.dense, emb_BxTxD)
    return optax.sigmoid_binary_cross_entropy(logits, batch.label).mean()

  loss, grads = jax.jit(jax.value_and_grad(dense_loss))(state.params)
  want = jax.tree.map(lambda p, g: p - lr * g, state.params, grads)
  train_step = jax.jit(step_lib.make_train_step(MODEL, CARDS, optax.sgd(lr), embedding.sparse_sgd(lr)))
  new_state, metrics = train_step(state, batch)
  np.testing.assert_allclose(metrics['loss'], loss, rtol=1e-6)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), new_state.params, want)
  assert int(new_state.step) == 1
  touched = np.zeros(sum(CARDS), bool)
  touched[(batch.sparse + offsets).ravel()] = True
  assert np.any(~touched) and np.all(
    np.asarray(new_state.params['embedding'])[~touched] == np.asarray(state.params['embedding'])[~touched]
  )


def test_sync_sgd_over_four_replicas_equals_one_replica_on_the_global_batch():
  num_replicas, batch_size, steps = 4, 8, 3
  mlp_opt, emb_opt = optax.adagrad(0.1), embedding.rowwise_adagrad(0.1)
  one = _init(mlp_opt, emb_opt)
  stacked = jax.tree.map(lambda x: jnp.stack([x] * num_replicas), one)
  local_step = step_lib.make_train_step(MODEL, CARDS, mlp_opt, emb_opt, grad_axis_name='replica')
  global_step = jax.jit(step_lib.make_train_step(MODEL, CARDS, mlp_opt, emb_opt))

  def per_replica(state, batch):
    squeeze = lambda tree: jax.tree.map(lambda x: x[0], tree)
    new_state, metrics = local_step(squeeze(state), squeeze(batch))
    return jax.tree.map(lambda x: x[None], (new_state, metrics))

  mesh = jax.make_mesh((num_replicas,), ('replica',), devices=jax.devices()[:num_replicas])
  by_replica = jax.sharding.NamedSharding(mesh, P('replica'))
  sync_step = jax.jit(jax.shard_map(per_replica, mesh=mesh, in_specs=P('replica'), out_specs=P('replica')))
  stacked = jax.device_put(stacked, by_replica)
  for s in range(steps):
    batches = [_batch(10 * s + r, batch_size) for r in range(num_replicas)]
    stacked_batch = jax.device_put(jax.tree.map(lambda *x: np.stack(x), *batches), by_replica)
    stacked, metrics = sync_step(stacked, stacked_batch)
    one, global_metrics = global_step(one, jax.tree.map(lambda *x: np.concatenate(x), *batches))
  stacked, metrics = jax.device_get((stacked, metrics))
  np.testing.assert_allclose(np.mean(metrics['loss']), global_metrics['loss'], rtol=1e-5)
  for r in range(num_replicas):
    jax.tree.map(
      functools.partial(np.testing.assert_allclose, atol=1e-5), jax.tree.map(lambda x, r=r: x[r], stacked), one
    )
  assert not np.allclose(one.params['embedding'], _init(mlp_opt, emb_opt).params['embedding'])


def test_training_reduces_loss_on_a_learnable_problem():
  mlp_opt, emb_opt = optax.adagrad(0.05), embedding.rowwise_adagrad(0.1)
  state = _init(mlp_opt, emb_opt)
  train_step = jax.jit(step_lib.make_train_step(MODEL, CARDS, mlp_opt, emb_opt), donate_argnums=0)
  eval_batch = _batch(1000, 512, learnable=True)
  predict = jax.jit(step_lib.make_predict_fn(MODEL, CARDS))

  def eval_loss(params):
    probs = np.clip(np.asarray(predict(params, eval_batch.dense, eval_batch.sparse)), 1e-7, 1 - 1e-7)
    return -np.mean(eval_batch.label * np.log(probs) + (1 - eval_batch.label) * np.log(1 - probs))

  before = eval_loss(state.params)
  for s in range(150):
    state, _ = train_step(state, _batch(s, 64, learnable=True))
  after = eval_loss(state.params)
  assert after < 0.6 * before, (before, after)


def test_predict_is_sigmoid_of_the_model_on_looked_up_rows():
  state = _init(optax.sgd(0.1), embedding.sparse_sgd(0.1))
  batch = _batch(3, 6)
  table = np.asarray(state.params['embedding'])
  offsets = np.cumsum([0] + CARDS[:-1])
  emb_BxTxD = table[batch.sparse + offsets]
  logits = np.asarray(jax.jit(MODEL.apply)({'params': state.params['mlp']}, batch.dense, emb_BxTxD))
  got = jax.jit(step_lib.make_predict_fn(MODEL, CARDS))(state.params, batch.dense, batch.sparse)
  np.testing.assert_allclose(np.asarray(got), 1 / (1 + np.exp(-logits)), rtol=1e-6)
