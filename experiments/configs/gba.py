r"""The GBA study's setting: the default problem on 8 workers of batch 64, 1M examples (docs/design.md §8).

  python -m benchmarks.gba_study [--config=experiments/configs/gba.py[:tiny]] [--config.gba.KEY=VALUE ...]

`benchmarks.gba_study` trains `sync_sgd`, `async_sgd` and `gba` with these same hyperparameters, without and with
stragglers (`--straggler_prob`, default 0.1: a step is 4x slower with that chance, per worker and step), and prints
the table of docs/studies/gba.md (what it measured, and how long it took, in its result file:
benchmarks/results/gba_study.md). `:tiny` is the smoke test's variant (the tiny problem, seconds per run; too short
for the study's figures).
"""

from experiments.configs import default


def get_config(variant: str = ''):
  config = default.get_config(variant)
  config.num_replicas = 8  # Workers of the parameter server; replicas of sync_sgd.
  config.batch_size = 64  # Local batch: the global batch of sync_sgd and of GBA's aggregation is 8 x 64.
  # sync_sgd's best of 0.025, 0.05, 0.1 and 0.2 on the full problem in one run (`--tune_learning_rates`,
  # docs/studies/gba.md; the latest run chose 0.05, within 0.1% of 0.1): the three algorithms train with the
  # synchronous run's hyperparameters, as in the GBA paper.
  config.optimizer.mlp_learning_rate = config.optimizer.embedding_learning_rate = 0.1
  if not variant:
    config.data.num_train_examples = 1_000_000
    config.train.log_every_steps = 100  # Its loops write by steps alone.
  config.train.checkpoint_every_steps = 0  # A GBA checkpoint drains the workers: a barrier; only the final one.
  config.train.checkpoint_every_s = 0.0
  config.train.progress_every_s = 30.0
  return config
