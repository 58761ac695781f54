"""The foreground driver against a numpy reference, driver selection, and no collective in the shadow train step.

The train step is faked by one that adds a known per-replica delta to the params, so every number a round sees and
returns is known exactly (small integers, replica means over 4 or 8 replicas are exact in float32).
"""

import re

import fake_training
from fake_training import FakeState
import jax
import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import block_plan
from shadowsync_jax import dispatch
from shadowsync_jax import train
from shadowsync_jax.data import batch as batch_lib
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms as sync_algorithms
from shadowsync_jax.sync import drivers as sync_drivers
from shadowsync_jax.sync import foreground
from shadowsync_jax.sync import rounds
from shadowsync_jax.sync import scheduled

COLLECTIVE = re.compile(r'all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter')


def _fake_state(params: dict[str, np.ndarray], mesh) -> FakeState:
  num_replicas = mesh.shape[replicas.REPLICA_AXIS]
  return replicas.shard(FakeState(params=params, step=np.zeros(num_replicas, np.int32)), mesh)


@pytest.mark.parametrize('num_replicas,groups', [(4, ('mlp', 'embedding')), (8, ('mlp',))])
def test_foreground_ma_rounds_every_k_steps_on_the_live_params(num_replicas, groups):
  """Every k-th step (and only then) the synced groups become the replica mean of the params of that very step."""
  every_k, num_steps = 3, 11
  mesh = replicas.make_mesh(num_replicas)
  want, delta = fake_training.initial(num_replicas)
  delta_R = replicas.shard(delta, mesh)
  driver = foreground.ForegroundSync(
    sync_algorithms.model_averaging(replicas.REPLICA_AXIS),
    'ma',
    replicas.ReplicaMeshes(mesh, mesh),
    groups,
    every_k_steps=every_k,
  )
  state = _fake_state(want, mesh)
  driver.start(state, driver.initial_sync_state(state))
  for step in range(1, num_steps + 1):
    state = fake_training.at_boundary(driver, step, fake_training.step(state, delta_R))  # The round due here.
    want = jax.tree.map(np.add, want, delta)
    if step % every_k == 0:
      for group in groups:
        want[group] = jax.tree.map(lambda x: np.broadcast_to(x.mean(axis=0), x.shape), want[group])
    for group in ('mlp', 'embedding'):
      jax.tree.map(
        lambda got, w, group=group, step=step: np.testing.assert_array_equal(
          np.asarray(got), w, err_msg=f'{group}, step {step}'
        ),
        state.params[group],
        want[group],
      )
    if step % every_k == 0:  # Right after a round the synced replicas are equal; unsynced ones never are.
      assert np.all(np.asarray(state.params['mlp']['kernel']) == np.asarray(state.params['mlp']['kernel'])[0])
    if 'embedding' not in groups:
      assert len(np.unique(np.asarray(state.params['embedding'])[:, 0, 0])) == num_replicas
  assert driver.finish(state) is state
  assert driver.stats()['sync_rounds'] == num_steps // every_k
  assert driver.stats()['mean_sync_gap'] == every_k
  assert driver.stats()['max_sync_gap'] == every_k
  assert driver.stats()['mean_round_latency_s'] > 0
  consensus = driver.consensus(state.params)
  jax.tree.map(lambda got, w: np.testing.assert_allclose(np.asarray(got), w.mean(axis=0), rtol=1e-6), consensus, want)


def test_foreground_resumes_from_the_given_step_and_sync_state():
  """Resumed at step 100 with a restored EA center: rounds at 104 and 108 (gaps 4), pulled toward that center."""
  num_replicas, alpha = 4, 0.1
  mesh = replicas.make_mesh(num_replicas)
  want, delta = fake_training.initial(num_replicas)
  driver = foreground.ForegroundSync(
    sync_algorithms.elastic_averaging(replicas.REPLICA_AXIS, alpha),
    'ea',
    replicas.ReplicaMeshes(mesh, mesh),
    ('mlp',),
    every_k_steps=4,
  )
  state = _fake_state(want, mesh)._replace(step=replicas.shard(np.full(num_replicas, 100, np.int32), mesh))
  center = {'mlp': {'kernel': np.full((3, 2), -5.0, np.float32)}}  # far from the initial replica mean
  driver.start(
    state,
    sync_algorithms.ElasticAveragingState(
      center=replicas.shard(jax.tree.map(lambda c: np.stack([c] * num_replicas), center), mesh)
    ),
  )
  delta_R = replicas.shard(delta, mesh)
  for step in range(101, 110):
    state = fake_training.at_boundary(driver, step, fake_training.step(state, delta_R))  # The round due here.
    want = jax.tree.map(np.add, want, delta)
    if step % 4 == 0:
      diff = jax.tree.map(lambda w, c: alpha * (w - c), want['mlp'], center['mlp'])
      want['mlp'] = jax.tree.map(np.subtract, want['mlp'], diff)
      center['mlp'] = jax.tree.map(lambda c, d: c + d.sum(axis=0), center['mlp'], diff)
  jax.tree.map(lambda got, w: np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-5), state.params, want)
  assert driver.stats()['sync_rounds'] == 2
  assert driver.stats()['mean_sync_gap'] == 4 and driver.stats()['max_sync_gap'] == 4
  jax.tree.map(
    lambda got, c: np.testing.assert_allclose(np.asarray(got)[0], c, rtol=1e-5, atol=1e-5),
    driver.sync_state().center,
    center,
  )


def test_foreground_ea_keeps_its_center_across_rounds():
  """EA through the driver: the sync state (the center) carries over rounds and is the consensus (docs/design.md §3)."""
  num_replicas, alpha = 4, 0.1
  mesh = replicas.make_mesh(num_replicas)
  want, delta = fake_training.initial(num_replicas)
  center = jax.tree.map(lambda x: x.mean(axis=0), want)
  driver = foreground.ForegroundSync(
    sync_algorithms.elastic_averaging(replicas.REPLICA_AXIS, alpha),
    'ea',
    replicas.ReplicaMeshes(mesh, mesh),
    ('mlp', 'embedding'),
    every_k_steps=2,
  )
  state = _fake_state(want, mesh)
  driver.start(state, driver.initial_sync_state(state))
  delta_R = replicas.shard(delta, mesh)
  for step in range(1, 7):
    state = fake_training.at_boundary(driver, step, fake_training.step(state, delta_R))  # The round due here.
    want = jax.tree.map(np.add, want, delta)
    if step % 2 == 0:
      diff = jax.tree.map(lambda w, c: alpha * (w - c), want, center)
      want = jax.tree.map(np.subtract, want, diff)
      center = jax.tree.map(lambda c, d: c + d.sum(axis=0), center, diff)
  jax.tree.map(lambda got, w: np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-5), state.params, want)
  jax.tree.map(
    lambda got, c: np.testing.assert_allclose(np.asarray(got), c, rtol=1e-5, atol=1e-5),
    driver.consensus(state.params),
    center,
  )
  assert driver.stats()['sync_rounds'] == 3


def _config(algorithm: str, num_replicas: int = 4, **sync):
  config = default.get_config('tiny')
  config.num_replicas, config.batch_size = num_replicas, 8
  config.model.bottom_mlp, config.model.top_mlp, config.model.embedding_dim = (8, 4), (8, 1), 4
  config.data.cardinalities = (10,) * batch_lib.NUM_SPARSE_FEATURES
  config.sync.algorithm = algorithm
  for key, value in sync.items():
    config.sync[key] = value
  return config


@pytest.mark.parametrize(
  'algorithm,driver_type,groups',
  [
    ('none', foreground.NoSync, None),
    ('sync_sgd', foreground.NoSync, None),
    ('fr_ma', foreground.ForegroundSync, ('mlp', 'embedding')),
    ('fr_bmuf', foreground.ForegroundSync, ('mlp', 'embedding')),
    ('shadow_ea', scheduled.ScheduledShadowSync, ('mlp', 'embedding')),  # One process: rounds between blocks.
  ],
)
def test_make_driver_picks_the_driver_of_the_algorithm(algorithm, driver_type, groups):
  driver = sync_drivers.make(_config(algorithm).sync, replicas.make_meshes(4), 4)
  assert type(driver) is driver_type  # pylint: disable=unidiomatic-typecheck
  if groups is not None:
    assert driver._groups == groups  # pylint: disable=protected-access


def test_make_driver_dense_only_and_its_settings():
  config = _config('fr_ea', what='dense', every_k_steps=7)
  driver = sync_drivers.make(config.sync, replicas.make_meshes(4), config.num_replicas)
  assert driver._groups == ('mlp',) and driver._every == 7  # pylint: disable=protected-access
  driver = sync_drivers.make(_config('shadow_ma', min_interval_s=0.25).sync, replicas.make_meshes(4), 4)
  assert driver.stats()['sync_interval_s'] == 0.25
  driver = sync_drivers.make(_config('shadow_ma', max_overhead=0.2).sync, replicas.make_meshes(4), 4)
  pacer = driver._pacer  # pylint: disable=protected-access
  assert pacer.fixed_interval_s is None and pacer.max_overhead == 0.2  # min_interval_s='auto', the default.


def test_the_first_shadow_round_waits_for_the_probe_of_the_k_it_runs():
  """The caller (train) gives the steps before the first round: the compiling block and 'auto''s probe
  (`block_plan.steps_until_chosen`: 28 under 'auto' for every shadow algorithm, each running blocks of the K it
  chooses; 1 under a K the config names, or one in use: a restart)."""
  meshes = replicas.make_meshes(4)
  for algorithm, steps_per_dispatch, first_round_after in (
    ('shadow_ma', 'auto', 28),
    ('shadow_ea', 'auto', 28),
    ('shadow_bmuf', 'auto', 28),
    ('shadow_ma', 16, 1),
  ):
    config = _config(algorithm)
    waits = block_plan.steps_until_chosen(steps_per_dispatch)
    driver = sync_drivers.make(config.sync, meshes, config.num_replicas, first_round_after=waits)
    assert driver._first_round_after == first_round_after, (algorithm, steps_per_dispatch)  # pylint: disable=protected-access
    restarted = driver.fresh()  # A restart's (`restarted`), mid-run: no probe.
    assert restarted._first_round_after == 1  # pylint: disable=protected-access
    assert type(restarted) is type(driver) and restarted._groups == driver._groups  # pylint: disable=protected-access


def test_a_driver_without_a_thread_restarts_itself():
  """Full recovery asks the driver for its restart (`SyncDriver.restarted`): `none`/`sync_sgd` have no thread or
  round in flight to end, so the driver itself goes on."""
  driver = foreground.NoSync('none', replicas.make_meshes(1))
  assert driver.restarted(None, None) is driver


def test_no_sync_stats():
  for algorithm, num_rounds, gap in (('none', 0, None), ('sync_sgd', 5, 1.0)):
    driver = foreground.NoSync(algorithm, replicas.make_meshes(1))
    for step in range(1, 6):
      fake_training.at_boundary(driver, step, None)
    assert driver.stats()['sync_rounds'] == num_rounds and driver.stats()['mean_sync_gap'] == gap, algorithm


def test_gap_tracker():
  gaps = rounds.GapTracker()
  gaps.reset(10)
  assert gaps.stats() == {'sync_rounds': 0, 'mean_sync_gap': None, 'max_sync_gap': None, 'mean_round_latency_s': None}
  gaps.merged(13, 0.5)
  gaps.merged(20, 1.5)
  assert gaps.stats() == {'sync_rounds': 2, 'mean_sync_gap': 5.0, 'max_sync_gap': 7, 'mean_round_latency_s': 1.0}


def _compiled_step_text(config) -> str:
  """The HLO that XLA runs for the replicated train step of `config` (abstract inputs: nothing is initialized)."""
  mesh = replicas.make_mesh(config.num_replicas)
  state = train.abstract_state(config, replicas.ReplicaMeshes(mesh, mesh))
  leading = (config.num_replicas, config.batch_size)
  batch = batch_lib.Batch(
    dense=jax.ShapeDtypeStruct((*leading, batch_lib.NUM_DENSE_FEATURES), np.float32),
    sparse=jax.ShapeDtypeStruct((*leading, batch_lib.NUM_SPARSE_FEATURES), np.int32),
    label=jax.ShapeDtypeStruct(leading, np.float32),
  )
  return dispatch.make_train_step(config, replicas.ReplicaMeshes(mesh, mesh)).lower(state, batch).compile().as_text()


@pytest.mark.parametrize('algorithm', ['shadow_ma', 'fr_ma', 'none'])
def test_train_step_without_sync_sgd_has_no_collective(algorithm):
  """docs/design.md §3: in shadow (and foreground, and none) modes the compiled step never talks to another replica."""
  text = _compiled_step_text(_config(algorithm))
  assert not COLLECTIVE.findall(text), f'{algorithm}: {sorted(set(COLLECTIVE.findall(text)))}'


@pytest.mark.parametrize(
  'algorithm,placement,collectives',
  [
    ('sync_sgd', 'replicated', {'all-reduce', 'all-gather'}),  # MLP gradients averaged, sparse updates gathered
    ('shadow_ma', 'shared', {'all-gather'}),  # the shared table's sparse updates, by design (docs/design.md §4)
  ],
)
def test_collectives_the_step_does_have(algorithm, placement, collectives):
  """The other side of the check above: the regex does find the collectives that are there by design."""
  text = _compiled_step_text(_config(algorithm, embedding_placement=placement))
  assert set(COLLECTIVE.findall(text)) == collectives
