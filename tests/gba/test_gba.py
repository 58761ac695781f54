"""GBA's math against plain references: staleness decay, aggregation, step times; its config checks."""

import pathlib
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import config as config_lib
from shadowsync_jax.gba import aggregation
from shadowsync_jax.gba import emulated as gba_emulated
from shadowsync_jax.gba import server as server_lib
from shadowsync_jax.gba import step_times
from shadowsync_jax.model import embedding


def _reference_weight(staleness, threshold, decay):
  return 1.0 if staleness <= threshold else decay ** (staleness - threshold)


@pytest.mark.parametrize('threshold, decay', [(0, 0.5), (2, 0.5), (3, 0.0), (1, 1.0)])
def test_staleness_weights_match_the_rule(threshold, decay):
  staleness = np.arange(0, 9)
  expected = [_reference_weight(int(s), threshold, decay) for s in staleness]
  np.testing.assert_allclose(aggregation.staleness_weights(staleness, threshold, decay), expected, rtol=1e-6)


def test_staleness_weights_refuse_negative_staleness():
  with pytest.raises(ValueError, match='staleness'):
    aggregation.staleness_weights(np.array([0, -1]), 2, 0.5)


def test_aggregate_then_sparse_sgd_matches_a_dense_numpy_reference():
  rng = np.random.default_rng(0)
  num_rows, dim, k, n = 12, 3, 3, 5
  mlp_K = [
    {'w': rng.normal(size=(4, 2)).astype(np.float32), 'b': rng.normal(size=2).astype(np.float32)} for _ in range(k)
  ]
  ids_K = [rng.integers(0, num_rows, size=n).astype(np.int32) for _ in range(k)]
  rows_K = [rng.normal(size=(n, dim)).astype(np.float32) for _ in range(k)]
  weights = np.array([1.0, 0.25, 0.0], np.float32)
  num_gradients = 4  # A global batch of 4 of which 3 arrived.

  mlp, ids_N, rows_NxD = aggregation.aggregate(mlp_K, ids_K, rows_K, jnp.asarray(weights), num_gradients)
  for name in ('w', 'b'):
    expected = sum(weights[i] * mlp_K[i][name] for i in range(k)) / num_gradients
    np.testing.assert_allclose(mlp[name], expected, rtol=1e-6, atol=1e-7)

  table = rng.normal(size=(num_rows, dim)).astype(np.float32)
  updated, _ = embedding.sparse_sgd(0.1).update(jnp.asarray(table), (), ids_N, rows_NxD)
  expected_table = table.copy()
  for i in range(k):
    for row, grad in zip(ids_K[i], rows_K[i]):
      expected_table[row] -= 0.1 * weights[i] * grad / num_gradients
  np.testing.assert_allclose(updated, expected_table, rtol=1e-5, atol=1e-6)


def test_aggregate_with_unit_weights_is_the_sync_sgd_mean():
  rng = np.random.default_rng(1)
  grads = [{'w': rng.normal(size=(3,)).astype(np.float32)} for _ in range(4)]
  rows = [rng.normal(size=(2, 2)).astype(np.float32) for _ in range(4)]
  mlp, _, rows_NxD = aggregation.aggregate(grads, [np.zeros(2, np.int32)] * 4, rows, jnp.ones(4), 4)
  np.testing.assert_allclose(mlp['w'], np.mean([g['w'] for g in grads], axis=0), rtol=1e-6)
  np.testing.assert_array_equal(rows_NxD, np.concatenate(rows) / 4)  # Bit for bit sync_sgd's g / R.


def _gba_config(**overrides):
  config = default.get_config('tiny')
  for key, value in overrides.items():
    config.gba[key] = value
  return config.gba


def test_step_times_are_seeded_and_have_the_configured_mean_and_straggler_share():
  config = _gba_config(
    step_time_s=0.02, step_time_jitter=0.3, straggler_prob=0.1, straggler_slowdown=4.0, failure_prob=0.05
  )
  times = step_times.WorkerStepTimes.sample(config, 8, 5000, seed=3)
  again = step_times.WorkerStepTimes.sample(config, 8, 5000, seed=3)
  np.testing.assert_array_equal(times.seconds_RxK, again.seconds_RxK)
  assert not np.array_equal(times.seconds_RxK, step_times.WorkerStepTimes.sample(config, 8, 5000, seed=4).seconds_RxK)
  expected_mean = 0.02 * (0.9 + 0.1 * 4.0)  # Lognormal jitter of mean 1 times the straggler mixture.
  assert times.seconds_RxK.mean() == pytest.approx(expected_mean, rel=0.02)
  assert times.fails_RxK.mean() == pytest.approx(0.05, abs=0.005)


def test_sync_time_is_the_sum_of_each_steps_slowest_worker():
  times = step_times.WorkerStepTimes.sample(_gba_config(straggler_prob=0.2), 4, 50, seed=0)
  expected = sum(max(times.seconds_RxK[r, k] for r in range(4)) for k in range(10, 30))
  assert times.sync_time_s(10, 30) == pytest.approx(expected)
  constant = step_times.WorkerStepTimes.sample(_gba_config(step_time_jitter=0.0), 4, 50, seed=0)
  assert constant.sync_time_s(0, 50) == pytest.approx(0.5)


class _FakeServer:
  """Counts received gradients into global steps of `num_gradients`, like `server.Server`, without math."""

  def __init__(self, num_gradients):
    self.global_step, self.state, self.num_gradients = 0, type('S', (), {'params': None}), num_gradients
    self.received, self._buffered, self.flushes = [], 0, 0

  def receive(self, gradient):
    self.received.append((gradient.worker, gradient.token, self.global_step))
    self._buffered += 1
    if self._buffered == self.num_gradients:
      self._buffered, self.global_step = 0, self.global_step + 1

  def flush(self):
    if self._buffered:
      self._buffered, self.global_step, self.flushes = 0, self.global_step + 1, self.flushes + 1


class _NoData:
  def batch(self, worker, step):
    return (worker, step)

  def forget_before(self, step):
    pass


def _emulate(seconds_RxK, fails_RxK=None, boundary=None):
  seconds_RxK = np.asarray(seconds_RxK, np.float64)
  fails_RxK = np.zeros(seconds_RxK.shape, bool) if fails_RxK is None else np.asarray(fails_RxK)
  server = _FakeServer(seconds_RxK.shape[0])
  emulation = gba_emulated.Emulation(
    server,
    _NoData(),
    step_times.WorkerStepTimes(seconds_RxK, fails_RxK),
    lambda params, batch: (0.0, batch, None, None),
    start_step=0,
  )
  emulation.run_until(boundary or seconds_RxK.shape[1])
  return server, emulation


def test_equal_step_times_give_every_gradient_the_current_token():
  server, emulation = _emulate(np.ones((3, 4)))
  assert [staleness for _, token, g in server.received for staleness in [g - token]] == [0] * 12
  assert server.global_step == 4 and emulation.now == 4.0


def test_a_straggling_step_arrives_stale_while_the_others_go_on():
  seconds = np.ones((2, 6))
  seconds[1, 0] = 4.0  # Worker 1's first step is 4x slower: worker 0 makes 4 steps meanwhile.
  server, emulation = _emulate(seconds)
  first_of_worker_1 = next((token, g) for worker, token, g in server.received if worker == 1)
  assert first_of_worker_1 == (0, 2)  # Pulled at global step 0, arrived after worker 0's 4 gradients made 2.
  assert emulation.now == 9.0  # Worker 1: 4 + 5 x 1; sync SGD would take 4 + 5 x 1 too: one slow step.
  assert len(server.received) == 12 and server.global_step == 6


def test_lost_tokens_do_not_block_the_server():
  fails = np.zeros((3, 5), bool)
  fails[1, 2] = fails[2, 0] = True
  server, emulation = _emulate(np.ones((3, 5)), fails)
  assert emulation.lost_tokens == 2
  assert len(server.received) == 13  # 15 pushes, 2 lost
  assert server.global_step == 5 and server.flushes == 1  # 4 full global batches and a partial one at the end.
  assert emulation.next_step == [5, 5, 5]  # The failed workers went on with their next batches.


@pytest.mark.parametrize(
  'overrides, key',
  [
    ({'gba__staleness_decay': 1.5}, 'gba.staleness_decay'),
    ({'gba__staleness_threshold': -1}, 'gba.staleness_threshold'),
    ({'gba__step_time_s': 0.0}, 'gba.step_time_s'),
    ({'gba__straggler_prob': 1.2}, 'gba.straggler_prob'),
    ({'gba__straggler_slowdown': 0.5}, 'gba.straggler_slowdown'),
    ({'gba__failure_prob': 1.0}, 'gba.failure_prob'),
    ({'sync__algorithm': 'gba', 'recovery__mode': 'full'}, 'recovery.mode'),
    ({'sync__algorithm': 'async_sgd', 'straggler__process': 0}, 'straggler.process'),
    ({'sync__algorithm': 'gba', 'train__eval_per_replica': True}, 'train.eval_per_replica'),
    ({'sync__algorithm': 'gba', 'gba__max_in_flight_steps': 0}, 'gba.max_in_flight_steps'),
  ],
)
def test_invalid_gba_config_names_the_key(overrides, key):
  config = default.get_config('tiny')
  for dotted, value in overrides.items():
    section, leaf = dotted.split('__')
    config[section][leaf] = value
  with pytest.raises(config_lib.ConfigError, match=key.replace('.', r'\.')):
    config_lib.validate(config, num_devices=8)


@pytest.mark.parametrize('algorithm', ['gba', 'async_sgd'])
def test_across_processes_stragglers_are_real_not_emulated(algorithm):
  config = default.get_config('tiny')
  config.sync.algorithm, config.num_replicas = algorithm, 2
  config.straggler.process, config.straggler.slowdown = 1, 2.0
  config_lib.validate(config, num_devices=8, num_processes=2)  # A real straggler: fine across processes.
  config.gba.straggler_prob = 0.1
  with pytest.raises(config_lib.ConfigError, match=r'gba\.straggler_prob.*straggler\.process'):
    config_lib.validate(config, num_devices=8, num_processes=2)


def test_a_checkpoint_of_different_replica_models_is_refused():
  same = {'mlp': np.ones((2, 3), np.float32), 'embedding': np.zeros((2, 4, 2), np.float32)}
  state = server_lib.server_state_from_checkpoint({'train': _Stacked(same)}, 'DIR')
  np.testing.assert_array_equal(state.params['mlp'], np.ones(3))
  different = {**same, 'embedding': np.stack([np.zeros((4, 2)), np.ones((4, 2))]).astype(np.float32)}
  with pytest.raises(ValueError, match=r"different models.*\['embedding'\]"):
    server_lib.server_state_from_checkpoint({'train': _Stacked(different)}, 'DIR')


class _Stacked(NamedTuple):
  """A replica-stacked train state with only params (what the check reads) and a step."""

  params: dict
  step: np.ndarray = np.zeros(2, np.int32)


def test_study_table_compares_each_row_with_sync_sgd_at_its_straggler_setting():
  from shadowsync_jax.studies import gba as gba_study  # pylint: disable=g-import-not-at-top

  config = {
    'batch_size': 64,
    'gba': {
      'straggler_slowdown': 4.0,
      'step_time_s': 0.01,
      'step_time_jitter': 0.1,
      'staleness_threshold': 2,
      'staleness_decay': 0.5,
    },
  }
  row = {
    'eval_auc': 0.7,
    'examples_per_sec': 1000.0,
    'wall_time_s': 10.0,
    'bayes_ne': 0.8,
    'num_replicas': 8,
    'train_examples': 1024,
    'config': config,
  }
  sync = {**row, 'sync_algorithm': 'sync_sgd', 'eval_ne': 0.8}
  rows = [
    {**sync, 'straggler_prob': 0.0, 'emulated_examples_per_sec': 100},
    {**sync, 'straggler_prob': 0.1, 'emulated_examples_per_sec': 50},
    {
      **row,
      'sync_algorithm': 'gba',
      'straggler_prob': 0.1,
      'eval_ne': 0.808,
      'emulated_examples_per_sec': 125,
      'mean_staleness': 0.5,
      'max_staleness': 3,
      'decayed_gradients': 4,
      'dropped_gradients': 0,
      'lost_tokens': 1,
    },
  ]
  gba_line = gba_study.table(rows).splitlines()[4]
  assert gba_line.startswith('| 10% of steps 4x slower | gba | 0.8080 | +1.00% |')
  assert '| 2.50x |' in gba_line and '| 4 / 0 / 1 |' in gba_line


def test_learning_rate_tuning_trains_sync_sgd_at_each_rate_and_keeps_the_lowest_ne(monkeypatch, tmp_path):
  from experiments.configs import gba as gba_config  # pylint: disable=g-import-not-at-top
  from shadowsync_jax.studies import gba as gba_study  # pylint: disable=g-import-not-at-top

  trained = []

  def fake_train(config, workdir):
    trained.append(
      (
        config.sync.algorithm,
        config.gba.straggler_prob,
        config.optimizer.mlp_learning_rate,
        config.optimizer.embedding_learning_rate,
        pathlib.Path(workdir).name,
      )
    )
    return {'eval_ne': {0.05: 0.85, 0.1: 0.84, 0.2: 0.86}[config.optimizer.mlp_learning_rate], 'eval_auc': 0.7}

  monkeypatch.setattr(gba_study.train, 'train_and_evaluate', fake_train)
  base = gba_config.get_config('tiny')
  base.gba.straggler_prob = 0.3
  best, summaries = gba_study.tune_learning_rate(base, tmp_path, [0.05, 0.1, 0.2])
  assert best == 0.1
  assert trained == [('sync_sgd', 0.0, rate, rate, f'lr{rate:g}') for rate in (0.05, 0.1, 0.2)]
  assert [line.split('|')[-2].strip() for line in gba_study.learning_rate_table(summaries).splitlines()[2:]] == [
    '',
    'chosen',
    '',
  ]
  before = base.optimizer.embedding_learning_rate
  assert gba_study.with_learning_rate(base, before * 3).optimizer.embedding_learning_rate == before * 3
  assert base.optimizer.embedding_learning_rate == before  # The base config is left as it was.


def test_mean_table_averages_each_cell_over_seeds_against_the_same_seeds_sync_sgd():
  from shadowsync_jax.studies import gba as gba_study  # pylint: disable=g-import-not-at-top

  config = {'gba': {'straggler_slowdown': 4.0}}

  def rows(sync_ne, gba_ne, gba_auc):
    return [
      {
        'sync_algorithm': 'sync_sgd',
        'straggler_prob': 0.1,
        'eval_ne': sync_ne,
        'eval_auc': 0.70,
        'emulated_examples_per_sec': 100.0,
        'config': config,
      },
      {
        'sync_algorithm': 'gba',
        'straggler_prob': 0.1,
        'eval_ne': gba_ne,
        'eval_auc': gba_auc,
        'emulated_examples_per_sec': 250.0,
        'config': config,
      },
    ]

  gba_line = gba_study.mean_table({0: rows(0.80, 0.808, 0.71), 3: rows(0.90, 0.882, 0.69)}).splitlines()[3]
  assert gba_line == (
    '| 10% of steps 4x slower | gba | 0.8450 | -0.50% (+1.00%, -2.00%) | 0.7000 (0.7100, 0.6900) | 2.50x |'
  )


def test_study_gives_sync_sgd_the_emulated_time_of_its_slowest_worker_each_step(tmp_path, monkeypatch):
  """sync_sgd trains once; under stragglers its emulated examples/sec falls, as each global step waits."""
  from experiments.configs import gba as gba_config  # pylint: disable=g-import-not-at-top
  from shadowsync_jax.studies import gba as gba_study  # pylint: disable=g-import-not-at-top

  trained = []

  def fake_train(config, workdir):
    trained.append(workdir)
    return {'sync_algorithm': config.sync.algorithm, 'eval_ne': 0.8}

  monkeypatch.setattr(gba_study.train, 'train_and_evaluate', fake_train)
  base = gba_config.get_config('tiny')
  rows = gba_study.run(base, tmp_path, straggler_probs=(0.0, 0.2), algorithms=('sync_sgd',))
  assert len(trained) == 1 and [row['straggler_prob'] for row in rows] == [0.0, 0.2]
  steps = base.data.num_train_examples // (base.num_replicas * base.batch_size)
  without, with_stragglers = (row['emulated_examples_per_sec'] for row in rows)
  assert steps * base.num_replicas * base.batch_size / rows[0]['emulated_time_s'] == pytest.approx(without)
  assert with_stragglers < 0.9 * without
