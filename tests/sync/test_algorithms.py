"""Sync rounds (docs/design.md §3) on 4 and 8 replicas against numpy references of the formulas, over several rounds."""

import operator

import jax
import numpy as np
import pytest

from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms as sa

ROUNDS = 4
SHAPES = {'bias': (7,), 'dense': {'kernel': (3, 5)}}  # two leaves of different shapes, nested


def _random_R(rng, num_replicas, scale=1.0):
  """A float64 pytree with a leading replica axis; replica r's entries have scale `scale * (1 + r)`."""
  scale_R = scale * (1.0 + np.arange(num_replicas))
  leaf = lambda shape: rng.standard_normal((num_replicas, *shape)) * scale_R.reshape(-1, *[1] * len(shape))
  return jax.tree.map(leaf, SHAPES, is_leaf=lambda x: isinstance(x, tuple))


def _to_device(tree_R, mesh):
  return replicas.shard(jax.tree.map(lambda x: x.astype(np.float32), tree_R), mesh)


def _assert_close(got_R, want_R, what):
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5, err_msg=what), got_R, want_R
  )


def _mean_R(tree_R):
  """The replica mean, broadcast back to every replica (what each replica holds after a pmean)."""
  return jax.tree.map(lambda x: np.broadcast_to(x.mean(axis=0), x.shape), tree_R)


def _run_rounds(algorithm, num_replicas, ref_init, ref_sync, seed=0):
  """Runs `algorithm` and a numpy reference side by side; local training is emulated by per-replica noise.

  Yields (round, params_R, state_R, ref_params_R, ref_state) after every round.
  """
  rng = np.random.default_rng(seed)
  mesh = replicas.make_mesh(num_replicas)
  init_R, sync_R = sa.stacked(algorithm, mesh)
  ref_params = _random_R(rng, num_replicas)
  params_R = _to_device(ref_params, mesh)
  state_R = init_R(params_R)
  ref_state = ref_init(ref_params)
  for round_ in range(ROUNDS):
    local_steps = _random_R(rng, num_replicas, scale=0.1)
    ref_params = jax.tree.map(np.add, ref_params, local_steps)
    params_R = jax.tree.map(operator.add, params_R, _to_device(local_steps, mesh))
    ref_params, ref_state = ref_sync(ref_params, ref_state)
    params_R, state_R = sync_R(params_R, state_R)
    yield round_, params_R, state_R, ref_params, ref_state


@pytest.mark.parametrize('num_replicas', [4, 8])
def test_model_averaging_matches_reference(num_replicas):
  algorithm = sa.make('ma', replicas.REPLICA_AXIS, num_replicas, 0.1, -1.0, 1.0)
  ref_sync = lambda w, state: (_mean_R(w), state)
  for round_, params_R, _, ref_params, _ in _run_rounds(algorithm, num_replicas, lambda w: None, ref_sync):
    _assert_close(params_R, ref_params, f'ma params, round {round_}')


@pytest.mark.parametrize('num_replicas', [4, 8])
def test_elastic_averaging_matches_reference(num_replicas):
  """EASGD (Zhang et al. 2015): replicas and the center, on every replica, each round."""
  alpha = 0.9 / (num_replicas + 1)  # a strong pull, so a wrong sign or a mean for a sum shows

  def ref_sync(w_R, c):
    d_R = jax.tree.map(lambda w, c: alpha * (w - c), w_R, c)
    return jax.tree.map(np.subtract, w_R, d_R), jax.tree.map(lambda c, d: c + d.sum(axis=0), c, d_R)

  ref_init = lambda w_R: jax.tree.map(lambda x: x.mean(axis=0), w_R)
  algorithm = sa.make('ea', replicas.REPLICA_AXIS, num_replicas, alpha, -1.0, 1.0)
  for round_, params_R, state_R, ref_params, ref_center in _run_rounds(algorithm, num_replicas, ref_init, ref_sync):
    _assert_close(params_R, ref_params, f'ea params, round {round_}')
    center_R = jax.tree.map(lambda c: np.broadcast_to(c, (num_replicas, *c.shape)), ref_center)
    _assert_close(state_R.center, center_R, f'ea center on every replica, round {round_}')


def test_model_averaging_keeps_each_leafs_dtype_and_shape():
  """The round all-reduces one flat vector per dtype; every leaf must come back whole, in its own dtype."""
  num_replicas = 4
  mesh = replicas.make_mesh(num_replicas)
  rng = np.random.default_rng(3)
  tree_R = {
    'kernel': rng.standard_normal((num_replicas, 3, 5)).astype(np.float32),
    'scale': rng.standard_normal((num_replicas, 4)).astype(jax.numpy.bfloat16),
    'bias': rng.standard_normal((num_replicas, 7)).astype(np.float32),
  }
  _, sync_R = sa.stacked(sa.make('ma', replicas.REPLICA_AXIS, num_replicas, 0.1, -1.0, 1.0), mesh)
  got_R, _ = sync_R(replicas.shard(tree_R, mesh), sa.ModelAveragingState())
  for name, leaf_R in tree_R.items():
    assert got_R[name].dtype == leaf_R.dtype and got_R[name].shape == leaf_R.shape, name
    want = np.broadcast_to(leaf_R.astype(np.float32).mean(axis=0), leaf_R.shape)
    np.testing.assert_allclose(np.asarray(got_R[name], np.float32), want, rtol=2e-2, atol=2e-2, err_msg=name)


def test_elastic_averaging_round_conserves_sum_of_replicas_and_center():
  """A round only moves weight between replicas and center: sum_i w_i + c is what it conserves."""
  num_replicas, alpha = 4, 0.2
  rng = np.random.default_rng(1)
  mesh = replicas.make_mesh(num_replicas)
  init_R, sync_R = sa.stacked(sa.elastic_averaging(replicas.REPLICA_AXIS, alpha), mesh)
  params_R = _to_device(_random_R(rng, num_replicas), mesh)
  state_R = init_R(params_R)
  params_R = jax.tree.map(operator.add, params_R, _to_device(_random_R(rng, num_replicas), mesh))  # move off the center
  total = lambda w_R, c_R: jax.tree.map(lambda w, c: np.asarray(w).sum(0) + np.asarray(c)[0], w_R, c_R)
  before = total(params_R, state_R.center)
  new_params_R, new_state_R = sync_R(params_R, state_R)
  _assert_close(total(new_params_R, new_state_R.center), before, 'sum_i w_i + c')
  moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(), new_params_R, params_R)
  assert min(jax.tree.leaves(moved)) > 1e-2, 'the round left the replicas where they were'


@pytest.mark.parametrize('num_replicas', [2, 8])
def test_default_elastic_alpha_closes_nine_tenths_of_the_gap_to_the_center(num_replicas):
  """`elastic_alpha < 0` (the config's default): one round leaves a tenth of the gap between the replica mean and the
  center, with 2 replicas as with 8; alpha * R stays below 1."""
  assert sa.default_elastic_alpha(8) == pytest.approx(0.1) and sa.default_elastic_alpha(2) == pytest.approx(0.3)
  rng = np.random.default_rng(2)
  mesh = replicas.make_mesh(num_replicas)
  init_R, sync_R = sa.stacked(sa.make('ea', replicas.REPLICA_AXIS, num_replicas, -1.0, -1.0, 1.0), mesh)
  params_R = _to_device(_random_R(rng, num_replicas), mesh)
  state_R = init_R(params_R)
  params_R = jax.tree.map(operator.add, params_R, _to_device(_random_R(rng, num_replicas), mesh))  # move off the center
  gap = lambda w_R, c_R: jax.tree.map(lambda w, c: np.asarray(w).mean(0) - np.asarray(c)[0], w_R, c_R)
  before = gap(params_R, state_R.center)
  params_R, state_R = sync_R(params_R, state_R)
  _assert_close(gap(params_R, state_R.center), jax.tree.map(lambda g: 0.1 * g, before), 'a tenth of the gap left')
  assert sa.default_elastic_alpha(num_replicas) * num_replicas < 1


@pytest.mark.parametrize('num_replicas', [4, 8])
@pytest.mark.parametrize(
  'block_momentum,block_lr,nesterov',
  [
    (-1.0, 1.0, False),  # the defaults: eta = 1 - 1/R, zeta = 1
    (-1.0, 1.0, True),
    (0.5, 0.7, True),
  ],
)
def test_bmuf_matches_reference(num_replicas, block_momentum, block_lr, nesterov):
  """BMUF (Chen & Huo 2016): replicas, global model and momentum, each round."""
  eta = 1.0 - 1.0 / num_replicas if block_momentum < 0 else block_momentum
  zeta = block_lr

  def ref_init(w_R):
    g = jax.tree.map(lambda x: x.mean(axis=0), w_R)
    return g, jax.tree.map(np.zeros_like, g)

  def ref_sync(w_R, state):
    g, d = state
    d = jax.tree.map(lambda d, w, g: eta * d + zeta * (w.mean(axis=0) - g), d, w_R, g)
    g = jax.tree.map(np.add, g, d)
    start = jax.tree.map(lambda g, d: g + eta * d, g, d) if nesterov else g
    return jax.tree.map(lambda s, w: np.broadcast_to(s, w.shape), start, w_R), (g, d)

  algorithm = sa.make('bmuf', replicas.REPLICA_AXIS, num_replicas, 0.1, block_momentum, block_lr, nesterov)
  stack = lambda t: jax.tree.map(lambda x: np.broadcast_to(x, (num_replicas, *x.shape)), t)
  for round_, params_R, state_R, ref_params, (g, d) in _run_rounds(algorithm, num_replicas, ref_init, ref_sync):
    _assert_close(params_R, ref_params, f'bmuf params, round {round_}')
    _assert_close(state_R.global_params, stack(g), f'bmuf global model, round {round_}')
    _assert_close(state_R.momentum, stack(d), f'bmuf momentum, round {round_}')


def test_bmuf_without_momentum_is_model_averaging():
  num_replicas = 4
  rng = np.random.default_rng(2)
  mesh = replicas.make_mesh(num_replicas)
  init_R, sync_R = sa.stacked(sa.bmuf(replicas.REPLICA_AXIS, block_momentum=0.0), mesh)
  ref_params = _random_R(rng, num_replicas)
  params_R = _to_device(ref_params, mesh)
  state_R = init_R(params_R)
  for _ in range(2):
    local_steps = _random_R(rng, num_replicas, scale=0.1)
    ref_params = _mean_R(jax.tree.map(np.add, ref_params, local_steps))
    params_R, state_R = sync_R(jax.tree.map(operator.add, params_R, _to_device(local_steps, mesh)), state_R)
  _assert_close(params_R, ref_params, 'bmuf with eta=0, zeta=1')


def test_make_rejects_unknown_name_and_bad_settings():
  axis = replicas.REPLICA_AXIS
  with pytest.raises(ValueError, match="'fr_ma'"):
    sa.make('fr_ma', axis, 4, 0.1, -1.0, 1.0)
  with pytest.raises(ValueError, match='elastic_alpha'):
    sa.make('ea', axis, 4, 0.25, -1.0, 1.0)  # alpha * R = 1: no longer a contraction toward the center
  with pytest.raises(ValueError, match='block_momentum'):
    sa.make('bmuf', axis, 4, 0.1, 1.0, 1.0)
  with pytest.raises(ValueError, match='block_lr'):
    sa.make('bmuf', axis, 4, 0.1, -1.0, 0.0)
