"""Fixtures of the data tests: generated Criteo days and their prepared dataset, made once per session."""

import generated_criteo
import pytest


@pytest.fixture(scope='session')
def criteo_days(tmp_path_factory):
  return generated_criteo.write_days(str(tmp_path_factory.mktemp('criteo_days')))


@pytest.fixture(scope='session')
def prepared_criteo(criteo_days, tmp_path_factory):
  """(TFDS data_dir, the dataset's directory, the preparation's Result)."""
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  version_dir, result = generated_criteo.prepare(criteo_days, data_dir)
  return data_dir, version_dir, result
