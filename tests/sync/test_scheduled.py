"""Shadow rounds that the training thread dispatches between its blocks (`scheduled.ScheduledShadowSync`): one
process, and jobs whose steps are collectives (sharded tables; across processes: tests/parallel/test_multiprocess.py).
A round is fused into the blocks, at the step planned for it whatever the blocks, and lands whole; the pace follows
the round's measured cost."""

import fake_training
import jax
import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import block_plan
from shadowsync_jax import dispatch
from shadowsync_jax import train
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms
from shadowsync_jax.sync import drivers
from shadowsync_jax.sync import foreground
from shadowsync_jax.sync import pacing
from shadowsync_jax.sync import scheduled

ALL = ('mlp', 'embedding')


def _config(algorithm: str, placement: str = 'sharded'):
  config = default.get_config('tiny')
  config.num_replicas, config.sync.algorithm = 4, algorithm
  config.sync.embedding_placement = placement
  config.data.num_train_examples = 32_768
  return config


@pytest.mark.parametrize('placement, groups', [('sharded', ('mlp',)), ('replicated', ALL)])
def test_shadow_algorithms_in_one_process_and_sharded_get_the_scheduled_driver(placement, groups):
  meshes = replicas.make_meshes(4)
  config = _config('shadow_bmuf', placement)
  driver = drivers.make(config.sync, meshes, config.num_replicas)
  assert isinstance(driver, scheduled.ScheduledShadowSync)
  assert driver.consensus_rule().groups == groups  # sync.what='all': a sharded table is not R copies.


@pytest.mark.parametrize(
  'algorithm, placement', [('shadow_ma', 'sharded'), ('shadow_ea', 'replicated'), ('shadow_bmuf', 'sharded')]
)
def test_scheduled_rounds_train_and_land_at_once(tmp_path, algorithm, placement):
  """Each algorithm once, each placement at least once: the rounds are the algorithm's, where they land the
  scheduler's (the fused rounds' math, whatever the blocks: the test below)."""
  summary = train.train_and_evaluate(_config(algorithm, placement), tmp_path)
  assert summary['sync_rounds'] >= 3 and summary['sync_gap_steps'] >= 1, summary
  assert summary['mean_sync_gap'] >= 1 and summary['max_sync_gap'] <= 64
  assert summary['mean_merge_lag_steps'] == 0 and summary['sync_round_cost_s'] > 0, summary
  assert summary['eval_ne'] < 0.97  # Trained: the initial model is about 1.0.


class _FixedGap(pacing.GapPacer):
  """Rounds every `gap` steps, whatever they cost."""

  def __init__(self, gap: int):
    super().__init__(max_overhead=0.05)
    self._gap = gap

  def gap_steps(self) -> int:
    return self._gap


def _blocks_with_fused_rounds(name: str, blocks: list[int], block_steps: int, gap: int = 5):
  """Trains the tiny model on 4 replicas for `blocks` (steps each) with `name`'s rounds fused every `gap` steps from
  step `gap`; returns (params, sync state, the driver's stats) on the host."""
  config = _config(f'shadow_{name}', 'replicated')
  meshes = replicas.make_meshes(4)
  algorithm = algorithms.make(name, replicas.REPLICA_AXIS, 4, -1.0, -1.0, 1.0)
  driver = scheduled.ScheduledShadowSync(algorithm, name, meshes, ALL, first_round_after=gap, pacer=_FixedGap(gap))
  state = train.init_replicated_state(config, meshes)
  driver.start(state, driver.initial_sync_state(state))
  train_block = dispatch.make_train_block(config, meshes, driver.between_steps())
  source, _ = input_pipeline.make_sources(config.data, config.seed)
  step = 0
  for steps in blocks:
    block = input_pipeline.read_block(source, 4, config.batch_size, step, steps, block_steps)
    steps_L = replicas.shard(np.full(4, steps, np.int32), meshes.local)
    carry = driver.block_carry(step, steps)
    # Full blocks run the program of all K steps, as the loop's dispatcher has them (`train.all_steps_program`).
    state, _, carry = train_block(state, replicas.shard(block, meshes.local), steps_L, carry, full=steps == block_steps)
    driver.after_block(carry)
    step += steps
  return jax.device_get(state.params), jax.device_get(driver.sync_state()), driver.stats()


def _blocks_with_foreground_rounds(name: str, num_steps: int, gap: int = 5):
  """The same steps in blocks of `gap`, each followed by a foreground round (`fr_<name>`)."""
  config = _config(f'fr_{name}', 'replicated')
  meshes = replicas.make_meshes(4)
  algorithm = algorithms.make(name, replicas.REPLICA_AXIS, 4, -1.0, -1.0, 1.0)
  driver = foreground.ForegroundSync(algorithm, name, meshes, ALL, every_k_steps=gap)
  state = train.init_replicated_state(config, meshes)
  driver.start(state, driver.initial_sync_state(state))
  train_block = dispatch.make_train_block(config, meshes)
  source, _ = input_pipeline.make_sources(config.data, config.seed)
  for step in range(0, num_steps, gap):
    block = input_pipeline.read_block(source, 4, config.batch_size, step, gap, gap)
    steps_L = replicas.shard(np.full(4, gap, np.int32), meshes.local)
    state, _ = train_block(state, replicas.shard(block, meshes.local), steps_L)
    state = fake_training.at_boundary(driver, step + gap, state, gap)
  return jax.device_get(state.params), jax.device_get(driver.sync_state())


@pytest.mark.parametrize('name', ['ma', 'ea', 'bmuf'])
def test_fused_rounds_land_at_their_steps_whatever_the_blocks(name):
  """Rounds fused into blocks every 5 steps: blocks of 3, 4, 6, 2, 5 (of K = 6: the one of 6 runs the program of all
  K steps, the others the one of any) and blocks of all K = 5 train the same bits, and the same model (to float
  reassociation) as a foreground round after every 5 steps: a fused round is the round, at the step it was planned
  for, landed whole."""
  cut, cut_sync, cut_stats = _blocks_with_fused_rounds(name, [3, 4, 6, 2, 5], block_steps=6)
  even, even_sync, _ = _blocks_with_fused_rounds(name, [5, 5, 5, 5], block_steps=5)
  jax.tree.map(np.testing.assert_array_equal, (cut, cut_sync), (even, even_sync))
  assert cut_stats['sync_rounds'] == 4 and cut_stats['mean_sync_gap'] == 5 and cut_stats['mean_merge_lag_steps'] == 0
  foreground_params, foreground_sync = _blocks_with_foreground_rounds(name, 20)
  close = lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  jax.tree.map(close, (cut, cut_sync), (foreground_params, foreground_sync))


def test_the_gap_is_the_measured_cost_over_the_budget_in_steps():
  """`start` times a round; with a step time known, the gap is the round's cost over `max_overhead` of a step."""
  config = _config('shadow_ma', 'replicated')
  meshes = replicas.make_meshes(4)
  state = train.init_replicated_state(config, meshes)
  driver = drivers.make(config.sync, meshes, config.num_replicas)
  driver.start(state, driver.initial_sync_state(state))
  cost_s = driver.stats()['sync_round_cost_s']
  assert 0 < cost_s < 1.0
  pacer = driver._pacer  # pylint: disable=protected-access
  for _ in range(10):
    pacer.observe_steps(0.02, 4)  # 5 ms a step.
  assert driver.stats()['sync_gap_steps'] == max(1, int(np.ceil(cost_s / 0.05 / pacer.step_time_s())))


@pytest.mark.parametrize('steps_per_dispatch, first_round', [('auto', 28), (4, 1)])
def test_the_first_round_waits_for_autos_probe(steps_per_dispatch, first_round):
  """Under 'auto' the first round goes after the probe's timed blocks (1 compiling step, then 1, 8, 1, 8, 1, 8):
  a round's work in them (a merge's wait, blocks cut short) once made a sharded job choose one step a dispatch, at
  about half the examples/sec of the 32 it chose in the runs beside it."""
  config = _config('shadow_ma')
  config.train.steps_per_dispatch = steps_per_dispatch
  meshes = replicas.make_meshes(4)
  state = train.init_replicated_state(config, meshes)
  waits = block_plan.steps_until_chosen(steps_per_dispatch)
  driver = drivers.make(config.sync, meshes, config.num_replicas, first_round_after=waits)
  driver.start(state, driver.initial_sync_state(state))
  driver.block_carry(0, first_round - 1)
  assert driver.stats()['sync_rounds'] == 0
  driver.block_carry(first_round - 1, 1)  # The block that brings the run to `first_round` ends with its first round.
  assert driver.stats()['sync_rounds'] == 1
