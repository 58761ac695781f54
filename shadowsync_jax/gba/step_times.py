"""Emulated worker step times for GBA in one process: when each worker's every step ends, and which steps fail.

times = step_times.WorkerStepTimes.sample(config.gba, num_workers=R, num_steps=K, seed=config.seed)
times.seconds_RxK[r, k]; times.fails_RxK[r, k]; times.sync_time_s(0, K)   # what sync SGD would wait, step by step
"""

from typing import NamedTuple

import ml_collections
import numpy as np


class WorkerStepTimes(NamedTuple):
  """Emulated seconds of every worker's every local step, and which steps fail (the worker dies mid-step: its
  token is lost, its gradient never arrives). Deterministic in the seed: sync SGD's emulated time is read from the
  same draws as GBA's, so the two face the same stragglers."""

  seconds_RxK: np.ndarray  # float64 [R, K]
  fails_RxK: np.ndarray  # bool [R, K]

  @classmethod
  def sample(
    cls, gba_config: ml_collections.ConfigDict, num_workers: int, num_steps: int, seed: int
  ) -> 'WorkerStepTimes':
    """Lognormal jitter of mean `step_time_s` (sigma `step_time_jitter`); with probability `straggler_prob` a step
    is `straggler_slowdown` times slower (a transient straggler: a worker on a busy machine); with probability
    `failure_prob` it fails."""
    rng = np.random.default_rng([seed, 0x6BA])
    sigma = gba_config.step_time_jitter
    jitter_RxK = np.exp(sigma * rng.standard_normal((num_workers, num_steps)) - sigma**2 / 2)
    slow_RxK = rng.random((num_workers, num_steps)) < gba_config.straggler_prob
    seconds_RxK = gba_config.step_time_s * jitter_RxK * np.where(slow_RxK, gba_config.straggler_slowdown, 1.0)
    fails_RxK = rng.random((num_workers, num_steps)) < gba_config.failure_prob
    return cls(seconds_RxK, fails_RxK)

  def sync_time_s(self, first_step: int, last_step: int) -> float:
    """Emulated seconds of sync SGD over local steps [first_step, last_step): every global step waits for its
    slowest worker (failures not counted: sync SGD has no answer to them but a restart)."""
    return float(self.seconds_RxK[:, first_step:last_step].max(axis=0, initial=0.0).sum())
