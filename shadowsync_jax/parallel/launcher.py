"""Starts a job of N processes on this machine (127.0.0.1), streams their output, and fails if any of them fails.

  code = launcher.launch(['--workdir=/tmp/job', '--config.num_replicas=8', '--config.sync.algorithm=shadow_ma'],
                         num_processes=2, cpu_devices=4, peer_timeout_s=30, grace_s=60, pin_cpus=False)

`experiments.launch` is its command line. `train_args` go to every `python -m experiments.train` process, which
also gets the coordinator address (a free port on 127.0.0.1), `--num_processes` and its `--process_id`; each
process gets `cpu_devices` virtual CPU devices (so `--config.num_replicas` counts the replicas of the whole job).
Output lines are prefixed `[p0]`, `[p1]`, .... When a process fails (non-zero exit or a signal), the launcher says
which and how, gives the others `grace_s` to stop on their own (they notice a dead peer within their
`peer_timeout_s`), then kills what is left; its exit code is that of the first failure (128 + signal for a signal),
0 when all succeed. A config every process refuses (one line `error: ...`, exit status 2: `exit_codes`) is printed once,
however many processes print it, and the launcher exits with status 2.

`pin_cpus` gives each process its own share of this machine's cores (`sched_setaffinity`), so that processes
behave like separate hosts, e.g. for the straggler benchmark. On several real hosts, run `experiments.train`
directly on each (BUILD.md).
"""

import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from shadowsync_jax.parallel import exit_codes

_PR_SET_PDEATHSIG = 1  # prctl option: the signal a child gets when its parent dies.


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]


def describe_exit(code: int) -> str:
  if code < 0:
    return f'was killed by {signal.Signals(-code).name}'
  return f'exited with code {code}'


def cpu_share(process_id: int, num_processes: int) -> set[int]:
  """The cores of process `process_id` when the machine's cores are dealt out evenly (round robin if fewer)."""
  cores = sorted(os.sched_getaffinity(0))
  if num_processes >= len(cores):
    return {cores[process_id % len(cores)]}
  return set(cores[process_id::num_processes])


def launch(
  train_args: list[str],
  num_processes: int,
  cpu_devices: int,
  peer_timeout_s: float,
  grace_s: float,
  pin_cpus: bool,
  module: str = 'experiments.train',
  out=sys.stdout,
) -> int:
  """Runs the job; returns 0 if every process succeeded, else the exit status of the first that failed."""
  address = f'127.0.0.1:{free_port()}'
  processes, pumps = [], []
  lock, printed_errors = threading.Lock(), set()
  for process_id in range(num_processes):
    command = [
      sys.executable,
      '-u',
      '-m',
      module,
      f'--coordinator_address={address}',
      f'--num_processes={num_processes}',
      f'--process_id={process_id}',
      f'--cpu_devices={cpu_devices}',
      f'--peer_timeout_s={peer_timeout_s}',
      *train_args,
    ]
    affinity = cpu_share(process_id, num_processes) if pin_cpus else None
    process = subprocess.Popen(
      command,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      bufsize=1,
      preexec_fn=functools.partial(_child_setup, affinity),
    )
    processes.append(process)
    pump = threading.Thread(target=_pump, args=(process, f'[p{process_id}] ', out, lock, printed_errors), daemon=True)
    pump.start()
    pumps.append(pump)

  first_failure, deadline = None, None
  while any(p.poll() is None for p in processes):
    for process_id, process in enumerate(processes):
      code = process.poll()
      if code not in (None, 0) and first_failure is None:
        first_failure = (process_id, code)
        deadline = time.monotonic() + grace_s
        if code != exit_codes.USAGE:  # A refused config said so itself, in one line.
          _say(
            out,
            lock,
            f'[launch] process {process_id} {describe_exit(code)}; waiting up to {grace_s:g} s for the others to stop.',
          )
    if deadline is not None and time.monotonic() > deadline:
      for process_id, process in enumerate(processes):
        if process.poll() is None:
          _say(out, lock, f'[launch] process {process_id} did not stop within {grace_s:g} s; killing it.')
          process.kill()
    time.sleep(0.1)
  for pump in pumps:
    pump.join()

  codes = [p.returncode for p in processes]
  if all(code == exit_codes.USAGE for code in codes):
    _say(out, lock, '[launch] every process refused the configuration (the error above); nothing was trained.')
    return exit_codes.USAGE
  if first_failure is None:
    first_failure = next(((i, c) for i, c in enumerate(codes) if c != 0), None)
  if first_failure is None:
    _say(out, lock, f'[launch] all {num_processes} processes succeeded.')
    return 0
  report = ', '.join(f'process {i} {describe_exit(c)}' for i, c in enumerate(codes))
  _say(
    out,
    lock,
    f'[launch] FAILED: process {first_failure[0]} failed first ({describe_exit(first_failure[1])}). {report}.',
  )
  code = first_failure[1]
  return 128 - code if code < 0 else code


def _child_setup(affinity: set[int] | None) -> None:
  """In each child before it runs: die with the launcher (Linux), and take its share of the cores if pinned."""
  try:
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:  # Not Linux: children outlive a killed launcher there.
    pass
  if affinity:
    os.sched_setaffinity(0, affinity)


def _pump(process: subprocess.Popen, prefix: str, out, lock: threading.Lock, printed_errors: set[str]) -> None:
  """Copies a process's lines to `out` with its prefix; a usage error another process printed already is dropped."""
  for line in process.stdout:
    line = line.rstrip('\n')
    if line.startswith(exit_codes.ERROR_PREFIX):
      with lock:
        if line in printed_errors:
          continue
        printed_errors.add(line)
    _say(out, lock, prefix + line)


def _say(out, lock: threading.Lock, line: str) -> None:
  with lock:
    print(line, file=out, flush=True)
