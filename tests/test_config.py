"""Invalid configurations fail before anything compiles, with a message naming the key."""

import gzip
import importlib
import os

import pytest

from experiments.configs import default
from shadowsync_jax import config as config_lib


def _config(**overrides):
  config = default.get_config('tiny')
  for dotted, value in overrides.items():
    parent = config
    *path, leaf = dotted.split('__')
    for part in path:
      parent = parent[part]
    parent[leaf] = value
  return config


# The keys every config has (docs/design.md §9).
CONTRACT_KEYS = (
  'num_replicas',
  'seed',
  'data.source',
  'data.train_path',
  'data.eval_path',
  'data.num_train_examples',
  'data.num_eval_examples',
  'batch_size',
  'sync.algorithm',
  'sync.every_k_steps',
  'sync.min_interval_s',
  'sync.elastic_alpha',
  'sync.block_momentum',
  'sync.block_lr',
)


@pytest.mark.parametrize('variant', ['', 'tiny'])
def test_default_and_tiny_configs_are_valid_and_have_the_contract_keys(variant):
  config = default.get_config(variant)
  config_lib.validate(config, num_devices=8)  # Raises if invalid.
  flat = config.to_dict()
  for key in CONTRACT_KEYS:
    section, _, leaf = key.rpartition('.')
    assert leaf in (flat[section] if section else flat), key


@pytest.mark.parametrize(
  'overrides, key',
  [
    ({'num_replicas': 9}, 'num_replicas'),
    ({'num_replicas': -1}, 'num_replicas'),
    ({'optimizer__mlp_learning_rate': -0.1}, 'optimizer.mlp_learning_rate'),
    ({'optimizer__embedding_learning_rate': 0.0}, 'optimizer.embedding_learning_rate'),
    ({'sync__algorithm': 'gossip'}, 'sync.algorithm'),
    ({'train__steps_per_dispatch': 0}, 'train.steps_per_dispatch'),
    ({'train__steps_per_dispatch': 'fast'}, 'train.steps_per_dispatch'),
    ({'train__steps_per_dispatch': 2.5}, 'train.steps_per_dispatch'),
    ({'train__log_every_s': -1.0}, 'train.log_every_s'),
    ({'train__checkpoint_every_s': -1.0}, 'train.checkpoint_every_s'),
    ({'sync__algorithm': 'gba', 'gba__staleness_decay': 2.0}, 'gba.staleness_decay'),
    ({'sync__what': 'some'}, 'sync.what'),
    ({'sync__embedding_placement': 'everywhere'}, 'sync.embedding_placement'),
    ({'sync__embedding_placement': 'sharded', 'sync__algorithm': 'gba'}, 'sync.embedding_placement'),
    ({'sync__embedding_placement': 'sharded', 'recovery__mode': 'partial'}, 'recovery.mode'),
    ({'sync__embedding_placement': 'sharded', 'sync__shard_exchange': 'broadcast'}, 'sync.shard_exchange'),
    ({'num_replicas': 8, 'sync__algorithm': 'fr_ea', 'sync__elastic_alpha': 0.2}, 'sync.elastic_alpha'),
    ({'data__source': 'parquet'}, 'data.source'),
    ({'data__source': 'criteo'}, 'data.train_path'),
    ({'data__cardinalities': (10,) * 25}, 'data.cardinalities'),
    ({'data__cardinalities': (100_000_000,) * 26}, 'data.cardinalities'),  # 2.6 billion rows: past int32 ids.
    ({'model__bottom_mlp': (16, 4)}, 'model.bottom_mlp'),
    ({'model__top_mlp': (16, 2)}, 'model.top_mlp'),
    ({'batch_size': 0}, 'batch_size'),
    ({'data__num_train_examples': 100}, 'data.num_train_examples'),
    ({'sync__block_momentum': 1.0}, 'sync.block_momentum'),
    ({'sync__min_interval_s': -0.1}, 'sync.min_interval_s'),
    ({'sync__min_interval_s': 'soon'}, 'sync.min_interval_s'),
    ({'sync__min_interval_s': True}, 'sync.min_interval_s'),
    ({'sync__max_overhead': 0.0}, 'sync.max_overhead'),
    ({'sync__max_overhead': 1.0}, 'sync.max_overhead'),
    ({'data__num_eval_examples': -1}, 'data.num_eval_examples'),
    ({'data__source': 'criteo', 'data__train_path': 'tests/data/criteo_tiny.tsv,/no/day_1'}, 'data.train_path'),
    ({'data__source': 'prepared'}, 'data.prepared_dir'),
    ({'data__source': 'prepared', 'data__prepared_dir': '/no/such/dir'}, 'data.prepared_dir'),
    ({'model__interaction': 'cross'}, 'model.interaction'),
    ({'model__interaction': 'dcn', 'model__cross_rank': 0}, 'model.cross_rank'),
    ({'model__interaction': 'dcn', 'model__cross_layers': 0}, 'model.cross_layers'),
  ],
)
def test_invalid_value_names_the_key(overrides, key):
  with pytest.raises(config_lib.ConfigError, match=key.replace('.', r'\.')):
    config_lib.validate(_config(**overrides), num_devices=8)


def test_auto_placement_shards_large_tables_of_several_replicas():
  """The Criteo configs' choice: Kaggle's 2.2 GB of tables whole on one replica, sharded over several; tables of a
  few MB replicated however many replicas there are."""
  kaggle = importlib.import_module('experiments.configs.criteo_kaggle').get_config()
  kaggle.data.source, kaggle.data.num_train_examples, kaggle.data.num_eval_examples = 'synthetic', 1 << 20, 1024
  assert kaggle.sync.embedding_placement == 'auto'
  assert config_lib.resolve(kaggle, num_processes=1).sync.embedding_placement == 'replicated'
  kaggle.num_replicas = 8
  assert config_lib.resolve(kaggle).sync.embedding_placement == 'sharded'
  config_lib.validate(kaggle, num_devices=8)
  small = _config(num_replicas=8, sync__embedding_placement='auto')
  assert config_lib.resolve(small).sync.embedding_placement == 'replicated'


def test_min_interval_s_is_auto_by_default_or_seconds():
  config = default.get_config('tiny')
  assert config.sync.min_interval_s == 'auto' and config.sync.max_overhead == 0.05
  for seconds in (0, 0.2, 3):
    config.sync.min_interval_s = seconds  # A number where the default is a string: the field takes both.
    config_lib.validate(config, num_devices=8)
  config.sync.min_interval_s = 'auto'
  config_lib.validate(config, num_devices=8)


def test_unknown_key_is_named():
  config = default.get_config('tiny')
  with config.unlocked():
    config.sync.elastic_alhpa = 0.2
  with pytest.raises(config_lib.ConfigError, match=r'sync\.elastic_alhpa'):
    config_lib.validate(config, num_devices=8)


def test_missing_key_is_named():
  config = default.get_config('tiny')
  del config.train['eval_batch_size']
  with pytest.raises(config_lib.ConfigError, match=r'train\.eval_batch_size'):
    config_lib.validate(config, num_devices=8)


@pytest.mark.parametrize('name', ['criteo_kaggle', 'criteo_terabyte'])
def test_criteo_configs_read_prepared_data_by_name_and_have_every_key(name):
  module = importlib.import_module(f'experiments.configs.{name}')
  variants = ('', 'local', 'tiny', 'dcn', 'gpu') if name == 'criteo_kaggle' else ('', 'local', 'tiny', 'dot')
  for variant in variants:
    config = module.get_config(variant)
    assert config_lib.flat_keys(config).keys() == config_lib.flat_keys(config_lib.base_config()).keys()
    dataset = name.removeprefix('criteo_') + (f'_{variant}' if variant in ('local', 'tiny') else '')
    assert config.data.source == 'prepared'
    assert config.data.prepared_dir.endswith(os.path.join('criteo_click_blocks', dataset))
    assert (config.data.num_train_examples, config.data.num_eval_examples) == (0, 0)  # The whole days.
    config.data.source = 'synthetic'  # Every other key as the variant sets it: valid (no prepared data here).
    config_lib.validate(config, num_devices=8)
  terabyte = importlib.import_module('experiments.configs.criteo_terabyte').get_config()
  assert max(terabyte.data.cardinalities) == 40_000_000 and terabyte.model.interaction == 'dcn'
  narrow = importlib.import_module('experiments.configs.criteo_terabyte').get_config('dim16')
  assert narrow.data.cardinalities == terabyte.data.cardinalities and narrow.model.embedding_dim == 16
  assert narrow.data.prepared_dir == terabyte.data.prepared_dir and narrow.model.bottom_mlp[-1] == 16


def test_a_gzip_file_is_refused_for_reading_at_random(tmp_path):
  path = tmp_path / 'day_0.gz'
  path.write_bytes(gzip.compress(b'0\t1\n'))
  with pytest.raises(config_lib.ConfigError, match='gzip-compressed.*prepare_criteo'):
    config_lib.validate(_config(data__source='criteo', data__train_path=str(path)), num_devices=8)


def test_unknown_variant_is_rejected():
  with pytest.raises(ValueError, match='huge'):
    default.get_config('huge')


def test_checkpoints_in_seconds_are_accepted_where_the_processes_step_together():
  """A lock-step job turns the seconds into common steps once its steps are timed (`recovery.real`; the sync SGD
  job of tests/parallel/test_multiprocess.py checks where its saves land)."""
  for algorithm in ('none', 'sync_sgd', 'fr_ma'):
    config = _config(num_replicas=2, sync__algorithm=algorithm, train__checkpoint_every_s=30.0)
    config_lib.validate(config, num_devices=8, num_processes=2)  # Raises ConfigError where refused.
    resolved = config_lib.resolve(config, num_processes=2)
    assert resolved.train.checkpoint_every_s == 30.0  # Kept in seconds: the job turns them into steps as it runs.
