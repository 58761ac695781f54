"""End to end: the tiny config trains to a stated quality, on 1 and 8 replicas, and resumes exactly."""

import json

import jax
import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import block_plan
from shadowsync_jax import config as config_lib
from shadowsync_jax import dispatch
from shadowsync_jax import train
from shadowsync_jax.metrics import log as metric_log
from shadowsync_jax.parallel import memory
from shadowsync_jax.sync import pacing

SUMMARY_KEYS = (
  'eval_ne',
  'eval_auc',
  'eval_logloss',
  'bayes_ne',
  'examples_per_sec',
  'train_examples',
  'num_replicas',
  'num_processes',
  'sync_algorithm',
  'sync_rounds',
  'mean_sync_gap',
  'wall_time_s',
  'config',
)


def _tiny(**overrides):
  config = default.get_config('tiny')
  for key, value in overrides.items():
    section, _, leaf = key.rpartition('__')
    (config[section] if section else config)[leaf] = value
  return config


@pytest.fixture(scope='module')
def one_replica_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('one_replica')
  return workdir, train.train_and_evaluate(_tiny(), workdir)


def test_tiny_run_learns_and_writes_the_summary(one_replica_run):
  workdir, summary = one_replica_run
  on_disk = json.loads((workdir / 'summary.json').read_text())
  assert set(SUMMARY_KEYS) <= set(on_disk)
  assert on_disk['eval_ne'] == pytest.approx(summary['eval_ne'])
  assert summary['train_examples'] == 65_536
  # The tiny stream is learnable well below the constant predictor (NE 1.0), and never below the Bayes floor.
  assert summary['bayes_ne'] < summary['eval_ne'] < 0.93, summary
  assert summary['eval_auc'] > 0.7, summary
  assert summary['examples_per_sec'] > 0
  assert on_disk['net_bytes_sent'] == on_disk['net_bytes_received'] == [None]  # One process: no network.


def test_metrics_stream_is_written(one_replica_run):
  workdir, _ = one_replica_run
  lines = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert any('train_loss' in line for line in lines)
  assert any('eval_ne' in line for line in lines)
  assert list(workdir.glob('events.out.tfevents.*')), 'no TensorBoard event file'


def test_eight_independent_replicas_on_eight_devices(tmp_path):
  assert len(jax.devices()) == 8
  summary = train.train_and_evaluate(_tiny(num_replicas=8, batch_size=32, train__eval_per_replica=True), tmp_path)
  assert summary['num_replicas'] == 8
  assert summary['train_examples'] == 65_536
  assert summary['sync_rounds'] == 0 and summary['mean_sync_gap'] is None
  per_replica = summary['eval_ne_per_replica']
  # Each replica learns something from its own eighth of the stream, and each eighth is different data.
  assert len(per_replica) == 8 and sum(per_replica) / 8 < 0.995, per_replica
  assert len(set(per_replica)) == 8, per_replica


def test_sync_sgd_on_eight_replicas_equals_one_replica_on_the_global_batch(one_replica_run, tmp_path):
  """8 replicas x 16 examples, gradients averaged every step, read the same global batches as 1 x 128."""
  _, one_replica = one_replica_run
  summary = train.train_and_evaluate(_tiny(num_replicas=8, batch_size=16, sync__algorithm='sync_sgd'), tmp_path)
  assert summary['sync_rounds'] == 65_536 // 128
  assert summary['eval_ne'] == pytest.approx(one_replica['eval_ne'], rel=1e-3)
  assert summary['eval_auc'] == pytest.approx(one_replica['eval_auc'], rel=1e-3)


@pytest.mark.parametrize(
  'overrides',
  [
    {},
    # Elastic averaging carries state across rounds (the center): the checkpoint must hold it too.
    {
      'num_replicas': 4,
      'batch_size': 32,
      'data__num_train_examples': 16_384,  # 128 steps, a round every 7: blocks of 7 steps at most.
      'sync__algorithm': 'fr_ea',
      'sync__every_k_steps': 7,
    },
  ],
  ids=['none', 'fr_ea'],
)
def test_interrupted_run_resumes_to_the_same_result(tmp_path, monkeypatch, overrides):
  """... and the resumed run reads its checkpoint without building a state first (at Criteo Kaggle's size, 2.2 GB
  of tables made only to be dropped)."""
  uninterrupted = train.train_and_evaluate(_tiny(**overrides), tmp_path / 'straight')
  first = train.train_and_evaluate(_tiny(train__stop_at_step=50, **overrides), tmp_path / 'resumed')
  assert first == {'stopped_at_step': 50}
  assert not (tmp_path / 'resumed' / 'summary.json').exists()
  builds = []
  init_replicated_state = train.init_replicated_state

  def counting_init(*args):  # Traced for the shapes only is no build; made of device buffers is.
    state = init_replicated_state(*args)
    builds.extend(x for x in jax.tree.leaves(state) if not isinstance(x, jax.core.Tracer))
    return state

  monkeypatch.setattr(train, 'init_replicated_state', counting_init)
  resumed = train.train_and_evaluate(_tiny(**overrides), tmp_path / 'resumed')
  assert not builds
  assert resumed['resumed_from_step'] == 50
  assert resumed['train_examples'] == uninterrupted['train_examples']
  assert resumed['eval_ne'] == pytest.approx(uninterrupted['eval_ne'], rel=1e-6)
  assert resumed['eval_auc'] == pytest.approx(uninterrupted['eval_auc'], rel=1e-6)


@pytest.mark.parametrize(
  'overrides',
  [{}, {'num_replicas': 4, 'batch_size': 32, 'sync__algorithm': 'fr_ma', 'sync__embedding_placement': 'sharded'}],
  ids=['one_table', 'sharded'],
)
def test_incremental_checkpoints_resume_bit_for_bit(one_replica_run, tmp_path, overrides):
  """Differentials at 16, 32, 48 and at the stop (50), all over the initial state, never written (the tiny tables'
  rows nearly all change between two saves, so differentials are kept from adding up to a new baseline): the
  resumed run builds the initial state, lays the differential of 50 over it, and ends with the model of the run
  never stopped."""
  settings = {'train__checkpoint_every_steps': 16, 'recovery__incremental': True, **overrides}
  settings['recovery__rebaseline_fraction'] = 1000.0
  uninterrupted = one_replica_run[1] if not overrides else train.train_and_evaluate(_tiny(**overrides), tmp_path / 'a')
  assert train.train_and_evaluate(_tiny(train__stop_at_step=50, **settings), tmp_path / 'b') == {'stopped_at_step': 50}
  differentials = tmp_path / 'b' / 'checkpoints' / 'differentials' / 'process_0'
  names = sorted(path.name for path in differentials.glob('*.npz'))  # The newest ones: as many as restores may need.
  assert names[-1] == '50_0.npz' and all(name.endswith('_0.npz') for name in names), names
  resumed = train.train_and_evaluate(_tiny(**settings), tmp_path / 'b')
  assert resumed['resumed_from_step'] == 50
  assert resumed['consensus_fingerprint_per_process'] == uninterrupted['consensus_fingerprint_per_process']
  assert resumed['eval_ne'] == uninterrupted['eval_ne']
  # This start's saves (every 16 steps from 64, and the final one): all differentials of the initial state.
  assert resumed['checkpoint_baselines'] == [0] and resumed['checkpoint_saves'][0] >= (512 - 64) // 16
  assert resumed['checkpoints']['incremental'] is True


@pytest.mark.parametrize('algorithm', ['shadow_ea', 'shadow_bmuf'])
def test_every_shadow_algorithm_runs_the_blocks_auto_chooses(tmp_path, monkeypatch, algorithm):
  """'auto' runs blocks of the K it chooses for every shadow algorithm (none is kept at one step a dispatch): their
  rounds are fused into the blocks."""
  monkeypatch.setattr(block_plan, 'choose_steps_per_dispatch', lambda *args, **kwargs: 8)
  summary = train.train_and_evaluate(
    _tiny(num_replicas=2, sync__algorithm=algorithm, train__steps_per_dispatch='auto'), tmp_path
  )
  assert summary['steps_per_dispatch'] == 8 and summary['sync_rounds'] >= 1 and summary['mean_merge_lag_steps'] == 0
  assert summary['eval_ne'] < 1.0


@pytest.mark.parametrize(
  'algorithm, steps_per_dispatch, auto_chooses',
  [
    ('none', 'auto', None),
    ('none', 'auto', block_plan.PROBE_STEPS),  # The probe's own longest block: no block of no step compiles it.
    ('fr_ma', 'auto', None),
    ('shadow_ea', 'auto', None),
    ('none', 8, None),
  ],
)
def test_nothing_compiles_among_the_timed_steps(tmp_path, monkeypatch, algorithm, steps_per_dispatch, auto_chooses):
  """examples/sec counts from the end of the first block (one step): a compile after it (the first round, merge,
  loss read or log) would be counted as training time, and one in the shadow thread takes the trainers' cores. The
  compiles allowed after it are those of the K that 'auto' chose, in the pause after its probe (left out of the timed
  steps): the block program of K steps, by a block of no step, unless the probe's blocks already had K steps; and the
  program of all K steps. `auto_chooses`: the K 'auto' is made to choose (None: the one it measures)."""
  compiles, calls, fulls = [], [], []  # calls: (compiles before it, the block's steps); fulls: the all-K program
  compiling_calls = [0]  # The calls after which a compile may come: the first, a block of no step, the all-K program.

  def on_event(event, duration_s, **kwargs):
    del duration_s, kwargs
    if event == '/jax/core/compile/backend_compile_duration':  # Any thread's XLA compile.
      compiles.append(event)

  make_train_block = dispatch.make_train_block

  def counting_make_train_block(config, meshes, between=None):
    train_block = make_train_block(config, meshes, between)

    def counted(state, block, steps_L, *carry, full=False):
      steps = int(np.asarray(steps_L)[0])
      calls.append((len(compiles), steps))
      fulls.append(full)
      if steps == 0:
        compiling_calls.append(len(calls) - 1)
      return train_block(state, block, steps_L, *carry, full=full)

    def compile_all_steps(*args):  # Compiled ahead, with the K chosen, after the last call.
      compiling_calls.append(len(calls) - 1)
      return train_block.compile_all_steps(*args)

    counted.compile_all_steps = compile_all_steps
    return counted

  if auto_chooses is not None:
    monkeypatch.setattr(block_plan, 'choose_steps_per_dispatch', lambda *args, **kwargs: auto_chooses)
  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    summary = train.train_and_evaluate(
      _tiny(
        num_replicas=8,
        batch_size=32,
        data__num_train_examples=16_384,
        sync__algorithm=algorithm,
        sync__every_k_steps=10,
        sync__min_interval_s=0.0,
        train__steps_per_dispatch=steps_per_dispatch,
        train__all_steps_program=True,
      ),
      tmp_path,
      make_block=counting_make_train_block,
    )
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
  assert sum(steps for _, steps in calls) == 64 and calls[0][1] == 1
  if auto_chooses is not None:
    assert summary['steps_per_dispatch'] == auto_chooses
  if 8 in (steps_per_dispatch, auto_chooses):  # 'auto''s own choice here (64) is longer than the steps left.
    assert fulls.count(True) >= 3, (calls, fulls)  # Full blocks ran the program of all K steps, compiled ahead.
  if algorithm != 'none':
    assert summary['sync_rounds'] >= 1
  # After the last compiling call, nothing compiles.
  last_compiling = max(compiling_calls)
  assert calls[1][0] > 0
  assert len(calls) > last_compiling + 1
  assert {count for count, _ in calls[last_compiling + 1 :]} == {calls[last_compiling + 1][0]}, (calls, compiling_calls)


def test_invalid_config_fails_before_training(tmp_path):
  with pytest.raises(config_lib.ConfigError, match='num_replicas'):
    train.train_and_evaluate(_tiny(num_replicas=16), tmp_path)
  assert not list(tmp_path.iterdir())


def test_a_state_that_cannot_fit_is_refused_before_anything_is_allocated(tmp_path):
  """Tables of twice this machine's available memory (their f32 rows alone) in every one of 8 replicas: the run
  stops at once, saying what it needs and what to change (sharding them, or smaller tables), and leaves nothing
  behind; sharded, once in the job, they are still too much. Rows of 512 keep the concatenated table's row ids
  within int32 on machines of up to ~2 TB (the tiny config's 8 overflowed them on one of 125 GB)."""
  width = 512
  rows = 2 * memory.available_host_bytes() // (26 * width * 4) + 1
  config = _tiny(num_replicas=8, data__cardinalities=(rows,) * 26, model__embedding_dim=width)
  config.model.bottom_mlp = (16, width)
  with pytest.raises(config_lib.ConfigError, match=r'needs [\d.]+ GB.*available.*sync\.embedding_placement=sharded'):
    train.train_and_evaluate(config, tmp_path)
  assert not list(tmp_path.iterdir())
  config.sync.embedding_placement = 'sharded'
  with pytest.raises(config_lib.ConfigError, match=r'data\.cardinalities'):
    train.train_and_evaluate(config, tmp_path)


@pytest.mark.parametrize(
  'overrides',
  [
    {'sync__algorithm': 'none'},
    {'sync__algorithm': 'sync_sgd'},
    {'sync__algorithm': 'fr_ma', 'sync__every_k_steps': 6},
    {'recovery__mode': 'full', 'recovery__mtbf_steps': 25.0, 'recovery__checkpoint_every_steps': 10},
  ],
  ids=['none', 'sync_sgd', 'fr_ma', 'emulated_failures'],
)
def test_blocks_of_any_size_train_the_same_model(tmp_path, overrides):
  """One step a dispatch, two, and K = 'auto' (blocks cut at the log steps, the rounds, the checkpoints and the
  failures) train the same model: events happen at the same steps whatever the blocks. Blocks of 2 and of 'auto''s
  K run one compiled loop body and agree bit for bit (the fingerprint is of the model's bytes); a one-step buffer
  lets XLA compile the body otherwise, and the floats reassociate: its NE agrees within 1e-6."""
  summaries = {}
  for steps_per_dispatch in (1, 2, 'auto'):
    config = _tiny(
      num_replicas=2,
      batch_size=32,
      data__num_train_examples=2048,
      train__log_every_steps=7,
      train__checkpoint_every_steps=16,
      train__steps_per_dispatch=steps_per_dispatch,
      **overrides,
    )
    summaries[steps_per_dispatch] = train.train_and_evaluate(config, tmp_path / str(steps_per_dispatch))
  one, two, auto = summaries[1], summaries[2], summaries['auto']
  assert (one['steps_per_dispatch'], two['steps_per_dispatch']) == (1, 2) and auto['steps_per_dispatch'] >= 1
  assert one['train_steps'] == two['train_steps'] == auto['train_steps'] == 32
  assert one['num_failures'] == two['num_failures'] == auto['num_failures']
  if 'recovery__mode' in overrides:
    assert auto['num_failures'] >= 1
  assert two['consensus_fingerprint_per_process'] == auto['consensus_fingerprint_per_process']
  assert two['eval_ne'] == auto['eval_ne']
  assert one['eval_ne'] == pytest.approx(auto['eval_ne'], rel=1e-6)


@pytest.mark.parametrize(
  'overrides',
  [
    {'sync__algorithm': 'sync_sgd'},
    {'sync__algorithm': 'fr_bmuf', 'sync__every_k_steps': 6},  # `none`'s program, and a round at boundaries.
    {'sync__algorithm': 'shadow_ea'},
    {'sync__algorithm': 'shadow_bmuf'},
  ],
  ids=['sync_sgd', 'fr_bmuf', 'shadow_ea', 'shadow_bmuf'],
)
def test_full_blocks_of_the_all_steps_program_train_the_same_bits_whatever_k(tmp_path, monkeypatch, overrides):
  """The default program (`train.all_steps_program`: full blocks run a loop of static length) at K = 4 and 8, every
  block full but where a log step or the stop cuts one: the same bits. Shadow rounds fused into the blocks follow
  a gap of their measured cost, here fixed at 3 steps (the gap alone is timing; where rounds fall given a gap is
  not)."""
  monkeypatch.setattr(pacing.GapPacer, 'gap_steps', lambda self: 3)
  summaries = {}
  for steps_per_dispatch in (4, 8):
    config = _tiny(
      num_replicas=2,
      batch_size=32,
      data__num_train_examples=4096,
      train__log_every_steps=32,
      train__all_steps_program=True,
      train__steps_per_dispatch=steps_per_dispatch,
      **overrides,
    )
    summaries[steps_per_dispatch] = train.train_and_evaluate(config, tmp_path / str(steps_per_dispatch))
  four, eight = summaries[4], summaries[8]
  assert four['train_steps'] == eight['train_steps'] == 64
  assert four['consensus_fingerprint_per_process'] == eight['consensus_fingerprint_per_process']
  assert four['eval_ne'] == eight['eval_ne'] and four['sync_rounds'] == eight['sync_rounds']


@pytest.mark.parametrize(
  'share, by, expected', [(1e9, 'seconds', 'every write'), (1e-9, 'seconds', 'none'), (1e-9, 'steps', 'every write')]
)
def test_the_metric_streams_replica_divergence_is_written_no_more_often_than_its_cost_allows(
  tmp_path, monkeypatch, share, by, expected
):
  """A write's divergence reads every replicated param (seconds at Criteo Kaggle's size, 8 replicas): it is timed
  before the steps, and writes by seconds carry it no more often than `DIVERGENCE_SHARE` of the time between
  allows: priced as free, every one; priced as if it took a billion times its time, none. Writes at the steps asked
  for carry it whatever it costs. The summary's, measured at the end, is there either way."""
  monkeypatch.setattr(metric_log, 'DIVERGENCE_SHARE', share)
  every = {'seconds': {'train__log_every_s': 1e-6, 'train__log_every_steps': 10**6}, 'steps': {}}[by]
  summary = train.train_and_evaluate(_tiny(num_replicas=2, **{'train__log_every_steps': 32, **every}), tmp_path)
  writes = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  writes = [w for w in writes if 'train_loss' in w]
  assert len(writes) >= 3
  carried = [w for w in writes if 'replica_divergence' in w]
  assert len(carried) == (len(writes) if expected == 'every write' else 0), writes
  assert summary['replica_divergence'] > 0
