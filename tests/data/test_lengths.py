"""Lengths of 0 mean the whole of the data: every training row, the held-out file or split or the last day; an
explicit length is honoured; a length the data cannot give names its key."""

import generated_criteo
import pytest

from experiments.configs import criteo_kaggle
from shadowsync_jax import config as config_lib
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.data import lengths
from shadowsync_jax.data.criteo import files


@pytest.mark.parametrize(
  'train_rows, eval_rows, num_train, num_eval, expected',
  [
    ([100, 100, 100], None, 0, 0, (200, 100, 200)),  # The last day held out.
    ([700], None, 0, 0, (600, 100, 600)),  # One file: its last seventh, Kaggle's 7th day.
    ([703], None, 0, 0, (603, 100, 603)),  # DLRM's days: the first 703 % 7 days one row longer.
    ([100, 100, 100], 80, 0, 0, (300, 80, None)),  # A held-out file: all of it, all training rows.
    ([100, 100, 100], 80, 250, 50, (250, 50, None)),  # Explicit lengths are honoured.
    ([100, 100, 100], None, 150, 0, (150, 100, 200)),  # Fewer training rows: the held-out day stays the last.
    ([100, 100, 100], None, 150, 30, (150, 30, 150)),  # Explicit eval without a file: it follows training.
    ([100, 100, 100], None, 0, 30, (270, 30, 270)),
  ],
)
def test_split_lengths(train_rows, eval_rows, num_train, num_eval, expected):
  assert lengths.split_lengths(train_rows, eval_rows, num_train, num_eval) == expected


@pytest.mark.parametrize(
  'eval_rows, num_train, num_eval, key',
  [
    (None, 250, 0, 'data.num_train_examples'),  # Into the held-out day.
    (None, 250, 60, 'data.num_train_examples'),
    (80, 301, 0, 'data.num_train_examples'),
    (80, 0, 81, 'data.num_eval_examples'),
  ],
)
def test_lengths_the_data_cannot_give_name_the_key(eval_rows, num_train, num_eval, key):
  with pytest.raises(ValueError, match=key):
    lengths.split_lengths([100, 100, 100], eval_rows, num_train, num_eval)


def test_synthetic_keeps_its_fixed_default():
  config = config_lib.resolve(config_lib.base_config())
  assert (config.data.num_train_examples, config.data.num_eval_examples) == (2_000_000, 200_000)


def test_a_criteo_file_trains_whole_without_a_length(criteo_days):
  """The new user's command: --config.data.source=criteo --config.data.train_path=FILE, nothing else."""
  config = config_lib.base_config()
  config.data.source, config.data.train_path = 'criteo', ','.join(generated_criteo.plain(p) for p in criteo_days)
  config.data.cardinalities = generated_criteo.CARDINALITIES
  config_lib.validate(config, num_devices=8)
  resolved = config_lib.resolve(config)
  assert (resolved.data.num_train_examples, resolved.data.num_eval_examples) == (8000, 4000)  # Days 0-1; day 2.
  train, held_out = input_pipeline.make_sources(config.data, seed=0)  # Unresolved 0s read the same.
  assert (len(train), len(held_out)) == (8000, 4000)
  config.data.train_path, config.data.eval_path = generated_criteo.plain(criteo_days[0]), criteo_days[2]
  resolved = config_lib.resolve(config)
  assert (resolved.data.num_train_examples, resolved.data.num_eval_examples) == (4000, 4000)
  config.data.eval_path, config.data.num_train_examples = '', 2000
  assert config_lib.resolve(config).data.num_eval_examples == files.day_sizes(4000, 7)[-1]


def test_a_prepared_dataset_trains_on_its_train_split_and_holds_out_the_other(prepared_criteo):
  data_dir, version_dir, _ = prepared_criteo
  config = criteo_kaggle.get_config('tiny')
  config.data.prepared_dir, config.data.cardinalities = data_dir, generated_criteo.CARDINALITIES
  resolved = config_lib.resolve(config)
  assert (resolved.data.num_train_examples, resolved.data.num_eval_examples) == (8000, 4000)
  config.data.eval_split = ''  # No held-out split: the last input (day) of the training split.
  assert config_lib.resolve(config).data.num_train_examples == 4000
  config.data.num_train_examples = 5000
  with pytest.raises(config_lib.ConfigError, match='data.num_train_examples=5000 reaches into the held-out'):
    config_lib.resolve(config)


def test_a_prepared_dataset_of_other_tables_or_without_the_split_is_refused(prepared_criteo):
  config = criteo_kaggle.get_config('tiny')
  config.data.prepared_dir = prepared_criteo[0]
  with pytest.raises(config_lib.ConfigError, match=r'data\.cardinalities differ'):
    config_lib.validate(config, num_devices=8)
  config.data.cardinalities, config.data.eval_split = generated_criteo.CARDINALITIES, 'validation'
  with pytest.raises(config_lib.ConfigError, match=r"data\.eval_split='validation' is not a split"):
    config_lib.validate(config, num_devices=8)
