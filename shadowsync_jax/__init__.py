"""shadowsync_jax: how R trainers of a CTR model should synchronize on a one-pass stream, and what failures cost.

  import shadowsync_jax as ssj
  config = ssj.base_config()                  # every key with its default (shadowsync_jax/config.py)
  config.num_replicas, config.sync.algorithm = 8, 'shadow_ma'
  summary = ssj.train_and_evaluate(config, workdir='/tmp/run')   # also WORKDIR/summary.json
  rows = ssj.read_metrics_jsonl('/tmp/run')   # the metrics over time

The packages, from the bottom up: `data` (the click stream), `model` (DLRM, sparse embeddings, the step),
`parallel` (replicas on devices, a job of processes), `metrics`, `sync` (ShadowSync and the foreground algorithms),
`recovery` (checkpoints, failures, CPR), `gba` (the parameter server); `config` and `train` on top, `studies` above
them all. The names here load on first use: importing a subpackage does not import the training stack.
"""

import importlib
from typing import Any

_EXPORTS = {
  'ConfigError': 'shadowsync_jax.config',
  'base_config': 'shadowsync_jax.config',
  'validate': 'shadowsync_jax.config',
  'train_and_evaluate': 'shadowsync_jax.train',
  'read_metrics_jsonl': 'shadowsync_jax.metrics.writer',
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
  return sorted(list(globals()) + __all__)
