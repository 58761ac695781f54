"""Incremental checkpoints: a baseline, then the rows changed since it; a restore is exactly what was saved, and
nothing a restore may need is deleted."""

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.configs import default
from shadowsync_jax import config as config_lib
from shadowsync_jax.model import embedding
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.parallel import memory
from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import differentials
from shadowsync_jax.recovery import incremental
from shadowsync_jax.recovery import live_state
from shadowsync_jax.recovery import modes as recovery_modes
from shadowsync_jax.recovery import training_state

L, V, D = 2, 1000, 3


def _state(meshes, rng):
  placed = lambda x: jax.device_put(x, replicas.replica_sharding(meshes.local))
  state = step_lib.TrainState(
    params={'mlp': {'w': rng.standard_normal((L, 4, 2)).astype(np.float32)}, 'embedding': np.zeros((L, V, D))},
    mlp_opt_state={'sum': rng.standard_normal((L, 4, 2)).astype(np.float32)},
    embedding_opt_state=embedding.RowwiseAdagradState(np.zeros((L, V), np.float32), np.zeros((L, V), np.float32)),
    step=np.zeros(L, np.int32),
    row_steps=np.zeros((L, V), np.int32),
  )
  state = state._replace(params={**state.params, 'embedding': rng.standard_normal((L, V, D)).astype(np.float32)})
  return jax.tree.map(placed, {'train': state})


def _train(tree, rng, step, rows_per_replica):
  """Writes `rows_per_replica` random rows of each replica's table and optimizer state, stamped, as a step does;
  and every dense leaf."""
  host = jax.tree.map(np.array, tree)
  state = host['train']
  for replica in range(L):
    rows = rng.choice(V, rows_per_replica, replace=False)
    state.params['embedding'][replica, rows] = rng.standard_normal((rows_per_replica, D))
    state.embedding_opt_state.accumulator_V[replica, rows] += 1.0
    state.row_steps[replica, rows] = step
  state.params['mlp']['w'][:] = rng.standard_normal(state.params['mlp']['w'].shape)
  state.step[:] = step
  sharding = jax.tree.leaves(tree)[0].sharding
  return jax.tree.map(lambda x: jax.device_put(x, sharding), host)


def _assert_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_differentials_hold_the_rows_changed_since_the_baseline_and_restore_exactly(tmp_path):
  meshes, rng = replicas.make_meshes(L), np.random.default_rng(0)
  full = checkpointing.Checkpointer(tmp_path / 'checkpoints', meshes, max_to_keep=None)
  checkpointer = incremental.IncrementalCheckpointer(full, meshes, rebaseline_fraction=0.5, keep=2)
  tree = _state(meshes, rng)
  saved = {}
  for step, rows in ((10, 0), (20, 30), (30, 40), (40, 600), (50, 10)):
    tree = _train(tree, rng, step, rows) if rows else tree
    assert checkpointer.save(step, tree, position=step)
    saved[step] = jax.tree.map(np.array, tree)
    checkpointer.wait()
    if step == 30:  # Not a chain: 30 names the baseline of 10, and holds the rows of 20 too.
      assert checkpointer.baseline_of(20) == checkpointer.baseline_of(30) == 10
      restored, data = checkpointer.restore(20, training_state.abstract_like(tree))
      _assert_equal(restored, saved[20])
      assert data == {'step': 20, 'position': 20}
  stats = checkpointer.stats()
  # 10 the first baseline; at 40 more than half the rows changed since it (600 of each replica's 1,000 and more): a
  # new baseline; 20, 30, 50 differentials.
  assert stats['checkpoint_baselines'] == 2 and stats['checkpoint_differentials'] == 3, stats
  assert stats['restores'] == 1 and stats['restore_s'] > 0, stats  # The restore of 20: a differential, counted.
  changed = sum(int((saved[s]['train'].row_steps > b).sum()) for s, b in ((20, 10), (30, 10), (50, 40)))
  assert stats['checkpoint_rows_written'] == 2 * L * V + changed, stats
  assert [checkpointer.baseline_of(s) for s in (40, 50)] == [40, 40]
  # keep=2: the two newest and what they need; 10, 20 and 30 went at the save of 50.
  assert checkpointer.all_steps() == [40, 50]
  abstract = training_state.abstract_like(tree)
  restored, data = checkpointer.restore(50, abstract)
  _assert_equal(restored, saved[50])
  assert data['position'] == 50
  assert jax.tree.leaves(restored)[0].sharding == jax.tree.leaves(abstract)[0].sharding
  checkpointer.close()


def test_a_baseline_comes_when_half_the_rows_changed_not_when_the_differentials_add_up_to_a_whole_one(tmp_path):
  """A baseline blocks the loop, a differential does not: the rule weighs the differential a restore would read."""
  meshes, rng = replicas.make_meshes(L), np.random.default_rng(2)
  full = checkpointing.Checkpointer(tmp_path / 'checkpoints', meshes, max_to_keep=None)
  tree = initial = _state(meshes, rng)
  checkpointer = incremental.IncrementalCheckpointer(full, meshes, rebaseline_fraction=0.5, initial=lambda: initial)
  shares = []
  for step in range(1, 6):  # 100 random rows a replica each time: ~10%, 19%, 27%, 34%, 41% of them changed.
    tree = _train(tree, rng, step, 100)
    checkpointer.save(step, tree)
    shares.append(checkpointer.last_save['bytes'] / memory.state_bytes(tree))
  assert checkpointer.stats()['checkpoint_baselines'] == 0 and sum(shares) > 1.0 and max(shares) < 0.5, shares
  tree = _train(tree, rng, 6, 400)  # Now more than half the rows changed since the initial state.
  checkpointer.save(6, tree)
  assert checkpointer.last_save['kind'] == 'baseline' and checkpointer.stats()['checkpoint_baselines'] == 1
  checkpointer.wait()
  restored, _ = checkpointer.restore(5, training_state.abstract_like(tree))
  assert int(np.asarray(restored['train'].step)[0]) == 5
  checkpointer.close()


def test_a_killed_differential_is_never_read_and_a_restart_keeps_what_restores_need(tmp_path):
  meshes, rng = replicas.make_meshes(L), np.random.default_rng(1)
  make = lambda: incremental.IncrementalCheckpointer(
    checkpointing.Checkpointer(tmp_path / 'checkpoints', meshes, max_to_keep=None), meshes, keep=2
  )
  checkpointer, tree = make(), _state(meshes, rng)
  checkpointer.save(8, tree)
  tree = _train(tree, rng, 16, 20)
  checkpointer.save(16, tree)
  checkpointer.close()
  differentials = tmp_path / 'checkpoints' / 'differentials' / 'process_0'
  (differentials / '24_8.npz.tmp').write_bytes(b'half a file')  # A kill mid-write.
  again = make()
  assert again.all_steps() == [8, 16] and not list(differentials.glob('*.tmp'))
  restored, _ = again.restore(16, training_state.abstract_like(tree))
  _assert_equal(restored, tree)
  for step in (24, 32, 40):  # Differentials of the baseline of 8: it stays while any of them is kept.
    tree = _train(tree, rng, step, 5)
    again.save(step, tree)
  again.wait()
  assert again.all_steps() == [8, 32, 40]
  again.delete_before(40)
  assert again.all_steps() == [8, 40]
  assert again.delete_after(8) == [40] and again.all_steps() == [8]
  again.close()


def test_the_initial_state_is_the_first_baseline_rebuilt_never_written(tmp_path):
  """With `initial` (the state at step 0, rebuilt from the seed) the first save is already a differential over it:
  nothing whole is written until the differentials add up to a whole checkpoint; a restore builds the initial state
  and lays the differential over it, bit for bit, also in a new start; without a way to rebuild it, it says so."""
  meshes, rng = replicas.make_meshes(L), np.random.default_rng(2)
  initial = _state(meshes, np.random.default_rng(3))
  built = []
  build = lambda: built.append(1) or jax.tree.map(jnp.copy, initial)
  make = lambda build: incremental.IncrementalCheckpointer(
    checkpointing.Checkpointer(tmp_path / 'checkpoints', meshes, max_to_keep=None),
    meshes,
    rebaseline_fraction=0.5,
    keep=2,
    initial=build,
  )
  checkpointer, abstract = make(build), training_state.abstract_like(initial)
  checkpointer.note_initial(initial)  # As a run that starts from it: its differentials say which one they need.
  tree = _train(initial, rng, 10, 30)
  assert checkpointer.save(10, tree, position=10)
  checkpointer.wait()
  assert checkpointer.baseline_of(10) == incremental.INITIAL and not built, 'nothing built to save'
  assert checkpointer.stats()['checkpoint_baselines'] == 0 and checkpointer.stats()['checkpoint_differentials'] == 1
  restored, data = checkpointer.restore(10, abstract)
  _assert_equal(restored, tree)
  assert data == {'step': 10, 'position': 10} and len(built) == 1
  assert jax.tree.leaves(restored)[0].sharding == jax.tree.leaves(abstract)[0].sharding
  tree = _train(tree, rng, 20, 20)
  checkpointer.save(20, tree)
  saved_20 = jax.tree.map(np.array, tree)
  checkpointer.close()
  again = make(build)  # A new start over the same directory.
  assert again.all_steps() == [10, 20] and again.baseline_of(20) == incremental.INITIAL
  _assert_equal(again.restore(20, abstract)[0], saved_20)
  tree = _train(tree, rng, 30, 600)  # Most rows changed: the differentials would add up to half a whole one.
  again.save(30, tree)
  again.wait()
  assert again.stats()['checkpoint_baselines'] == 1 and again.baseline_of(30) == 30
  assert again.all_steps() == [20, 30]  # keep=2; 10 went, and nothing needs the initial state.
  again.close()
  with pytest.raises(ValueError, match='no way to rebuild it'):
    make(None).restore(20, abstract)


def test_a_differential_is_refused_over_another_initial_state_or_into_other_shapes_naming_what_differs(tmp_path):
  """What a differential restores is only exact over the initial state it was taken from, into the shapes it was
  taken of: another one (another seed) or other shapes are refused in one line naming the leaf and the settings that
  differ, before anything is laid over it; the same run restores it."""
  meshes = replicas.make_meshes(L)
  initial = _state(meshes, np.random.default_rng(3))
  make = lambda build, settings: incremental.IncrementalCheckpointer(
    checkpointing.Checkpointer(tmp_path / 'checkpoints', meshes, max_to_keep=None),
    meshes,
    initial=build,
    settings=settings,
  )
  copy = lambda tree: lambda: jax.tree.map(jnp.copy, tree)  # Built anew, as a run builds it.
  saving = make(copy(initial), {'seed': 3, 'data.cardinalities': [V, V]})
  saving.note_initial(initial)
  tree = _train(initial, np.random.default_rng(2), 10, 30)
  saving.save(10, tree)
  saving.close()
  abstract = training_state.abstract_like(initial)
  other_seed = _state(meshes, np.random.default_rng(4))
  refusing = make(copy(other_seed), {'seed': 4, 'data.cardinalities': [V, V]})
  with pytest.raises(checkpointing.MismatchError) as refused:
    refusing.restore(10, abstract)
  message = str(refused.value)
  assert '\n' not in message and "initial state of another run (['train'].params['embedding'] differs" in message
  assert 'settings that differ: seed 3 there, 4 here. Use a new workdir' in message, message
  narrower = jax.tree.map(lambda x: x[:, : V - 10] if x.ndim >= 2 and x.shape[1] == V else x, initial)
  with pytest.raises(checkpointing.MismatchError, match=r"\['train'\].params\['embedding'\] is \[\[2, 1000, 3\]"):
    make(copy(narrower), {'seed': 3, 'data.cardinalities': [V, V - 10]}).restore(
      10, training_state.abstract_like(narrower)
    )
  _assert_equal(make(copy(initial), {'seed': 3}).restore(10, abstract)[0], tree)  # Settings are only said.
  assert differentials.fingerprint(initial) != differentials.fingerprint(other_seed)
  assert differentials.fingerprint(initial) == differentials.fingerprint(jax.tree.map(jnp.copy, initial))


def _wait_for(condition, seconds=30.0):
  deadline = time.monotonic() + seconds
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert condition()


def test_a_live_state_is_a_differential_over_the_checkpoints_baseline(tmp_path):
  """With incremental checkpoints a survivor's live state is the rows changed since their baseline and the dense
  leaves (gathered on the devices, its rows found on the host), the baseline it names stays on disk while it may be
  written (even past a new baseline and `keep`), it restores bit for bit, and its cost is counted."""
  meshes, rng = replicas.make_meshes(L), np.random.default_rng(4)
  initial = _state(meshes, np.random.default_rng(5))
  checkpointer = incremental.IncrementalCheckpointer(
    checkpointing.Checkpointer(tmp_path / 'checkpoints', meshes, max_to_keep=None),
    meshes,
    rebaseline_fraction=0.5,
    keep=1,
    initial=lambda: jax.tree.map(jnp.copy, initial),
  )
  keeper = live_state.LiveKeeper(tmp_path / 'live', every_s=0.0)
  keeper.use_differentials(checkpointer)
  tree = _train(initial, rng, 10, 600)
  checkpointer.save(10, tree)  # 600 of 1,000 rows changed: more than half the rows, a baseline.
  checkpointer.wait()
  assert checkpointer.stats()['checkpoint_baselines'] == 1
  tree = _train(tree, rng, 16, 300)
  assert keeper.save_latest() is None
  keeper.at_boundary(16, lambda: tree)
  assert keeper.spent_s > 0
  _wait_for(lambda: keeper._latest is not None)  # pylint: disable=protected-access
  saved_16 = jax.tree.map(np.array, tree)
  checkpointer.save(20, _train(tree, rng, 20, 700))  # A new baseline; keep=1, but the copy's stays.
  checkpointer.wait()
  assert checkpointer.all_steps() == [10, 20]
  assert keeper.save_latest() == 16 and keeper.steps() == [16]
  with np.load(tmp_path / 'live' / '16.npz') as saved:
    assert json.loads(str(saved['meta']))['baseline'] == 10
    assert saved['ids:0'].size == int((saved_16['train'].row_steps[0] > 10).sum())
  _assert_equal(keeper.restore(16, training_state.abstract_like(tree)), saved_16)
  checkpointer.close()


def test_stamps_follow_every_row_the_optimizer_writes():
  rows, lr = 50, 0.1
  optimizer = embedding.rowwise_adagrad(lr)
  state = step_lib.TrainState(
    params={'mlp': {}, 'embedding': jnp.ones((rows, 2))},
    mlp_opt_state=optax.sgd(lr).init({}),
    embedding_opt_state=optimizer.init(jnp.ones((rows, 2))),
    step=jnp.int32(6),
    row_steps=jnp.zeros(rows, jnp.int32),
  )
  apply = step_lib.make_apply_fn(optax.sgd(lr), optimizer)
  ids = jnp.array([3, 7, 7, rows + 5])  # A repeat, and an id past the table (dropped).
  state = apply(state, {}, ids, jnp.ones((4, 2)))
  assert np.flatnonzero(np.asarray(state.row_steps)).tolist() == [3, 7] and int(state.row_steps[3]) == 7


def test_incremental_checkpoints_are_refused_where_rounds_rewrite_tables():
  config = default.get_config('tiny')
  config.num_replicas, config.sync.algorithm, config.recovery.incremental = 4, 'shadow_ma', True
  with pytest.raises(config_lib.ConfigError, match="sync.what='dense'"):
    config_lib.validate(config, num_devices=8)
  config.sync.what = 'dense'
  config_lib.validate(config, num_devices=8)
  assert recovery_modes.incremental_setting('auto') == 'auto' and recovery_modes.incremental_setting('maybe') is None
