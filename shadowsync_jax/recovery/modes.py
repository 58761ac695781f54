"""The recovery modes (docs/design.md §7): what a failure reloads, and which modes recover only the failed part.

'none'      no failures
'full'      everything reloads the newest checkpoint; the data rewinds and the lost steps are trained again
'partial'   only the failed part reloads; the rest trains on; its updates since the checkpoint are lost (PLS)
'cpr_mfu'   'partial', and the most frequently used embedding rows are saved more often (exact counts)
'cpr_ssu'   'partial', and the most used rows are found from a sub-sample of the lookups
'cpr'       CPR's first mechanism: 'cpr_mfu' where partial recovery is expected to pay, else 'full'
            (`cost_model.choose`)
"""

from typing import Any

MODES = ('none', 'full', 'partial', 'cpr_mfu', 'cpr_ssu', 'cpr')
PARTIAL_MODES = ('partial', 'cpr_mfu', 'cpr_ssu')
FAILURE_TARGETS = ('replica', 'embedding_shard')


def incremental_setting(value: Any) -> bool | str | None:
  """`recovery.incremental` as 'auto', True or False (a flag's text too); None: not one of them."""
  text = str(value).lower()
  return {'auto': 'auto', 'true': True, 'false': False}.get(text)


def incremental_why_not(algorithm: str, placement: str, num_replicas: int, synced: str) -> str | None:
  """None where only the training steps write table rows (each row they write is stamped: what incremental
  checkpoints save, `recovery.incremental`); otherwise why incremental checkpoints cannot be exact. The arguments:
  `sync.algorithm`, `sync.embedding_placement`, `num_replicas`, `sync.what`."""
  without_rounds = algorithm in ('none', 'sync_sgd')
  if placement == 'sharded' or num_replicas == 1 or without_rounds or synced == 'dense':
    return None
  return (
    f'sync.algorithm={algorithm!r} with sync.what={synced!r} rewrites table rows in its rounds, which no '
    "step stamps: use sync.what='dense', sharded tables, or recovery.incremental=false"
  )
