"""The TorchRec comparison's parts that need no TorchRec: the batches it is given, its table, a worker that fails."""

import sys

import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax.data import synthetic
from shadowsync_jax.studies import provenance
from shadowsync_jax.studies import torchrec_peer


def test_the_worker_gets_the_first_batches_of_the_same_stream(tmp_path):
  config = default.get_config()
  config.data.num_train_examples, config.data.num_eval_examples = 4096, 1024
  torchrec_peer.write_batches(config, tmp_path / 'b.npz', num_batches=3)
  data = np.load(tmp_path / 'b.npz')
  stream = synthetic.SyntheticSource(synthetic.SyntheticSpec(seed=config.seed, cardinalities=config.data.cardinalities))
  first = stream.read(0, 3 * config.batch_size)
  assert data['sparse'].shape == (3, config.batch_size, 26) and data['dense'].shape == (3, config.batch_size, 13)
  np.testing.assert_array_equal(data['sparse'].reshape(-1, 26), first.sparse)
  np.testing.assert_array_equal(data['label'].ravel(), first.label)
  np.testing.assert_array_equal(data['cardinalities'], config.data.cardinalities)


def test_the_table_reads_the_ratio_against_the_target():
  results = {
    'ours': [{'examples_per_sec': 40_000.0}, {'examples_per_sec': 38_000.0}],
    'torchrec': [{'examples_per_sec': 8_000.0, 'torch': '2.13.0+cpu', 'torchrec': '1.8.0'}] * 2,
    'ratio_median': 4.875,
    'ratio_range': [4.75, 5.0],
  }
  text = torchrec_peer.table(results)
  assert '39,000' in text and '8,000' in text and '4.88 (4.75-5.00; target 1.8: met)' in text


def test_the_worker_run_in_torchrecs_python_is_measured_code_of_the_result():
  files = provenance.measured_files(modules={'shadowsync_jax.studies.torchrec_peer': torchrec_peer})
  assert 'benchmarks/torchrec_worker.py' in files and 'shadowsync_jax/studies/torchrec_peer.py' in files
  assert torchrec_peer.WORKER.is_file()


def test_a_worker_that_fails_is_an_error_with_its_output(tmp_path):
  np.savez(tmp_path / 'b.npz', dense=np.zeros((1, 2, 13)))
  with pytest.raises(RuntimeError, match='TorchRec worker failed'):  # This Python has no torch (or no 'sparse').
    torchrec_peer.time_torchrec(sys.executable, tmp_path / 'b.npz', tmp_path / 'out.json', steps=1, lr=0.1)
