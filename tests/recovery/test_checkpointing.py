"""Per-process checkpoints and live states: what is saved comes back, exactly, and old or abandoned steps go."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shadowsync_jax.parallel import replicas
from shadowsync_jax.recovery import checkpointing
from shadowsync_jax.recovery import live_state
from shadowsync_jax.recovery import row_blocks
from shadowsync_jax.recovery import training_state


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
  abstract = training_state.abstract_like(_tree(meshes, 0.0))
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
  keeper.at_boundary(7, lambda: _tree(meshes, 7.0))
  deadline = time.monotonic() + 30
  while keeper._latest is None and time.monotonic() < deadline:  # pylint: disable=protected-access
    time.sleep(0.01)
  assert keeper.save_latest() == 7 and keeper.steps() == [7]
  assert keeper.save(9, _tree(meshes, 9.0)) == 9 and keeper.steps() == [9]  # One live state at a time.
  abstract = training_state.abstract_like(_tree(meshes, 0.0))
  restored = keeper.restore(9, abstract)
  np.testing.assert_array_equal(restored['train']['w'], np.full((4, 3), 9.0))
  assert restored['train']['n'].sharding == abstract['train']['n'].sharding
  assert keeper.pace_for(_tree(meshes, 0.0)) == 0.1  # A tiny state: copied as often as allowed.
  with pytest.raises(checkpointing.MismatchError, match=r"\['train'\]\['w'\] is \[\[4, 3\], 'float32'\] there"):
    w = abstract['train']['w']  # A run of wider rows.
    keeper.restore(9, {'train': {**abstract['train'], 'w': jax.ShapeDtypeStruct((4, 5), w.dtype, sharding=w.sharding)}})


def test_a_live_copy_is_taken_only_where_the_newest_copy_or_checkpoint_is_every_steps_old(tmp_path):
  meshes = replicas.make_meshes(4)
  keeper = live_state.LiveKeeper(tmp_path, every_s=0.0)
  keeper.every_steps = 10
  keeper.covered(20)  # The state it started from (or a checkpoint) is on disk.
  copies = []
  keeper._copies.put_nowait = copies.append  # pylint: disable=protected-access  (what it would copy, not copied)
  for step in (25, 29, 30, 33, 39, 40, 41, 50):
    if step == 33:
      keeper.covered(33)  # A checkpoint saved at 33: the next copy is due at 43.
    keeper.at_boundary(step, lambda: _tree(meshes, 0.0))
  assert [step for step, _ in copies] == [30, 50]


def test_a_large_state_is_saved_blocking_by_blocks_of_rows_and_comes_back_exactly(tmp_path, monkeypatch):
  """Above the async limit a save holds the loop until written, its large leaves a block of rows at a time (blocks
  of 1,000 rows here, not dividing the 4,099 of a table), and a restore and a partial restore bring them back."""
  monkeypatch.setattr(checkpointing, 'ASYNC_SAVE_MAX_BYTES', 1 << 10)
  monkeypatch.setattr(checkpointing, 'LARGE_LEAF_BYTES', 1 << 10)
  monkeypatch.setattr(row_blocks, 'BLOCK_BYTES', 1000 * 3 * 4)
  meshes = replicas.make_meshes(2)
  placed = lambda x: jax.device_put(x, replicas.replica_sharding(meshes.local))
  rng = np.random.default_rng(0)
  table = rng.standard_normal((2, 4099, 3)).astype(np.float32)
  tree = {'train': {'table': placed(table), 'rows': placed(table[:, :, 0].copy()), 'small': placed(np.arange(2.0))}}
  checkpointer = checkpointing.Checkpointer(tmp_path, meshes)
  assert checkpointer.blocks(tree) and checkpointer.save(8, tree)
  assert checkpointer.all_steps() == [8], 'written before save returned'
  assert sorted(p.name for p in (tmp_path / 'process_0' / '8' / 'tables').iterdir() if p.is_dir()) == [
    'train_rows',
    'train_table',
  ]
  abstract = training_state.abstract_like(tree)
  restored, data = checkpointer.restore(8, abstract)
  assert data == {'step': 8}
  for name, want in (('table', table), ('rows', table[:, :, 0]), ('small', np.arange(2.0))):
    np.testing.assert_array_equal(restored['train'][name], want)
    assert restored['train'][name].sharding == abstract['train'][name].sharding
  wanted = checkpointing.keep_leaves(abstract, lambda path: path.endswith("['table']"))
  partial = checkpointer.restore_partial(8, wanted)
  assert partial['train']['small'] is checkpointing.SKIPPED and partial['train']['rows'] is checkpointing.SKIPPED
  np.testing.assert_array_equal(partial['train']['table'], table)
  assert checkpointer.stats()['saves_block'] and checkpointer.stats()['restores'] == 1
  checkpointer.close()
