"""Who a process is in its job, as the parts of real-failure recovery (`real`) see it.

  process = job_process.JobProcess.here(config, meshes, workdir, total_steps)
  process.index, process.count, process.generation, process.writer, process.lock_step, process.control

Its index among `count` processes, the start of the job it is in (`generation`: 0, then one more for each restart the
launcher made), the name it writes the job's history under (`writer`), whether the processes step together (a
collective every step or every k: they restore a common cut after a restart), and its pipe to the launcher.
"""

import dataclasses
import pathlib
from typing import Any

import jax
import ml_collections

from shadowsync_jax.parallel import control
from shadowsync_jax.parallel import replicas

PyTree = Any


@dataclasses.dataclass(frozen=True)
class JobProcess:
  """This process of the job, its run's settings and where the run writes (module docstring)."""

  config: ml_collections.ConfigDict
  meshes: replicas.ReplicaMeshes
  workdir: pathlib.Path
  total_steps: int
  index: int
  count: int
  generation: int
  lock_step: bool
  control: control.ControlPipe

  @classmethod
  def here(
    cls,
    config: ml_collections.ConfigDict,
    meshes: replicas.ReplicaMeshes,
    workdir: str | pathlib.Path,
    total_steps: int,
  ) -> 'JobProcess':
    algorithm, sharded = config.sync.algorithm, config.sync.embedding_placement == 'sharded'
    return cls(
      config,
      meshes,
      pathlib.Path(workdir),
      total_steps,
      jax.process_index(),
      jax.process_count(),
      control.generation(),
      lock_step=algorithm == 'sync_sgd' or algorithm.startswith('fr_') or sharded,
      control=control.ControlPipe.from_environment(),
    )

  @property
  def writer(self) -> str:
    """The name its records in the job's history go under (`parallel.history`)."""
    return f'process_{self.index}'

  def local(self, sync_state_R: PyTree) -> PyTree:
    """This process's copies of the job-wide sync state (what its checkpoints hold)."""
    return None if sync_state_R is None else replicas.to_local(sync_state_R, self.meshes)
