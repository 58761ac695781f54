"""The recovery modes (docs/design.md §7): what a failure reloads, and which modes recover only the failed part.

'none'      no failures
'full'      everything reloads the newest checkpoint; the data rewinds and the lost steps are trained again
'partial'   only the failed part reloads; the rest trains on; its updates since the checkpoint are lost (PLS)
'cpr_mfu'   'partial', and the most frequently used embedding rows are saved more often (exact counts)
'cpr_ssu'   'partial', and the most used rows are found from a sub-sample of the lookups
'cpr'       CPR's first mechanism: 'cpr_mfu' where partial recovery is expected to pay, else 'full'
            (`cost_model.choose`)
"""

MODES = ('none', 'full', 'partial', 'cpr_mfu', 'cpr_ssu', 'cpr')
PARTIAL_MODES = ('partial', 'cpr_mfu', 'cpr_ssu')
FAILURE_TARGETS = ('replica', 'embedding_shard')
