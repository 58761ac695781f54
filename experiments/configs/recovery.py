r"""The CPR study's extra setting, beside the defaults: more shards and a larger PLS budget (docs/design.md §7).

  python -m benchmarks.recovery --config=experiments/configs/recovery.py[:tiny] \
      --out=benchmarks/results/recovery_8_shards_pls_0.02.md

The default problem with failures of one of 8 embedding shards (default 4), every 1200 steps on average (1000),
and a PLS budget of 2% (1%): with the defaults partial recovery saves more often than full recovery (its interval
is shorter than Young's); here less than half as often (docs/studies/cpr.md reads both result files).
`:tiny` is the notebook's variant (the tiny problem, seconds per run).
"""

from experiments.configs import default


def get_config(variant: str = ''):
  config = default.get_config(variant)
  config.recovery.failure_target = 'embedding_shard'
  config.recovery.num_embedding_shards = 8
  config.recovery.mtbf_steps = 1200.0
  config.recovery.target_pls = 0.02
  config.train.progress_every_s = 30.0
  if variant == 'tiny':
    config.recovery.mtbf_steps = 150.0
    config.train.progress_every_s = 60.0
  return config
