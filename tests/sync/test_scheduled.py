"""ShadowSync beside sharded lookups (`scheduled.ScheduledShadowSync`): the training thread dispatches the rounds
between collective steps; the rounds' math is the thread's (merge `w + s' - s`, the sync state carried from round to
round); across processes: tests/parallel/test_multiprocess.py."""

import jax
import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import train
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import drivers
from shadowsync_jax.sync import scheduled


def _config(algorithm: str):
  config = default.get_config('tiny')
  config.num_replicas, config.sync.algorithm = 4, algorithm
  config.sync.embedding_placement = 'sharded'
  config.data.num_train_examples = 32_768
  return config


def test_sharded_shadow_algorithms_get_the_scheduled_driver_syncing_the_dense_part():
  meshes = replicas.make_meshes(4)
  driver = drivers.make_driver(_config('shadow_bmuf'), meshes)
  assert isinstance(driver, scheduled.ScheduledShadowSync)
  assert driver.consensus_rule().groups == ('mlp',)  # sync.what='all': a sharded table is not R copies.


@pytest.mark.parametrize('algorithm', ['shadow_ma', 'shadow_ea'])
def test_scheduled_rounds_train_and_merge(tmp_path, algorithm):
  summary = train.train_and_evaluate(_config(algorithm), tmp_path)
  assert summary['sync_rounds'] >= 3 and summary['sync_job_gap_steps'] >= 1, summary
  assert summary['mean_sync_gap'] >= 1 and summary['max_sync_gap'] <= 64
  assert summary['eval_ne'] < 0.97  # Trained: the initial model is about 1.0.


def test_a_round_merges_its_synced_dense_params_and_keeps_the_local_steps():
  """Model averaging on a fake loop (every replica's MLP moves by r + 1 a step): right after each merge, the replicas
  differ from their mean only by the local steps made since the round's snapshot."""
  config = _config('shadow_ma')
  config.sync.min_interval_s = 0.0
  meshes = replicas.make_meshes(4)
  state = train.init_replicated_state(config, meshes)
  driver = drivers.make_driver(config, meshes)
  driver.start(state, driver.initial_sync_state(state))
  delta = jax.tree.map(
    lambda x: np.ones(x.shape, x.dtype) * np.arange(1, 5).reshape(-1, *[1] * (x.ndim - 1)),
    jax.device_get(state.params['mlp']),
  )
  merges = []
  for step in range(1, 40):
    params = {**state.params, 'mlp': jax.tree.map(lambda w, d: w + d, state.params['mlp'], delta)}
    state = state._replace(params=params)
    rounds_before = driver.stats()['sync_rounds']
    state = driver.at_boundary(step, state, 1)
    if driver.stats()['sync_rounds'] > rounds_before:
      merges.append(jax.device_get(state.params['mlp']))
  state = driver.finish(state)
  assert len(merges) >= 3
  for merged in merges:
    kernel = merged['bottom']['Dense_0']['kernel']
    spread = kernel - kernel.mean(axis=0)
    steps_since_snapshot = spread[3, 0, 0] / (4 - 2.5)  # Replica r moved r + 1 a step; the mean moved 2.5.
    expected = np.arange(-1.5, 2.5).reshape(-1, 1, 1) * steps_since_snapshot
    np.testing.assert_allclose(spread, np.broadcast_to(expected, spread.shape), atol=1e-3)
    assert round(steps_since_snapshot) >= 1  # The steps made beside the round were kept, not averaged away.


def test_under_blocks_the_steps_between_rounds_are_timed():
  """The loop dispatches blocks of up to K steps, cut at the driver's `next_due`. A round runs on the devices between
  two blocks, so the block after its dispatch (and after its merge) carries it; the driver ends blocks one and two
  steps after every dispatch, so the rest of each gap is timed as between rounds and the pace gets measured. (With a
  block of a whole gap after every dispatch, no step fell between rounds and the gap stayed at its fallback.)"""
  config = _config('shadow_ma')
  meshes = replicas.make_meshes(4)
  state = train.init_replicated_state(config, meshes)
  driver = drivers.make_driver(config, meshes)
  driver.start(state, driver.initial_sync_state(state))
  step, blocks = 0, []
  while step < 200:
    due = driver.next_due(step)
    steps = min(16, due - step) if due is not None else 16
    step += steps
    blocks.append(steps)
    state = driver.at_boundary(step, state, steps)
  driver.finish(state)
  assert driver.stats()['step_time_s'] is not None, blocks
  assert driver.stats()['sync_rounds'] >= 3 and blocks.count(1) >= 6, blocks


@pytest.mark.parametrize('steps_per_dispatch, first_round', [('auto', 28), (4, 1)])
def test_the_first_round_waits_for_autos_probe(steps_per_dispatch, first_round):
  """Under 'auto' the first round goes after the probe's timed blocks (1 compiling step, then 1, 8, 1, 8, 1, 8):
  a round's work in them (a merge's wait, blocks cut short) once made a sharded job choose one step a dispatch, at
  about half the examples/sec of the 32 it chose in the runs beside it."""
  config = _config('shadow_ma')
  config.train.steps_per_dispatch = steps_per_dispatch
  meshes = replicas.make_meshes(4)
  state = train.init_replicated_state(config, meshes)
  driver = drivers.make_driver(config, meshes)
  driver.start(state, driver.initial_sync_state(state))
  assert driver.next_due(0) == first_round
