"""Per-process checkpoints and live states: what is saved comes back, exactly, and old or abandoned steps go."""

import time

import jax
import jax.numpy as jnp
import numpy as np

from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import live_state


def _tree(meshes, value):
  placed = lambda x: jax.device_put(x, replicas.replica_sharding(meshes.local))
  return {'train': {'w': placed(jnp.full((4, 3), value, jnp.float32)), 'n': placed(jnp.arange(4, dtype=jnp.int32))}}


def test_saves_come_back_with_their_data_and_timelines_are_cut(tmp_path):
  meshes = replicas.make_meshes(4)
  checkpointer = checkpointing.Checkpointer(tmp_path, meshes, max_to_keep=None)
  for step in (16, 32, 48):
    assert checkpointer.save(step, _tree(meshes, float(step)), position=step + 1)
  assert not checkpointer.save(48, _tree(meshes, 0.0))  # Saved already.
  checkpointer.wait()
  assert checkpointer.all_steps() == [16, 32, 48] and (tmp_path / 'process_0' / '48').is_dir()
  abstract = checkpointing.abstract_like(_tree(meshes, 0.0))
  tree, data = checkpointer.restore(32, abstract)
  np.testing.assert_array_equal(tree['train']['w'], np.full((4, 3), 32.0))
  assert data == {'step': 32, 'position': 33} and tree['train']['w'].sharding == abstract['train']['w'].sharding
  wanted = checkpointing.keep_leaves(abstract, lambda path: path.endswith("['w']"))
  partial = checkpointer.restore_partial(48, wanted)
  assert partial['train']['n'] is checkpointing.SKIPPED
  np.testing.assert_array_equal(partial['train']['w'], np.full((4, 3), 48.0))
  assert checkpointer.delete_after(16) == [32, 48] and checkpointer.all_steps() == [16]
  checkpointer.save(64, _tree(meshes, 64.0))
  checkpointer.delete_before(100)  # Never the newest.
  assert checkpointer.all_steps() == [64]
  checkpointer.close()


def test_a_live_state_is_saved_exactly_or_from_its_newest_host_copy(tmp_path):
  meshes = replicas.make_meshes(4)
  keeper = live_state.LiveKeeper(tmp_path, every_s=0.0)
  assert keeper.save_latest() is None  # No copy yet.
  keeper.after_step(7, lambda: _tree(meshes, 7.0))
  deadline = time.monotonic() + 30
  while keeper._latest is None and time.monotonic() < deadline:  # pylint: disable=protected-access
    time.sleep(0.01)
  assert keeper.save_latest() == 7 and keeper.steps() == [7]
  assert keeper.save(9, _tree(meshes, 9.0)) == 9 and keeper.steps() == [9]  # One live state at a time.
  abstract = checkpointing.abstract_like(_tree(meshes, 0.0))
  restored = keeper.restore(9, abstract)
  np.testing.assert_array_equal(restored['train']['w'], np.full((4, 3), 9.0))
  assert restored['train']['n'].sharding == abstract['train']['n'].sharding
  assert keeper.pace_for(_tree(meshes, 0.0)) == 0.1  # A tiny state: copied as often as allowed.
