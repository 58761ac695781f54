"""Real failures on purpose: the launcher SIGKILLs processes of a job, at a step (tests) or at random times (studies).

  schedule = fault_injection.KillSchedule.parse(kill_at='1@40,0@90', mtbf_s=0.0, seed=0, num_processes=2)
  env = schedule.environment(process_id)    # the step that process is to be killed at, if any (`control`)
  schedule.fired(process_id, step)          # it was: the next start of the job does not kill it there again
  for gap_s, process in schedule.random_kills(): ...

A kill at a step is deterministic and still a real kill (`control.ControlPipe.reached`): the process reaches the
step (a checkpoint due there already started: a kill there lands in the save; an incremental one's differential
stays unfinished until the kill), asks for it and waits; the launcher answers with SIGKILL once every process trains
(a peer still starting is never the one to lose it). Each `PROCESS@STEP` fires once, in the order listed, so
`1@40,0@90` kills process 1 at step 40, and process 0 at step 90 after the restart, whichever process is ahead: a
process at its step before the kills listed before its own fired waits there, and goes down as a survivor when the
earlier victim dies; the next start, which it begins at that step, kills it there before it trains
(`control.ControlPipe.due_at_start`). One death a start. (Where the steps are collectives of the job, list the kills
in step order: a process waiting at its step holds its peers' next step.) Random kills are exponential in
wall-clock time with mean `mtbf_s`, each of a process drawn uniformly, from a seeded generator: the same schedule
for every run of a study.

A kill inside a save (tests): with `SHADOWSYNC_KILL_IN_SAVE=STEP:writing` a process SIGKILLs itself while its save
of STEP is being written (a whole save's files started and not complete; a differential's file written, not yet
renamed complete), with `STEP:written` once that save is complete on disk (`kill_in_save`, called by
`recovery.real` inside the checkpointers' writes): a kill that lands where it says, every time.
"""

from collections.abc import Callable
import dataclasses
import os
import signal

import numpy as np

from shadowsync_jax.parallel import control

KILL_IN_SAVE_ENV = 'SHADOWSYNC_KILL_IN_SAVE'


def kills_in_saves() -> bool:
  """Whether this process is to kill itself at a kill point of a save (`kill_in_save`)."""
  return bool(os.environ.get(KILL_IN_SAVE_ENV))


def kill_in_save(step: int, where: str, first: Callable[[], None] | None = None) -> None:
  """A kill point (module docstring): SIGKILLs this process at once where `SHADOWSYNC_KILL_IN_SAVE` names the save
  of `step` and `where` ('writing' or 'written'), after `first()` (what makes it true: waiting for the save)."""
  wanted = os.environ.get(KILL_IN_SAVE_ENV)
  if not wanted or wanted != f'{step}:{where}':
    return
  if first is not None:
    first()
  os.kill(os.getpid(), signal.SIGKILL)


@dataclasses.dataclass
class KillSchedule:
  """Which process dies when: `kill_at` (process, step) pairs not fired yet, and exponential random kills."""

  kill_at: list[tuple[int, int]]
  mtbf_s: float
  seed: int
  num_processes: int

  @classmethod
  def parse(cls, kill_at: str, mtbf_s: float, seed: int, num_processes: int) -> 'KillSchedule':
    """`kill_at`: 'PROCESS@STEP[,PROCESS@STEP...]' or empty."""
    pairs = []
    for item in filter(None, (part.strip() for part in kill_at.split(','))):
      try:
        process, step = (int(x) for x in item.split('@'))
      except ValueError:
        raise ValueError(f'--kill_at={kill_at!r}: expected PROCESS@STEP[,PROCESS@STEP...], e.g. 1@40.') from None
      if not 0 <= process < num_processes or step < 1:
        raise ValueError(
          f'--kill_at={kill_at!r}: process {process} must be below {num_processes} and step {step} at least 1.'
        )
      pairs.append((process, step))
    if mtbf_s < 0:
      raise ValueError(f'--kill_mtbf_s={mtbf_s} must be >= 0 (0: no random kills).')
    return cls(pairs, mtbf_s, seed, num_processes)

  def environment(self, process_id: int) -> dict[str, str]:
    """What process `process_id` of the next start needs to know to be killed at its step: the first kill of it
    not fired yet."""
    steps = [step for process, step in self.kill_at if process == process_id]
    return {control.KILL_AT_STEP_ENV: str(steps[0])} if steps else {}

  def is_next(self, process_id: int, step: int) -> bool:
    """Whether the kill of `process_id` at `step` is the first listed that has not fired: the one the launcher
    fires now (a later one waits at its step until then)."""
    return bool(self.kill_at) and self.kill_at[0] == (process_id, step)

  def fired(self, process_id: int, step: int) -> None:
    if (process_id, step) in self.kill_at:
      self.kill_at.remove((process_id, step))

  def random_kills(self):
    """An endless iterator of (seconds after the previous kill or the job's start, process) pairs."""
    if not self.mtbf_s:
      return iter(())
    rng = np.random.default_rng([self.seed, 0x4B111])

    def draws():
      while True:
        yield float(rng.exponential(self.mtbf_s)), int(rng.integers(self.num_processes))

    return draws()
