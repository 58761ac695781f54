"""One generation of a job on this machine: its coordinator, N training processes, their output, how it ended.

  generation = launcher.Generation(train_args, num_processes=2, cpu_devices=4, peer_timeout_s=30, pin_cpus=False,
                                   coordinator_port=free_port(), number=0, kill_schedule=schedule)
  standby.prepare()                                        # the next one, warm: started, imported, waiting
  outcome = generation.run(grace_s=60, random_kill=None, on_ready=standby.prepare)
  standby.abandon()                                        # not needed after all

`supervisor` runs generations until the job succeeds (`experiments.launch` is its command line). A generation
starts the coordination service in a process of its own (`coordinator`: so any training process may die without
taking the others down), then `python -m experiments.train` N times with `train_args`, the coordinator's address,
`--num_processes`, each its `--process_id` and `--cpu_devices` virtual CPU devices (so `--config.num_replicas`
counts the replicas of the whole job). Output lines are prefixed `[p0]`, `[p1]`, ...; a usage error every process
prints (one line `error: ...`, exit status 2: `exit_codes`) is printed once.

A warm standby (`prepare`, torchft's and elastic trainers' spare workers): the coordinator and every process
started ahead of time, each process with `--standby`, so it has imported everything
and waits on its stdin; `run` then sends each one line (JSON: the environment it starts with, such as the step
it is to be killed at) and it joins the job. `supervisor` prepares the next generation as soon as every process
of the current one trains, so a restart skips the imports and the coordinator's start. Where the launcher may raise
a priority again, a standby waits at the lowest (`children.standby_waits_idle`): its imports take the cores' idle
time, not the training beside it, and it joins at the launcher's.

Each process also gets a control pipe (`control`): it writes `ready` when it trains, every step it finishes, and
`kill STEP` where it was asked to be killed (`fault_injection`); `outcome.steps` is how far each got. When a
process fails (a non-zero exit, a signal, a kill), the launcher says which and how and sends the others SIGTERM: a
process then saves what it must and exits with `exit_codes.PEER_LOST` at its next step boundary, without waiting
for its watchdog to notice. Processes still running `grace_s` later (hung, or stopped) are killed. `pin_cpus`
gives each process its own share of this machine's cores (`sched_setaffinity`), so that processes behave like
separate hosts. How each child is started (its death signal, its cores, its priority) is `children`'s.

With `hosts` (`netns.EmulatedHosts`, as many as processes) process i runs in host i and the coordinator in host 0,
at host 0's address (never 127.0.0.1), so every collective crosses that host's shaped link; `partitions`
(`netns.Partition`, generation 0 only) cut a host's link, `after_s` counted from when every process trains.
"""

from collections.abc import Callable
import dataclasses
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from shadowsync_jax.parallel import children
from shadowsync_jax.parallel import control
from shadowsync_jax.parallel import cpu_time
from shadowsync_jax.parallel import exit_codes
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import netns

_POLL_S = 0.05
_CPU_SAMPLE_S = 0.5  # A process killed loses at most this much of its CPU account (`Outcome.cpu`).
_COORDINATOR_START_S = 60.0
# What `peer_watchdog.exit_peer_lost` prints: the process stopping, and the peer it lost and how.
_BLAME = re.compile(r'shadowsync: stopping process \d+: process (\d+) (.*?)\.?$')
# A survivor's exits: it lost a peer (its own code), or JAX aborted it because the coordinator's host died.
_PEER_LOST_CODES = (exit_codes.PEER_LOST, -signal.SIGABRT, 128 + signal.SIGABRT)


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]


def describe_exit(code: int) -> str:
  if code < 0:
    return f'was killed by {signal.Signals(-code).name}'
  return f'exited with code {code}'


@dataclasses.dataclass
class Failure:
  """The first failure of a generation: which process, how, and whether it was injected on purpose."""

  process: int
  how: str
  injected: bool = False
  step: int | None = None
  time: float = dataclasses.field(default_factory=time.time)  # When it was seen (or done, for a kill).


@dataclasses.dataclass
class Outcome:
  codes: list[int]
  failure: Failure | None
  seconds: float
  steps: list[int | None]  # The last step each process reported finishing.
  times: dict[str, float]  # Wall-clock times: 'started' (spawned), 'ready' (every process trains), 'ended'.
  # Each process's CPU seconds by thread group (`cpu_time`) from the moment every process trained to its last
  # reading (its start and restore left out; [] if that moment never came).
  cpu_while_training: list[dict[str, float]] = dataclasses.field(default_factory=list)

  @property
  def succeeded(self) -> bool:
    return all(code == 0 for code in self.codes)

  @property
  def refused(self) -> bool:
    """Every process refused its command line or config: nothing to restart."""
    return all(code == exit_codes.USAGE for code in self.codes)

  @property
  def unrecoverable(self) -> int | None:
    """The first process that cannot restore what its restart needs (a restart would find the same), or None."""
    return next((p for p, code in enumerate(self.codes) if code == exit_codes.UNRECOVERABLE), None)


class Generation:
  """One start of the whole job (module docstring)."""

  def __init__(
    self,
    train_args: list[str],
    num_processes: int,
    cpu_devices: int,
    peer_timeout_s: float,
    pin_cpus: bool,
    coordinator_port: int,
    number: int = 0,
    kill_schedule: fault_injection.KillSchedule | None = None,
    module: str = 'experiments.train',
    out=sys.stdout,
    hosts: netns.EmulatedHosts | None = None,
    partitions: tuple[netns.Partition, ...] = (),
  ):
    if hosts is not None and hosts.num_hosts != num_processes:
      raise ValueError(f'{hosts.num_hosts} emulated hosts for {num_processes} processes: one process per host.')
    self._hosts, self._partitions = hosts, partitions
    self._train_args, self._num_processes, self._cpu_devices = train_args, num_processes, cpu_devices
    self._peer_timeout_s, self._pin_cpus, self._port, self.number = peer_timeout_s, pin_cpus, coordinator_port, number
    self._kill_schedule, self._module, self._out = kill_schedule, module, out
    self._lock = threading.Lock()
    self._printed_errors: set[str] = set()
    self._ready: set[int] = set()
    self._kill_waiting: tuple[int, int] | None = None  # (process, step): a `--kill_at` victim waits for its peers.
    self._steps: list[int | None] = [None] * num_processes
    self._times: dict[str, float] = {}
    self._failure: Failure | None = None
    self._blamed: Failure | None = None  # The first peer a process said it lost, and how.
    self._processes: list[subprocess.Popen] = []
    self._threads: list[threading.Thread] = []
    self._coordinator: subprocess.Popen | None = None  # Started by `prepare`.
    self._abandoned = False  # `prepare` and `abandon` run on the spawner's thread, one at a time.
    self._on_ready: Callable[[], None] | None = None
    self._cpu = cpu_time.Sampler()
    self._idle_standby = children.standby_waits_idle()
    self._cpu_at_ready: list[dict[int, float]] | None = None  # `Sampler.mark`s once every process trains.

  def say(self, line: str) -> None:
    with self._lock:
      print(line, file=self._out, flush=True)

  def prepare(self) -> None:
    """Starts the coordinator and every process as a warm standby (module docstring); idempotent. They are started
    from one thread that lives as long as the launcher (`children.spawner`): a child's death signal
    (`children.child_setup`) fires when the thread that started it ends, not the process."""
    children.spawner().submit(self._prepare).result()

  def _prepare(self) -> None:
    if self._coordinator is None and not self._abandoned:
      self._coordinator = self._start_coordinator()
      self._spawn()

  def abandon(self) -> None:
    """Stops a prepared generation that will not run (the job ended before it was needed); on the spawner's
    thread, so never halfway through `prepare`."""
    children.spawner().submit(self._abandon).result()

  def _abandon(self) -> None:
    self._abandoned = True
    if self._coordinator is not None:
      self._stop_all()
      for process in self._processes:
        process.wait()

  def run(
    self,
    grace_s: float,
    random_kill: tuple[float, int] | None = None,
    on_ready: Callable[[], None] | None = None,
  ) -> Outcome:
    """Runs the generation to its end (preparing it first if it is not warm); `random_kill` = (time.monotonic()
    deadline, process) SIGKILLs that process then (or as soon as every process trains, if later); `on_ready` is
    called once every process trains (in a thread of its own)."""
    self._on_ready = on_ready
    started = time.monotonic()
    self._times['started'] = time.time()
    try:
      self.prepare()
      self._go()
      self._watch(grace_s, random_kill)
    finally:
      self._stop_all()
      for thread in self._threads:
        thread.join(timeout=10)
    codes = [process.wait() for process in self._processes]
    self._times['ended'] = time.time()
    ready = self._cpu_at_ready
    cpu = [self._cpu.totals(p.pid, since=mark) for p, mark in zip(self._processes, ready)] if ready else []
    return Outcome(codes, self._failure, time.monotonic() - started, list(self._steps), dict(self._times), cpu)

  def cpu_s(self) -> list[float]:
    """CPU seconds each of its processes took so far (a warm standby's: its imports); [] before `prepare`. Read on
    the spawner's thread: a `prepare` under way there (a standby started as the generation before it ended, on a
    busy machine) is done first, never seen with some of its processes started and some not."""
    return children.spawner().submit(lambda: [cpu_time.of_process(process.pid) for process in self._processes]).result()

  def _go(self) -> None:
    """Every waiting process joins the job: one line on its stdin, the environment it starts with."""
    for process_id, process in enumerate(self._processes):
      environment = self._kill_schedule.environment(process_id) if self._kill_schedule else {}
      if self._idle_standby:
        children.raise_priority(process.pid)
      try:
        process.stdin.write(json.dumps({'environment': environment}) + '\n')
        process.stdin.close()
      except (BrokenPipeError, OSError):  # It died waiting: `_watch` reports how.
        pass

  def _stop_all(self) -> None:
    """Kills every process still running and stops the coordinator."""
    for process in self._processes:
      if process.poll() is None:
        process.kill()
    if self._coordinator is not None:
      self._stop_coordinator()

  def _stop_coordinator(self) -> None:
    self._coordinator.terminate()
    try:
      self._coordinator.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self._coordinator.kill()

  def _start_coordinator(self) -> subprocess.Popen:
    command = [
      sys.executable,
      '-u',
      '-m',
      'experiments.coordinator',
      f'--port={self._port}',
      f'--num_processes={self._num_processes}',
      f'--heartbeat_timeout_s={int(3 * self._peer_timeout_s) + 10}',
    ]
    coordinator = subprocess.Popen(
      self._in_host(0, command),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      preexec_fn=functools.partial(children.child_setup, None),
      start_new_session=True,
    )
    deadline, said = time.monotonic() + _COORDINATOR_START_S, []
    for line in coordinator.stdout:
      if line.strip() == 'ready':
        threading.Thread(target=lambda: coordinator.stdout.read(), daemon=True).start()
        return coordinator
      said.append(line.rstrip())  # JAX's own notices; shown only if it does not start.
      if time.monotonic() > deadline:
        break
    coordinator.kill()
    for line in said:
      self.say(f'[coordinator] {line}')
    raise RuntimeError(f'the coordinator on port {self._port} did not start (exit {coordinator.wait()}).')

  def _spawn(self) -> None:
    address = f'{self._hosts.address(0) if self._hosts else "127.0.0.1"}:{self._port}'
    for process_id in range(self._num_processes):
      read_end, write_end = os.pipe()
      command = [
        sys.executable,
        '-u',
        '-m',
        self._module,
        f'--coordinator_address={address}',
        '--nostart_coordinator',
        f'--num_processes={self._num_processes}',
        f'--process_id={process_id}',
        f'--cpu_devices={self._cpu_devices}',
        f'--peer_timeout_s={self._peer_timeout_s}',
        '--standby',
        *self._train_args,
      ]
      env = {**os.environ, control.GENERATION_ENV: str(self.number), control.CONTROL_FD_ENV: str(write_end)}
      affinity = children.cpu_share(process_id, self._num_processes) if self._pin_cpus else None
      process = subprocess.Popen(
        self._in_host(process_id, command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=env,
        pass_fds=(write_end,),
        preexec_fn=functools.partial(children.child_setup, affinity, self._idle_standby),
        start_new_session=True,  # Ctrl-C reaches the launcher alone, which stops its processes in order.
      )
      os.close(write_end)
      self._processes.append(process)
      for target, args in ((self._pump, (process, process_id)), (self._control, (read_end, process_id))):
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

  def _in_host(self, host: int, command: list[str]) -> list[str]:
    """`command` run in emulated host `host` (`ip netns exec` execs it in place: same pid, same fds), or as it is."""
    return self._hosts.command(host, command) if self._hosts else command

  def _cut_links(self) -> None:
    """Schedules the partitions, counted from now (every process trains)."""
    for partition in self._partitions:
      self.say(f'[launch] host {partition.host} cut off in {partition.after_s:g} s for {partition.seconds:g} s.')
      self._hosts.partition(partition.host, partition.seconds, partition.after_s)

  def _watch(self, grace_s: float, random_kill: tuple[float, int] | None) -> None:
    deadline, sampled = None, 0.0
    while any(p.poll() is None for p in self._processes):
      if time.monotonic() - sampled >= _CPU_SAMPLE_S:
        sampled = time.monotonic()
        self._cpu.sample([p.pid for p in self._processes if p.poll() is None])
      going_down = self._scan_exits()
      if going_down and deadline is None:
        deadline = time.monotonic() + grace_s
        self._tell_the_others()
      if random_kill is not None and self._failure is None:
        due, victim = random_kill
        if time.monotonic() >= due and len(self._ready) == self._num_processes:
          self._kill(victim, Failure(victim, 'was killed by SIGKILL (--kill_mtbf_s)', injected=True))
      if deadline is not None and time.monotonic() > deadline:
        for process_id, process in enumerate(self._processes):
          if process.poll() is None:
            if self._failure is None:
              self._fail(Failure(process_id, f'did not stop within {grace_s:g} s of its peers (hung or stopped)'))
            self.say(f'[launch] process {process_id} did not stop within {grace_s:g} s; killing it.')
            process.kill()
      time.sleep(_POLL_S)
    self._scan_exits()  # Processes that all ended between two polls (a crash of every process at its start).
    if self._failure is None and any(p.returncode in _PEER_LOST_CODES for p in self._processes):
      self._fail(self._blamed or Failure(-1, 'every process lost its peers (the coordinator or the network?)'))

  def _scan_exits(self) -> bool:
    """Blames the first process found ended in failure (not a survivor's lost peer); True if the generation is going
    down (a failure, or a survivor that lost its peer)."""
    going_down = self._failure is not None
    for process_id, process in enumerate(self._processes):
      code = process.poll()
      if code in (None, 0):
        continue
      if code in _PEER_LOST_CODES:  # A survivor: the failure is the peer it lost (`_blamed`), not itself.
        going_down = True
      elif self._failure is None:
        self._fail(Failure(process_id, describe_exit(code)), announce=code != exit_codes.USAGE)
        going_down = True
    return going_down

  def _fail(self, failure: Failure, announce: bool = True) -> None:
    with self._lock:
      if self._failure is not None:
        return
      self._failure = failure
    if announce:
      self.say(f'[launch] process {failure.process} {failure.how}.')

  def _kill(self, process_id: int, failure: Failure) -> None:
    self._fail(failure)
    process = self._processes[process_id]
    if process.poll() is None:
      process.send_signal(signal.SIGKILL)

  def _tell_the_others(self) -> None:
    """SIGTERM to every process still running: a peer is gone (`distributed`'s handler: stop at the next step
    boundary, after saving what survives)."""
    for process in self._processes:
      if process.poll() is None:
        try:
          process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
          pass

  def _pump(self, process: subprocess.Popen, process_id: int) -> None:
    """Copies a process's lines with its prefix; a usage error another process printed already is dropped."""
    for line in process.stdout:
      line = line.rstrip('\n')
      if line.startswith(exit_codes.ERROR_PREFIX):
        with self._lock:
          if line in self._printed_errors:
            continue
          self._printed_errors.add(line)
      blamed = _BLAME.search(line)
      if blamed and self._blamed is None:
        self._blamed = Failure(int(blamed.group(1)), blamed.group(2))
      self.say(f'[p{process_id}] {line}')

  def _control(self, read_end: int, process_id: int) -> None:
    """A process's control pipe: `ready` when it trains, `step N` after every step, `kill STEP` at the step it is
    to be killed at."""
    with os.fdopen(read_end) as pipe:
      for line in pipe:
        words = line.split()
        if len(words) == 2 and words[0] == 'step':
          self._steps[process_id] = int(words[1])
        elif words == ['ready']:
          with self._lock:
            self._ready.add(process_id)
            every_process_trains = len(self._ready) == self._num_processes and 'ready' not in self._times
            if every_process_trains:
              self._times['ready'] = time.time()
          if every_process_trains:
            pids = [p.pid for p in self._processes]
            self._cpu.sample(pids)
            self._cpu_at_ready = [self._cpu.mark(pid) for pid in pids]
            self._cut_links()
            if self._on_ready is not None:
              threading.Thread(target=self._on_ready, name='standby', daemon=True).start()
          self._kill_the_waiting_victim()
        elif len(words) == 2 and words[0] == 'kill':
          with self._lock:
            self._kill_waiting = (process_id, int(words[1]))
          self._kill_the_waiting_victim()

  def _kill_the_waiting_victim(self) -> None:
    """A process at its `--kill_at` step waits there to be killed; it is killed once every process trains (a peer
    still starting would otherwise lose it before it could save or write anything down, as `random_kill` waits),
    never before the kills listed before its own (`KillSchedule.is_next`), and never once the job goes down (a peer
    died first): one death a start, each kill in a start of its own, in the order listed."""
    with self._lock:
      if self._kill_waiting is None or len(self._ready) < self._num_processes:
        return
      if self._kill_schedule is not None and not self._kill_schedule.is_next(*self._kill_waiting):
        return  # A kill listed earlier first: this victim waits at its step, a survivor when that one dies.
      if self._failure is not None:  # The job goes down already: the victim stops as a survivor, its kill not fired
        self._kill_waiting = None  # (`control.ControlPipe.reached`); the next start kills it at that step.
        return
      (process_id, step), self._kill_waiting = self._kill_waiting, None
    self._kill(process_id, Failure(process_id, f'was killed by SIGKILL at step {step} (--kill_at)', True, step))
