"""The evaluated model (docs/design.md §3): the consensus of each algorithm against numpy, and its predictions read
where the tables live (replica means row by row, EA's center, sharded rows) against predictions of the whole model."""

import jax
import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import train
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms as sa
from shadowsync_jax.sync import consensus
from shadowsync_jax.sync import rounds

NUM_REPLICAS = 4
ALL = ('mlp', 'embedding')


def _config(placement='replicated'):
  config = default.get_config('tiny')
  config.num_replicas = NUM_REPLICAS
  config.data.cardinalities = (3, 7, 30) + (5,) * 23
  config.sync.embedding_placement = placement
  config.train.eval_per_replica = True
  return config


def _replicas_apart(config, meshes):
  """The initial state with every replica's params moved by its own noise, so that the replicas differ."""
  state = train.init_replicated_state(config, meshes)
  rng = np.random.default_rng(0)
  noisy = jax.tree.map(
    lambda x: np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(np.float32), jax.device_get(state.params)
  )
  return replicas.shard(noisy, meshes.local)


def _sync_state(name, params_R, groups, meshes):
  """The state of one round of `name` over `groups`, then local steps (noise) on the params."""
  algorithm = sa.make(name, replicas.REPLICA_AXIS, NUM_REPLICAS, 0.2, -1.0, 1.0)
  init_R, sync_R = sa.stacked(algorithm, meshes.job)
  synced, sync_state_R = sync_R(rounds.select(params_R, groups), init_R(rounds.select(params_R, groups)))
  rng = np.random.default_rng(1)
  moved = jax.tree.map(
    lambda x: np.asarray(x) + 0.01 * rng.standard_normal(x.shape).astype(np.float32),
    jax.device_get(rounds.with_synced(params_R, synced)),
  )
  return replicas.shard(moved, meshes.local), sync_state_R


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), jax.device_get(tree))


@pytest.mark.parametrize('name', ['ma', 'ea', 'bmuf'])
def test_materialized_consensus_is_the_mean_or_the_center(name):
  meshes = replicas.make_meshes(NUM_REPLICAS)
  params, sync_state = _sync_state(name, _replicas_apart(_config(), meshes), ALL, meshes)
  got = _host(consensus.materialize(consensus.Rule(name, ALL), params, sync_state, meshes))
  if name == 'ea':
    want = jax.tree.map(lambda c: c[0], _host(sync_state.center))
  else:
    want = jax.tree.map(lambda w: w.mean(axis=0), _host(params))
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6), got, want)


def test_materialized_consensus_of_none_and_sync_sgd():
  meshes = replicas.make_meshes(NUM_REPLICAS)
  params = _replicas_apart(_config(), meshes)
  host = _host(params)
  none = _host(consensus.materialize(consensus.Rule('none'), params, None, meshes))
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w.mean(axis=0), rtol=1e-5, atol=1e-6), none, host)
  one = _host(consensus.materialize(consensus.Rule('sync_sgd'), params, None, meshes))
  jax.tree.map(lambda g, w: np.testing.assert_array_equal(g, w[0]), one, host)


def _whole_model_predictions(config, params, examples):
  predict = jax.jit(step_lib.make_predict_fn(dlrm.from_config(config.model), list(config.data.cardinalities)))
  return np.asarray(predict(params, examples.dense, examples.sparse))


@pytest.mark.parametrize(
  'placement,name,groups',
  [
    ('replicated', 'none', ()),  # the replica mean, read row by row
    ('replicated', 'ea', ALL),  # the center's table, read on every device from its own copy
    ('replicated', 'bmuf', ('mlp',)),  # the synced MLP's consensus, the unsynced tables' mean
    ('shared', 'ma', ALL),
    ('sharded', 'ma', ('mlp',)),  # rows from their owner shards
    ('sharded', 'sync_sgd', ()),
  ],
)
def test_predictions_read_where_the_model_lives_equal_those_of_the_whole_model(placement, name, groups):
  config = _config(placement)
  meshes = replicas.make_meshes(NUM_REPLICAS)
  params = _replicas_apart(config, meshes)
  if name == 'sync_sgd':  # Its replicas are one model.
    params = replicas.shard(
      {**jax.device_get(params), 'mlp': jax.device_get(train.init_replicated_state(config, meshes).params['mlp'])},
      meshes.local,
    )
  sync_state = None
  if groups:
    params, sync_state = _sync_state(name, params, groups, meshes)
  rule = consensus.Rule(name, groups, consensus.Tables(placement))
  examples = jax.device_get(_whole_examples(config))
  predict = consensus.make_predict(config.model, config.data.cardinalities, meshes, rule, per_replica=True)
  got = predict(params, sync_state, examples.dense, examples.sparse)  # 37 examples: not a multiple of 4
  whole = jax.device_get(consensus.materialize(rule, params, sync_state, meshes))
  assert got.shape == (1 + NUM_REPLICAS, 37)
  np.testing.assert_allclose(got[0], _whole_model_predictions(config, whole, examples), rtol=2e-5, atol=1e-6)
  host = jax.device_get(params)
  for r in range(NUM_REPLICAS):
    own = {'mlp': jax.tree.map(lambda x, r=r: x[r], host['mlp']), 'embedding': whole['embedding']}
    if placement != 'sharded':
      own['embedding'] = host['embedding'][r]
    np.testing.assert_allclose(got[1 + r], _whole_model_predictions(config, own, examples), rtol=2e-5, atol=1e-6)


def _whole_examples(config):
  from shadowsync_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top

  _, eval_source = input_pipeline.make_sources(config.data, config.seed)
  return eval_source.read(0, 37)


def test_fingerprint_tells_models_apart_and_is_the_same_for_the_same_model():
  config = _config()
  meshes = replicas.make_meshes(NUM_REPLICAS)
  params = _replicas_apart(config, meshes)
  rule = consensus.Rule('none')
  first = consensus.fingerprint(rule, params, None, meshes)
  assert consensus.fingerprint(rule, params, None, meshes) == first
  table = np.asarray(params['embedding']).copy()
  table[3, 17, 2] += 1e-3  # one value of one replica's table
  moved = replicas.shard({**jax.device_get(params), 'embedding': table}, meshes.local)
  assert consensus.fingerprint(rule, moved, None, meshes) != first
