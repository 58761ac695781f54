r"""The CPR study's setting: the default problem with failures of one embedding shard (DESIGN §7).

  python -m benchmarks.recovery [--config=experiments/configs/recovery.py[:tiny]] [--config.recovery.KEY=VALUE]

`benchmarks.recovery` trains it once per recovery mode (no failures, full, partial, cpr_mfu, cpr_ssu) and prints
the overhead table (docs/studies/cpr.md). Save and restore costs are measured (the time the training loop is
blocked), not emulated. Expected on 2 CPU cores: about 7 minutes; about 10 failures; full recovery about 10%
overhead (8.2% expected), partial and the CPR variants 0.13-0.21 of that (single rows move by a third with the load
of a shared machine), eval NE within 0.01% of the run without failures (full: equal). 8 shards and a PLS budget of
2%: with the config defaults (4 shards, 1%) partial recovery's interval is close to Young's and it saves far less
(docs/studies/cpr.md). `:tiny` is the notebook's variant (the tiny problem, seconds per run, too short for the
figures above).
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
