"""A job that survives its processes: generations of it until it succeeds, at most `max_restarts` restarts.

  code = supervisor.supervise(train_args, num_processes=2, cpu_devices=4, peer_timeout_s=30, grace_s=60,
                              pin_cpus=False, max_restarts=3, kill_schedule=schedule)

Each generation (`launcher.Generation`) is a fresh start of every process: each calls `jax.distributed.initialize`
anew (collectives cannot be formed again among the survivors of a gloo job), then restores what the restart plan
gives it (`recovery.real`: full or partial recovery, as `recovery.mode` says). The supervisor restarts the job
whatever the failure was (a kill, a crash, a hang; torchelastic's rule), except a refused config (exit status 2,
nothing would change); after `max_restarts` restarts it fails, naming every failure. It writes each failure into
the job's history (`history`, in the workdir found in `train_args`), for summary.json and the studies.

The contract without this supervisor (a cluster's restart loop, BUILD.md): a process exits 0 when the job is done,
`exit_codes.PEER_LOST` (75) when a peer is gone (it saved what it must: restart the job), `exit_codes.USAGE` (2)
for a refused config (do not restart), anything else when it failed itself (restart, up to a limit).
"""

import sys
import time

from shadowsync_jax.parallel import exit_codes
from shadowsync_jax.parallel import fault_injection
from shadowsync_jax.parallel import history
from shadowsync_jax.parallel import launcher
from shadowsync_jax.parallel import netns

# Virtual CPU devices per process unless told otherwise (experiments.launch --cpu_devices). More devices than the
# replicas a process holds keep background rounds cheap on CPU: with a single device a round's collective program
# holds the training steps up (2 processes pinned to a core each, shadow_ma on the default problem: a round cost the
# trainers 0.14 s with 1 device, 0.014 s with 2; it takes 1 ms once training has stopped).
DEFAULT_CPU_DEVICES = 4


def supervise(
  train_args: list[str],
  num_processes: int,
  cpu_devices: int,
  peer_timeout_s: float,
  grace_s: float,
  pin_cpus: bool,
  max_restarts: int = 0,
  kill_schedule: fault_injection.KillSchedule | None = None,
  module: str = 'experiments.train',
  out=sys.stdout,
  hosts: netns.EmulatedHosts | None = None,
  partitions: tuple[netns.Partition, ...] = (),
) -> int:
  """Runs the job to success or to `max_restarts` restarts; returns 0, or the exit status of the last failure."""
  workdir = next((arg.split('=', 1)[1] for arg in train_args if arg.startswith('--workdir=')), None)
  port = launcher.free_port()  # One address for every generation: the processes of each meet there.
  random_kills = kill_schedule.random_kills() if kill_schedule else iter(())
  next_kill = _next_kill(random_kills, 0.0)
  failures: list[str] = []
  clock = 0.0  # Seconds of the job so far, over its generations (random kills fall on it).
  for number in range(max_restarts + 1):
    generation = launcher.Generation(
      train_args,
      num_processes,
      cpu_devices,
      peer_timeout_s,
      pin_cpus,
      port,
      number,
      kill_schedule,
      module,
      out,
      hosts,
      partitions if number == 0 else (),
    )
    if number:
      generation.say(f'[launch] restart {number} of at most {max_restarts}: every process starts again.')
    random_kill = None
    if next_kill is not None:
      random_kill = (time.monotonic() + max(0.0, next_kill[0] - clock), next_kill[1])
    outcome = generation.run(grace_s, random_kill)
    clock += outcome.seconds
    if workdir is not None:
      history.append(workdir, 'launcher', {'event': 'generation', 'generation': number, **outcome.times})
    if outcome.succeeded:
      restarted = f' after {number} restart{"s" if number != 1 else ""}' if number else ''
      generation.say(f'[launch] all {num_processes} processes succeeded{restarted}.')
      return 0
    if outcome.refused:
      generation.say('[launch] every process refused the configuration (the error above); nothing was trained.')
      return exit_codes.USAGE
    failure = outcome.failure
    failures.append(f'generation {number}: process {failure.process} {failure.how}')
    if workdir is not None:
      # Where each process was when the generation ended: a partial recovery goes on from there.
      history.append(workdir, 'launcher', {'event': 'positions', 'generation': number, 'steps': outcome.steps})
      history.append(
        workdir,
        'launcher',
        {
          'event': 'failure',
          'generation': number,
          'process': failure.process,
          'how': failure.how,
          'injected': failure.injected,
          'step': failure.step,
          'failed_at': failure.time,
          'codes': outcome.codes,
          'generation_s': outcome.seconds,
        },
      )
    if kill_schedule is not None and failure.injected and failure.step is not None:
      kill_schedule.fired(failure.process, failure.step)
    if next_kill is not None and failure.injected and failure.step is None:
      next_kill = _next_kill(random_kills, clock)
  report = '; '.join(failures)
  generation.say(
    f'[launch] FAILED: the job failed {len(failures)} time{"s" if len(failures) != 1 else ""} and '
    f'--max_restarts={max_restarts} allows no more restarts: {report}.'
  )
  code = outcome.codes[failure.process] if failure.process >= 0 else next(c for c in outcome.codes if c)
  return 128 - code if code < 0 else code


def _next_kill(random_kills, after_s: float) -> tuple[float, int] | None:
  """The next random kill as (job seconds, process), `after_s` plus an exponential gap; None without any."""
  drawn = next(random_kills, None)
  return None if drawn is None else (after_s + drawn[0], drawn[1])
