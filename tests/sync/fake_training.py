"""A fake training loop for the sync-driver tests: integer params and a step that adds a known delta to each.

  params, delta = fake_training.initial(num_replicas)     # numpy, leading replica axis
  state = replicas.shard(fake_training.FakeState(params, np.zeros(R, np.int32)), mesh)
  state = fake_training.step(state, delta_R)              # replica r gains r + 1 everywhere, exactly
  block = fake_training.block_program(mesh, driver.between_steps())   # the same step, a driver's rounds fused in

With exact integer arithmetic the params at every step boundary are known, so a merge can be checked exactly.
"""

from typing import Any, NamedTuple

import jax
import numpy as np

from shadowsync_jax import hooks
from shadowsync_jax.parallel import replicas


class FakeState(NamedTuple):
  """What the drivers read of train.py's state: `params` {'mlp', 'embedding'} and `step` [R]."""

  params: dict[str, Any]
  step: jax.Array


def initial(num_replicas: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """Integer params, distinct per replica at every step, and the delta a fake step adds (replica r: r + 1)."""
  r_R = np.arange(num_replicas, dtype=np.float32)
  params = {
    'mlp': {'kernel': 10 * r_R[:, None, None] + np.arange(6, dtype=np.float32).reshape(1, 3, 2)},
    'embedding': 3 * r_R[:, None, None] ** 2 + np.arange(10, dtype=np.float32).reshape(1, 5, 2),
  }
  delta = jax.tree.map(lambda x: np.broadcast_to((r_R + 1).reshape(-1, *[1] * (x.ndim - 1)), x.shape).copy(), params)
  return params, delta


def _step(state: FakeState, delta_R) -> FakeState:
  return FakeState(params=jax.tree.map(lambda w, d: w + d, state.params, delta_R), step=state.step + 1)


step = jax.jit(_step)
donating_step = jax.jit(_step, donate_argnums=0)  # Donates its params, as the real train step does.


def block_program(mesh, between: replicas.Between) -> replicas.BlockProgram:
  """`block(state_R, deltas_RxK, steps_R, carry_R) -> (state_R, metrics_RxK, carry_R)`: the fake step as the
  training loop's block program runs it (`replicas.make_replicated_block`), a sync driver's rounds fused in."""

  def step_fn(state: FakeState, delta) -> tuple[FakeState, dict[str, jax.Array]]:
    state = _step(state, delta)
    return state, {'step': state.step}

  return replicas.make_replicated_block(step_fn, mesh, between)


def at_boundary(driver, step: int, state: Any, steps: int = 1) -> Any:
  """A driver's `at_boundary` after a block of `steps` that ends at `step`, as the loop calls it; the train state
  after it (a foreground round due there)."""
  b = hooks.Boundary(step, state, driver, steps=steps)
  driver.at_boundary(b)
  return b.state
