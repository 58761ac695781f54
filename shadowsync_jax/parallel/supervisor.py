"""A job that survives its processes: generations of it until it succeeds, at most `max_restarts` restarts.

  code = supervisor.supervise(train_args, num_processes=2, cpu_devices=4, peer_timeout_s=30, grace_s=60,
                              pin_cpus=False, max_restarts=3, kill_schedule=schedule)

Each generation (`launcher.Generation`) is a fresh start of every process: each calls `jax.distributed.initialize`
anew (collectives cannot be formed again among the survivors of a gloo job), then restores what the restart plan
gives it (`recovery.real`: full or partial recovery, as `recovery.mode` says). With `warm_standby` (the default)
the next generation is prepared as soon as every process of the current one trains: its coordinator serves on a
port of its own and its processes have imported everything and wait, so a restart costs what is left (joining
the job, building and restoring the state, the first step from the compilation cache). The supervisor restarts the job
whatever the failure was (a kill, a crash, a hang; torchelastic's rule), except a refused config (exit status 2,
nothing would change) and a process that cannot restore what its restart needs (3: a checkpoint the job wrote is
missing or unreadable); after `max_restarts` restarts it fails, naming every failure. It writes each failure into
the job's history (`history`, in the workdir found in `train_args`), for summary.json and the studies.

The contract without this supervisor (a cluster's restart loop, BUILD.md): a process exits 0 when the job is done,
`exit_codes.PEER_LOST` (75) when a peer is gone (it saved what it must: restart the job), `exit_codes.USAGE` (2)
for a refused config and `exit_codes.UNRECOVERABLE` (3) for a checkpoint gone (do not restart), anything else
when it failed itself (restart, up to a limit).
"""

import sys
import time

from shadowsync_jax.parallel import children
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
  warm_standby: bool = True,
) -> int:
  """Runs the job to success or to `max_restarts` restarts; returns 0, or the exit status of the last failure."""
  workdir = next((arg.split('=', 1)[1] for arg in train_args if arg.startswith('--workdir=')), None)
  random_kills = kill_schedule.random_kills() if kill_schedule else iter(())
  next_kill = _next_kill(random_kills, 0.0)
  failures: list[str] = []
  clock = 0.0  # Seconds of the job so far, over its generations (random kills fall on it).

  def generation_number(number: int) -> launcher.Generation:
    return launcher.Generation(
      train_args,
      num_processes,
      cpu_devices,
      peer_timeout_s,
      pin_cpus,
      launcher.free_port(),  # Each its own coordinator: the next one starts while this one serves.
      number,
      kill_schedule,
      module,
      out,
      hosts,
      partitions if number == 0 else (),
    )

  standby = generation_number(0)
  for number in range(max_restarts + 1):
    generation, standby = standby, None
    if number < max_restarts:
      standby = generation_number(number + 1)
    if number:
      generation.say(f'[launch] restart {number} of at most {max_restarts}: every process starts again.')
    random_kill = None
    if next_kill is not None:
      random_kill = (time.monotonic() + max(0.0, next_kill[0] - clock), next_kill[1])
    try:
      outcome = generation.run(grace_s, random_kill, on_ready=standby.prepare if standby and warm_standby else None)
    except BaseException:
      if standby is not None:
        standby.abandon()
      raise
    # The next start's warm standby ran beside this one on its cores, needed or not.
    standby_cpu_s = standby.cpu_s() if standby is not None else []
    if standby is not None and (outcome.succeeded or outcome.refused or outcome.unrecoverable is not None):
      standby.abandon()
    clock += outcome.seconds
    if workdir is not None:
      record = {'event': 'generation', 'generation': number, **outcome.times}
      record.update(cpu_while_training=outcome.cpu_while_training, standby_beside_cpu_s=standby_cpu_s)
      record.update(standby_waited_idle=children.standby_waits_idle())
      history.append(workdir, 'launcher', record)
    if outcome.succeeded:
      restarted = f' after {number} restart{"s" if number != 1 else ""}' if number else ''
      generation.say(f'[launch] all {num_processes} processes succeeded{restarted}.')
      return 0
    if outcome.refused:
      generation.say('[launch] every process refused the configuration (the error above); nothing was trained.')
      return exit_codes.USAGE
    if outcome.unrecoverable is not None:
      generation.say(
        f'[launch] FAILED: process {outcome.unrecoverable} cannot restore what its restart needs (the error above); '
        'a restart would find the same, so there is none.'
      )
      return exit_codes.UNRECOVERABLE
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
