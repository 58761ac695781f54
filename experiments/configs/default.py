r"""The default experiment: one DLRM replica on the embedded synthetic stream (2M examples).

  python -m experiments.train --workdir=/tmp/default --config=experiments/configs/default.py

Expected on a 2-core CPU: about 30 s end to end on quiet cores; for seed 0 eval NE 0.8379 against a Bayes floor of
0.8123 (+3.1%; every seed's figures and their mean: benchmarks/results/default_quality.md).
`--config=experiments/configs/default.py:tiny` is the ten-second variant the tests and colabs use: 64k examples,
50-row tables; expected eval NE about 0.92 (floor about 0.83).
"""

from shadowsync_jax import config as config_lib


def get_config(variant: str = ''):
  config = config_lib.base_config()
  if variant == 'tiny':
    config.data.num_train_examples = 65_536
    config.data.num_eval_examples = 4096
    config.data.cardinalities = (50,) * config_lib.NUM_SPARSE_FEATURES
    config.batch_size = 128
    config.model.bottom_mlp = (16, 8)
    config.model.embedding_dim = 8
    config.model.top_mlp = (16, 1)
    config.optimizer.mlp_learning_rate = 0.1
    config.optimizer.embedding_learning_rate = 0.1
    config.train.log_every_steps = 50
    config.train.log_every_s = 0.0  # By steps only: the tests and notebooks read writes at known steps.
    config.train.checkpoint_every_steps = 200
    config.train.checkpoint_every_s = 0.0  # By steps only: the tests check where checkpoints land.
  elif variant:
    raise ValueError(f'unknown variant {variant!r} of experiments/configs/default.py; known: tiny')
  return config
