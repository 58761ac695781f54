"""The metric stream's writes during training, a hook of the training loop (`hooks`): train loss, examples/sec,
replica divergence and the sync driver's statistics, read from the device one block late."""

import time
from typing import Any

import jax
import numpy as np

from shadowsync_jax import hooks
from shadowsync_jax.metrics import writer as metric_writer
from shadowsync_jax.parallel import replicas

# A write's replica divergence reads every replicated param: a write by seconds carries it no more often than costs
# this share of the time between (8 replicas of Criteo Kaggle's 2.3 GB of tables: about 3 s a divergence on 2 cores,
# which written every second held the job to a seventh of its pace). Writes at the steps asked for carry it all.
DIVERGENCE_SHARE = 0.02


class MetricLog(hooks.Hook):
  """The metric stream's writes (train loss, examples/sec, replica divergence, the driver's statistics) every
  `every_steps` steps (`train.log_every_steps`) (a block ends there) or `every_s` seconds (at the first boundary after);
  the divergence with every write by steps, and with those by seconds no more often than its cost allows
  (`DIVERGENCE_SHARE`, timed in `prepare`).
  The blocks' losses stay on the device, and a write reads them one block late, at the next boundary, when the next
  block is already dispatched (docs/design.md §13: nothing read back inside a block, no bubble in the device's
  queue)."""

  def __init__(
    self,
    writer: metric_writer.MetricWriter,
    every_steps: int,
    every_s: float,
    examples_per_step: int,
    tables_sharded: bool,
  ):
    self._writer, self._examples_per_step, self._tables_sharded = writer, examples_per_step, tables_sharded
    self._every_steps, self._every_s = every_steps, every_s
    self._losses: list[tuple[jax.Array, int]] = []  # Each block's [L, K] losses and how many of its steps ran.
    self._pending: tuple[int, list[tuple[jax.Array, int]], float, jax.Array | None, dict[str, Any]] | None = None
    self._blocks = 0
    self._start = time.perf_counter()
    self._divergence_every_s, self._last_divergence = 0.0, 0.0

  def prepare(self, params: Any, first_step: int, stop_step: int) -> None:
    """Before the steps (not among the timed ones), where writes will come: compiles the replica divergence and
    times one, which sets how often writes carry it."""
    if not (bool(self._every_s) or stop_step // self._every_steps > first_step // self._every_steps):
      return
    replicated = replicated_part(params, self._tables_sharded)
    replicas.replica_divergence.lower(replicated).compile()
    started = time.perf_counter()
    jax.block_until_ready(replicas.replica_divergence(replicated))
    self._divergence_every_s = (time.perf_counter() - started) / DIVERGENCE_SHARE

  def next_due(self, step: int) -> int:
    return (step // self._every_steps + 1) * self._every_steps

  def at_boundary(self, b: hooks.Boundary) -> None:
    step, state, steps, metrics, driver = b.step, b.state, b.steps, b.metrics, b.driver
    self.flush()  # The write due at the last boundary: that block is done, or nearly.
    self._blocks += 1
    now = time.perf_counter()
    if self._blocks == 1:  # The first block compiled: the window starts after it (and the divergence's pace).
      self._start = self._last_divergence = now
      return
    self._losses.append((metrics['loss'], steps))
    by_steps = step % self._every_steps == 0
    if not by_steps and not (self._every_s and now - self._start >= self._every_s):
      return
    divergence = None
    if by_steps or now - self._last_divergence >= self._divergence_every_s:  # The steps asked for carry it all.
      # This process's replicas only: a job-wide figure would need a collective beside the shadow thread's.
      divergence = replicas.replica_divergence(
        replicated_part(state.params, self._tables_sharded)
      )  # Dispatched, not read.
      self._last_divergence = now
    stats = {k: v for k, v in driver.stats().items() if v is not None}
    self._pending = (step, self._losses, now - self._start, divergence, stats)
    self._losses, self._start = [], now

  def end(self, b: hooks.Boundary) -> None:
    self.flush()

  def flush(self) -> None:
    """Writes the pending write, reading its values from the device."""
    if self._pending is None:
      return
    step, losses, seconds, divergence, stats = self._pending
    self._pending = None
    steps = sum(n for _, n in losses)
    loss_sum = sum(float(np.asarray(losses_LxK)[:, :n].mean(axis=0).sum()) for losses_LxK, n in losses)
    self._writer.write_scalars(
      step,
      {
        'train_loss': loss_sum / steps,
        'examples_per_sec': steps * self._examples_per_step / seconds,
        **({} if divergence is None else {'replica_divergence': float(divergence)}),
        **stats,
      },
    )


def replicated_part(params_L: Any, tables_sharded: bool) -> Any:
  """The params the replicas hold each a copy of: a sharded table is one table, not R copies."""
  return {'mlp': params_L['mlp']} if tables_sharded else params_L
