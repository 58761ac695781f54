"""The gradient exchange of GBA across processes, in one process (tests/test_multiprocess.py runs it in two): the
packing of a round, the exchange thread's errors and collectives, and the whole run equal to sync SGD when nothing
is stale."""

import threading
import types

import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import train
from shadowsync_jax.gba import processes as gba_processes
from shadowsync_jax.parallel import replicas

NUM_WORKERS, BATCH, STEPS = 4, 32, 16


def _entry(token, step, seed, num_workers=2):
  rng = np.random.default_rng(seed)
  return gba_processes.StepGradients(
    token=token,
    step=step,
    failed_L=np.array([False, True][:num_workers]),
    loss_L=rng.random(num_workers, dtype=np.float32),
    mlp_grads_L={
      'dense': {
        'kernel': rng.standard_normal((num_workers, 3, 2), dtype=np.float32),
        'bias': rng.standard_normal((num_workers, 2), dtype=np.float32),
      }
    },
    row_ids_LxN=rng.integers(-5, 2**31 - 1, (num_workers, 6), dtype=np.int32),  # Any int32 survives the trip.
    row_grads_LxNxD=rng.standard_normal((num_workers, 6, 4), dtype=np.float32),
  )


def test_codec_round_trip_is_exact():
  codec = gba_processes.Codec(_entry(0, 0, seed=0), capacity=3)
  entries = [_entry(7, 40, seed=1), _entry(9, 41, seed=2)]
  packed = codec.pack(entries, done=True)
  assert packed.dtype == np.float32 and packed.shape[0] == 4  # The header row and 3 entry rows.
  unpacked, done = codec.unpack(packed)
  assert done and len(unpacked) == 2
  for got, want in zip(unpacked, entries):
    assert (got.token, got.step) == (want.token, want.step)
    np.testing.assert_array_equal(got.failed_L, want.failed_L)
    np.testing.assert_array_equal(got.row_ids_LxN, want.row_ids_LxN)
    np.testing.assert_array_equal(got.row_grads_LxNxD, want.row_grads_LxNxD)
    np.testing.assert_array_equal(got.loss_L, want.loss_L)
    np.testing.assert_array_equal(got.mlp_grads_L['dense']['kernel'], want.mlp_grads_L['dense']['kernel'])
    np.testing.assert_array_equal(got.mlp_grads_L['dense']['bias'], want.mlp_grads_L['dense']['bias'])
  assert codec.unpack(codec.pack([], done=False)) == ([], False)
  with pytest.raises(ValueError, match='capacity'):
    codec.pack([_entry(0, 0, seed=3)] * 4, done=False)


class _FailingServer:
  """A server copy whose update raises: the exchange thread's error must reach the training loop."""

  def __init__(self):
    self.state, self.global_step = types.SimpleNamespace(params={}), 0

  def receive(self, gradient):
    raise ZeroDivisionError(f'server update failed on worker {gradient.worker}')

  def flush(self):
    pass


def test_an_error_in_the_exchange_thread_is_raised_by_the_training_loop_as_it_was():
  codec = gba_processes.Codec(_entry(0, 0, seed=0), capacity=1)
  exchange = gba_processes.GradientExchange(_FailingServer(), codec, max_in_flight_steps=1)
  exchange.start()
  try:
    exchange.pull()
    exchange.push(_entry(0, 0, seed=1)._replace(failed_L=np.array([False, False])))
    with pytest.raises(ZeroDivisionError, match='server update failed on worker 0'):
      exchange.pull()  # Waits for its step to reach the server: the thread fails instead, and says so.
    with pytest.raises(ZeroDivisionError):
      exchange.finish()
  finally:
    exchange.abandon()


def test_while_the_exchange_runs_only_its_thread_may_issue_collectives(monkeypatch):
  codec = gba_processes.Codec(_entry(0, 0, seed=0), capacity=1)
  exchange = gba_processes.GradientExchange(_FailingServer(), codec, max_in_flight_steps=1)
  in_round, release = threading.Event(), threading.Event()
  real_gather = gba_processes._gather

  def slow_gather(tree):
    in_round.set()
    release.wait(timeout=30)
    return real_gather(tree)

  monkeypatch.setattr(gba_processes, '_gather', slow_gather)
  exchange.start()
  try:
    assert in_round.wait(timeout=30)
    with pytest.raises(replicas.CollectiveThreadError, match='gba-exchange'):
      replicas.gather_from_processes(1.0)
  finally:
    release.set()
    exchange.finish()
  assert replicas.gather_from_processes(1.0) == [1.0]  # Released when the thread ended.


def _config(algorithm):
  config = default.get_config('tiny')
  config.num_replicas, config.batch_size = NUM_WORKERS, BATCH
  config.data.num_train_examples = NUM_WORKERS * BATCH * STEPS
  config.data.num_eval_examples = 1024
  config.train.checkpoint_every_steps = 5  # Three drains and saves on the way.
  config.train.progress_every_s = 600.0
  config.sync.algorithm = algorithm
  return config


def test_in_one_process_with_nothing_stale_the_exchange_trains_the_sync_sgd_model(tmp_path):
  """All 4 workers on one process push one step together, and the next pull waits for it (max_in_flight_steps=1):
  every gradient has staleness 0, every global batch is one step, and GBA's update is sync SGD's."""
  summary = gba_processes.train_and_evaluate(_config('gba'), tmp_path / 'gba')
  assert summary['max_staleness'] == 0 and summary['gba_server_updates'] == STEPS
  assert summary['num_processes'] == 1 and len(summary['consensus_fingerprint_per_process']) == 1
  assert (tmp_path / 'gba' / 'summary.json').exists()
  sync_sgd = train.train_and_evaluate(_config('sync_sgd'), tmp_path / 'sync_sgd')
  assert summary['eval_logloss'] == pytest.approx(sync_sgd['eval_logloss'], rel=1e-5)
  assert summary['eval_auc'] == pytest.approx(sync_sgd['eval_auc'], rel=1e-5)
