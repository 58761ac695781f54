"""JAX's coordination service in a process of its own, so that any training process may die without the others.

  python -m experiments.coordinator --port=12345 --num_processes=2    # prints 'ready', serves until killed
  # every training process: experiments.train --coordinator_address=HOST:12345 --nostart_coordinator ...

`jax.distributed.initialize` starts the service inside process 0. When process 0 dies, every other process loses
it within milliseconds and JAX aborts them (SIGABRT) before any of their code runs: no survivor can save its live
state, and a partial recovery becomes a full one. Outside the trainers (as torchelastic keeps its rendezvous store
in its agent, not in a worker) the service outlives any of them; it is made `recoverable`, so a dead trainer does
not take the others down with it either. `launcher` starts one per generation of a job; on real hosts run one as a
sidecar beside process 0 (BUILD.md). It imports jaxlib alone, not JAX's training stack: it starts in a fraction
of a second.
"""

import signal
import sys
import threading

from shadowsync_jax.parallel import private_apis

READY = 'ready'


def serve(port: int, num_processes: int, heartbeat_timeout_s: int, out=sys.stdout) -> None:
  """Runs the service on every address of this host at `port` until SIGTERM or SIGINT; says READY once up."""
  service = private_apis.coordination_service(port, num_processes, heartbeat_timeout_s)
  stop = threading.Event()
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
  print(READY, file=out, flush=True)
  stop.wait()
  del service  # Its destructor stops it; `shutdown` would wait for every client to disconnect.
