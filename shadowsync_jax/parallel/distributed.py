"""The multi-process runtime: `jax.distributed` (gloo on CPU) and a watchdog that finds a peer gone or hung.

  distributed.initialize('127.0.0.1:1234', num_processes=2, process_id=0, peer_timeout_s=30)
  ...                                   # jax.devices(): the job's devices; jax.local_devices(): this process's
  distributed.report(step, phase='train')      # progress the peers watch: a peer whose step stalls is hung
  values = distributed.exchange('plan', mine)  # every process's value, in process order (the key-value store)
  links = distributed.peer_links('sums')       # the same again at every call, over direct connections (links.meet)
  if distributed.peer_lost():                  # at a step boundary: save what survives, exit PEER_LOST
  distributed.fail(error)               # on an exception: ends this process, blaming it or a peer that is gone
  distributed.finish()                  # normal end: the peers stop watching this process; shuts the runtime down

One process per host (or per GPU); the same code on CPU, GPU and TPU. Cross-process collectives go over gloo on
CPU and NCCL on GPUs. The coordination service runs in process 0 (JAX's way) or, with `start_service=False`, in
whoever started the job (`launcher`, `coordinator`): then a dead process 0 is a peer like any other, where JAX
would abort every survivor the moment it died.

A process that dies (killed, crashed) or hangs would leave its peers waiting in a collective for good. Every
process publishes a heartbeat in the runtime's key-value store once a second: a counter, and the step and phase
its training thread last reported. A peer is lost when it reported a failure, when its heartbeat stops for
`peer_timeout_s` (dead, or stopped), when it is training and its step has not moved for `peer_timeout_s` (hung),
or when the key-value store itself does not answer for `peer_timeout_s` (a network partition: its calls have no
deadline, so a guard thread that makes none watches the watchdog). Then `peer_lost()` becomes true: a training
loop that checks it at its step boundaries (`handle_peer_loss(True)`) gets the time of a few steps to save what it
holds and exit with `exit_codes.PEER_LOST`; any other process, or one whose training thread is stuck in a collective, is
ended by the watchdog with that code (`peer_watchdog`: the heartbeat, the watching, the grace and the exit). This
module is the job's interface: joining it, the watchdog's reports, the exchanges through the key-value store,
the direct links between the processes (`peer_links`), and the ends of a process.
"""

from collections.abc import Callable
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

import jax

from shadowsync_jax.parallel import network
from shadowsync_jax.parallel import peer_links as peer_links_lib
from shadowsync_jax.parallel import peer_watchdog
from shadowsync_jax.parallel import private_apis

_PREFIX = peer_watchdog.PREFIX
_EXCHANGE_TIMEOUT_MS = 300_000
_LOOKUP_POLL_MS = 50  # How often a `peer_links` lookup waiting for a peer asks whether it was stopped.

_watchdog: peer_watchdog.PeerWatchdog | None = None


def initialize(
  coordinator_address: str,
  num_processes: int,
  process_id: int,
  peer_timeout_s: float = 30.0,
  start_service: bool = True,
) -> None:
  """Joins the job as `process_id` of `num_processes`; process 0 starts the coordination service at
  `coordinator_address` unless `start_service` is False (it runs elsewhere: `coordinator.host`)."""
  global _watchdog
  if not 0 <= process_id < num_processes:
    raise ValueError(f'process_id={process_id} must be in [0, num_processes={num_processes}).')
  if peer_timeout_s < 2 * peer_watchdog.HEARTBEAT_S:
    raise ValueError(f'peer_timeout_s={peer_timeout_s} must be at least {2 * peer_watchdog.HEARTBEAT_S} s.')
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.config.update('jax_enable_preemption_service', False)  # Preemption is SIGTERM here (`_on_sigterm`).
  private_apis.bind_gloo_to(network.local_address_towards(coordinator_address))
  # JAX's own liveness check ends the process with a fatal log; ours, faster, says which peer and why.
  heartbeat_timeout_s = int(3 * peer_timeout_s) + 10
  private_apis.connect_client(coordinator_address, num_processes, process_id, heartbeat_timeout_s, start_service)
  _watchdog = peer_watchdog.PeerWatchdog(
    private_apis.distributed_client(), process_id, num_processes, peer_timeout_s, coordinator_address
  )
  _watchdog.start()
  _watch_for_sigterm()


def active() -> bool:
  """Whether this process is part of a job of several processes set up by `initialize`."""
  return _watchdog is not None


def report(step: int, phase: str = 'train', checkpoint: int | None = None) -> None:
  """The training thread's progress (and its newest complete checkpoint, when it knows one), published with the
  next heartbeat: cheap, call it every step."""
  if _watchdog is not None:
    _watchdog.reported(step, phase)
    if checkpoint is not None:
      _watchdog.checkpoint = checkpoint


def block_dispatched(steps: int | None) -> None:
  """The training thread dispatched a block of `steps` steps that are collectives of the job (sharded tables, sync
  SGD): it cannot end without every peer, so a lost peer gives the loop at most a step more than the short grace
  to reach its boundary (`peer_watchdog.PeerWatchdog.grace_s`). None: no such block from now on (the loop ended)."""
  if _watchdog is not None:
    _watchdog.dispatched(steps)


def lost_for_s() -> float | None:
  """Seconds since a peer was lost (or this process told to stop), None while every peer is well."""
  lost_at = _watchdog._lost_at if _watchdog is not None else None  # pylint: disable=protected-access
  return None if lost_at is None else time.monotonic() - lost_at


def my_step() -> int:
  """The step this process's training thread last reported."""
  return _watchdog.step if _watchdog is not None else 0


def peer_lost() -> str | None:
  """Why a peer is lost (or this process was told to stop: SIGTERM), None while every peer is well."""
  return _watchdog.lost_reason if _watchdog is not None else None


def handle_peer_loss(
  enabled: bool, last_resort: Callable[[str], None] | None = None, boundary_matters: bool = True
) -> None:
  """While enabled, a lost peer is left to the training loop (`peer_lost`), which saves and exits within the
  watchdog's grace (`peer_watchdog.PeerWatchdog.grace_s`); otherwise, and after that, the watchdog ends this
  process, after calling `last_resort(reason)` (the training thread is stuck: save what can be saved without it).
  Where the loop would save nothing at its boundary that `last_resort` does not (`boundary_matters` False: no live
  state is kept), the wait is the short one."""
  if _watchdog is not None:
    _watchdog.loop_handles_loss, _watchdog.last_resort = enabled, last_resort
    _watchdog.boundary_matters = boundary_matters


def peer_status() -> dict[int, dict[str, Any]]:
  """What each peer last reported: its `step` (where a dead peer had got to, for a partial recovery) and its newest
  complete `checkpoint` (the newest one every process has bounds what a full recovery may need)."""
  return {peer: dict(status) for peer, status in _watchdog.peer_status.items()} if _watchdog is not None else {}


def exchange(name: str, value: Any) -> list[Any]:
  """Every process's `value` (JSON-able) under `name`, in process order: each publishes, then reads the others'.
  A synchronization point of the job, through the coordination service (no collective)."""
  if _watchdog is None:
    return [value]
  client, process_id = private_apis.distributed_client(), _watchdog.process_id
  client.key_value_set(f'{_PREFIX}/exchange/{name}/{process_id}', json.dumps(value))
  return [
    json.loads(client.blocking_key_value_get(f'{_PREFIX}/exchange/{name}/{p}', _EXCHANGE_TIMEOUT_MS))
    for p in range(_watchdog.num_processes)
  ]


def peer_links(name: str) -> peer_links_lib.PeerLinks:
  """Direct connections between the job's processes (`peer_links`): what each process offers at a call, met with
  no collective and nothing through the coordination service but where each listens. Connected at the first call,
  from the address this process reaches the coordinator from; in a one-process run, a call returns its own."""
  if _watchdog is None:
    return peer_links_lib.PeerLinks(name, 0, 1, '127.0.0.1', publish=None, lookup=None)
  client = private_apis.distributed_client()

  def publish(key: str, value: str) -> None:
    client.key_value_set(f'{_PREFIX}/{key}', value)

  def lookup(key: str, stopped: Callable[[], bool]) -> str | None:
    while (value := _get_within(client, f'{_PREFIX}/{key}', _LOOKUP_POLL_MS)) is None:
      if stopped():
        return None
    return value

  address = network.local_address_towards(network.coordinator_address())
  return peer_links_lib.PeerLinks(name, _watchdog.process_id, _watchdog.num_processes, address, publish, lookup)


def _get_within(client, key: str, timeout_ms: int) -> str | None:
  """The value of `key`, or None if it was not set within `timeout_ms`."""
  try:
    return client.blocking_key_value_get(key, timeout_ms)
  except Exception as error:  # pylint: disable=broad-except
    if 'DEADLINE_EXCEEDED' in str(error):
      return None
    raise


def wait_for_every_process(name: str) -> None:
  """Returns once every process has called it with `name`: a barrier through the coordination service, with no
  deadline (a peer that dies meanwhile is the watchdog's to find), for processes far apart in time, e.g. a fast one
  that finished its stream long before a straggler: the collectives that follow would time out waiting (gloo gives
  a peer 30 s to join a new group)."""
  if _watchdog is None:
    return
  client = private_apis.distributed_client()
  client.key_value_set(f'{_PREFIX}/barrier/{name}/{_watchdog.process_id}', '1')
  for process in range(_watchdog.num_processes):
    while _watchdog.try_get(f'{_PREFIX}/barrier/{name}/{process}') is None:
      time.sleep(0.2)


def fail(error: BaseException, exit_code: int = 1, explain: str | None = None) -> NoReturn:
  """Ends this process after `error` with `exit_code`, blaming the right process.

  An error from the transport (a collective whose partner vanished) is most likely a peer's death: the watchdog
  gets `peer_timeout_s` to name that peer (and ends the process itself); the error's traceback is printed only if
  no peer was lost by then (a peer's death is a line, not a crash of this process). Any other error is this
  process's own: `explain` (one line) or its traceback is printed, the peers are told at once, and stop naming it.
  Exits without waiting for the peers, as a normal exit would.
  """
  if _watchdog is not None and looks_like_a_lost_peer(error):
    first_line = str(error).splitlines()[0] if str(error) else ''
    os.write(
      2,
      f'\nshadowsync: process {_watchdog.process_id}: a collective failed ({type(error).__name__}: '
      f'{first_line[:300]}); waiting up to {_watchdog.timeout_s:g} s to learn whether a peer is gone.\n'.encode(),
    )
    _watchdog.loop_handles_loss = False
    _watchdog.wait_for_a_lost_peer()
  _print_own_error(error, explain)
  if _watchdog is not None:
    _watchdog.report_failure(f'{type(error).__name__}: {error}')
  os._exit(exit_code)  # pylint: disable=protected-access


def _print_own_error(error: BaseException, explain: str | None) -> None:
  if explain is not None:
    print(explain, file=sys.stderr)
  else:
    traceback.print_exception(error)
  sys.stderr.flush()
  sys.stdout.flush()


def looks_like_a_lost_peer(error: BaseException) -> bool:
  """Whether `error` is what a collective raises when its partner vanished (it names no one)."""
  text = str(error).lower()
  return any(
    sign in text for sign in ('gloo', 'connection closed', 'connection reset', 'unavailable', 'nccl', 'socket')
  )


def finish() -> None:
  """Marks this process done (its peers stop watching it), stops the watchdog, shuts the runtime down."""
  global _watchdog
  if _watchdog is None:
    return
  _watchdog.finish()
  _watchdog = None
  jax.distributed.shutdown()


def _watch_for_sigterm() -> None:
  """A scheduler's "stop now" (preemption), or the launcher telling of a dead peer: like a lost peer. Python runs a
  signal handler only when its main thread runs Python, which it may never do again (stuck behind a collective), so
  the signal is read from the interpreter's wakeup pipe, written by its C handler, in a thread of its own."""
  read_end, write_end = os.pipe()
  os.set_blocking(write_end, False)
  signal.signal(signal.SIGTERM, lambda *_: None)  # Handled below; the default would end the process at once.
  signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

  def watch():
    while True:
      signals = os.read(read_end, 64)
      if signal.SIGTERM in signals and _watchdog is not None:
        _watchdog.lose('told to stop (SIGTERM)')

  threading.Thread(target=watch, name='sigterm-watch', daemon=True).start()
