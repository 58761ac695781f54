"""The pipe from a training process to its launcher: that it trains, how far it got, and a kill it asks for.

  pipe = control.ControlPipe.from_environment()   # a no-op where no launcher gave one
  pipe.ready()              # once it trains (random kills wait for every process to)
  pipe.step(step)           # every step: the launcher knows exactly where a process was when it died
  pipe.reached(step)        # at the step the launcher was asked to kill it at: asks for SIGKILL, waits for it
  pipe.due_at_start(step)   # a start that begins at that step (it waited there when its job went down)

The launcher (`launcher.Generation`) reads one pipe per process. A step is a few bytes written without blocking
(a launcher that falls behind loses lines, it never slows training down), so the position of a process that was
killed is known to the step: a partial recovery skips exactly the steps its replicas trained but lost, no more,
no fewer. A kill at a step is deterministic and still a real kill: the process writes `kill STEP` and waits; the
launcher answers with SIGKILL, so nothing of the process's own runs after it (no exit handler, no flush, orbax's
background write dies mid-file).
"""

from collections.abc import Callable
import dataclasses
import os
import time

KILL_AT_STEP_ENV = 'SHADOWSYNC_KILL_AT_STEP'
CONTROL_FD_ENV = 'SHADOWSYNC_CONTROL_FD'
GENERATION_ENV = 'SHADOWSYNC_GENERATION'  # How many times the job was started before this start (0: the first).


def generation() -> int:
  """This start's number, as whoever started the job said (0 where nobody did)."""
  return int(os.environ.get(GENERATION_ENV, '0'))


@dataclasses.dataclass
class ControlPipe:
  """The training process's end (module docstring)."""

  fd: int | None
  kill_at_step: int | None

  @classmethod
  def from_environment(cls) -> 'ControlPipe':
    fd, step = os.environ.get(CONTROL_FD_ENV), os.environ.get(KILL_AT_STEP_ENV)
    pipe = cls(int(fd) if fd else None, int(step) if step else None)
    if pipe.fd is not None:
      os.set_blocking(pipe.fd, False)
    return pipe

  def ready(self) -> None:
    """Once, at the first step boundary: never lost (a `--kill_at` victim waits for every peer's)."""
    if self.fd is not None:
      os.set_blocking(self.fd, True)
      self._write(b'ready\n')
      os.set_blocking(self.fd, False)

  def step(self, step: int) -> None:
    self._write(b'step %d\n' % step)

  def reached(self, step: int, stop_waiting: Callable[[], bool] = lambda: False) -> None:
    """At the kill step: tells the launcher and waits to be killed. Returns where no launcher listens, or once
    `stop_waiting()` (a peer was lost while it waited: the launcher kills nobody in a job already going down, and this
    process goes on as a survivor; its kill stays for the next start, `due_at_start`)."""
    if self.fd is None or step != self.kill_at_step:
      return
    os.set_blocking(self.fd, True)
    os.write(self.fd, f'kill {step}\n'.encode())
    os.set_blocking(self.fd, False)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
      if stop_waiting():
        return
      time.sleep(0.02)
    raise RuntimeError(f'asked to be killed at step {step}, but nobody did in 600 s.')

  def due_at_start(self, position: int) -> bool:
    """Whether this start begins at the step it is to be killed at: a survivor that was waiting there for its kill
    when its job went down (`reached`) reached it before this start, so the kill lands before it trains on."""
    return self.fd is not None and position == self.kill_at_step

  def _write(self, line: bytes) -> None:
    if self.fd is None:
      return
    try:
      os.write(self.fd, line)
    except (BlockingIOError, BrokenPipeError):  # A launcher behind (or gone) loses a line, never the step.
      pass
