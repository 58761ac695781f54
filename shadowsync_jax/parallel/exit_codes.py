"""How a process of a job tells whoever started it why it ended: its exit status, and its one-line usage error.

  0                   done
  USAGE (2)           refused its command line or config; printed one line starting with ERROR_PREFIX
  UNRECOVERABLE (3)   cannot restore what its restart needs (a checkpoint missing or unreadable); one ERROR_PREFIX
                      line names it: restarting would not help
  PEER_LOST (75)      stopped because another process of the job is gone (EX_TEMPFAIL: run the job again)
  anything else       failed on its own (a traceback says why)

The training binary (`experiments.train` through `cli`), the runtime's watchdog (`distributed`) and the launcher
(`launcher`) share these, so that a supervisor, ours or a cluster's, can tell a bad config from a lost peer.
"""

USAGE = 2
UNRECOVERABLE = 3
PEER_LOST = 75
ERROR_PREFIX = 'error: '
