r"""The default experiment: one DLRM replica on the embedded synthetic stream (2M examples).

  python -m experiments.train --workdir=/tmp/default --config=experiments/configs/default.py

What it reaches against its Bayes floor, seed by seed, and how fast: benchmarks/results/default_quality.md and the
README. `--config=experiments/configs/default.py:tiny` is the variant the tests and colabs use, seconds a run: 64k
examples, 50-row tables.
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
    # A set K: 'auto''s probe and the compile of the K it chooses cost a run of a few hundred steps more than its
    # blocks save (a 2-process job took 10 s with 'auto', 6 s with 16). Tests of 'auto' ask for it.
    config.train.steps_per_dispatch = 16
    # Its few hundred steps: the second block program, of all K steps, would cost more to compile than it saves
    # (18 of tests/test_train.py's tests took 129 s with it, 94 s without). Tests of it ask for it.
    config.train.all_steps_program = False
  elif variant:
    raise ValueError(f'unknown variant {variant!r} of experiments/configs/default.py; known: tiny')
  return config
