"""Model synchronization rounds as pure optax-style `(init, sync)` pairs over one replica's params (docs/design.md §3).

  algorithm = algorithms.make('bmuf', replicas.REPLICA_AXIS, num_replicas, elastic_alpha=-1.0,
                                   block_momentum=-1.0, block_lr=1.0)    # -1: the defaults
  init_R, sync_R = algorithms.stacked(algorithm, mesh)               # jit(shard_map(...)) over replicas
  sync_state_R = init_R(params_R)
  params_R, sync_state_R = sync_R(params_R, sync_state_R)                 # one round
  hand_over_L, land_L, _ = algorithms.met_rounds(algorithm, local_mesh)   # the same, replicas met on the host

`init` and `sync` run per replica inside `jax.shard_map` over `axis_name`: they see one replica's params (no
leading axis) and couple the replicas only through `lax.pmean`/`lax.psum`. Every sync state holds values that are
identical on all replicas (the EASGD center, the BMUF global model and momentum), one copy per replica, so a round
needs no broadcast. Which leaves are synced and when a round runs belong to the driver, not to this module.

A round that lands late (a shadow round across processes: docs/design.md §3) is split in two (`met_rounds`): its
`lead`, what the round does to a replica that needs no other replica (the round as if this replica were every
replica: EA's pull toward the center, BMUF's momentum step; nothing for MA), which lands when its snapshot is
taken, and the rest (`synced - snapshot - lead`: what the replica mean brings), which lands when the round is
merged. Landed late as a whole, BMUF's momentum acts on block gradients measured before its last jump showed, and
diverges once the lag nears the gap (at the default config's 8 replicas, rounds every 16 steps merged 16 steps
late: NE 1.60; with the lead 0.84, sync SGD's 0.84).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
import numpy as np

from shadowsync_jax.parallel import replicas

PyTree = Any


class SyncAlgorithm(NamedTuple):
  """A pure pair: `init(params) -> sync_state` and `sync(params, sync_state) -> (params, sync_state)`; and
  `lead(params, sync_state) -> change`: the part of `sync`'s change to one replica that needs no other replica (no
  collective; None: nothing, as for model averaging). `sync` in two phases, for a round whose replicas meet
  without a collective (`shadow.ShadowSync`, across processes): `contribution(params, sync_state) -> tree`, what
  the round averages over every replica of the job, and `finish(params, sync_state, mean) -> (params, sync_state)`,
  the round given that average: `sync` is `finish(params, state, replica_mean(contribution(params, state)))`."""

  init: Callable[[PyTree], PyTree]
  sync: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]]
  lead: Callable[[PyTree, PyTree], PyTree] | None = None
  contribution: Callable[[PyTree, PyTree], PyTree] | None = None
  finish: Callable[[PyTree, PyTree, PyTree], tuple[PyTree, PyTree]] | None = None


class ModelAveragingState(NamedTuple):
  """Model averaging keeps no state."""


class ElasticAveragingState(NamedTuple):
  center: PyTree  # c, the same on every replica.


class BmufState(NamedTuple):
  global_params: PyTree  # g, the same on every replica.
  momentum: PyTree  # D, the block momentum, the same on every replica.


def replica_mean(tree: PyTree, axis_name: str) -> PyTree:
  """The mean over the replicas along `axis_name` of every leaf (one all-reduce per dtype), inside `shard_map`."""
  return _flat_collective(lambda v: lax.pmean(v, axis_name), tree)


def _psum(tree: PyTree, axis_name: str) -> PyTree:
  return _flat_collective(lambda v: lax.psum(v, axis_name), tree)


def _flat_collective(collective: Callable[[jax.Array], jax.Array], tree: PyTree) -> PyTree:
  """`collective` on every leaf, issued as one all-reduce of one flat vector per dtype.

  A tuple all-reduce of the leaves costs about twice as much on XLA:CPU (a rendezvous per leaf: 5.4 ms against
  2.5 ms for the default model's 11 leaves on 8 devices); the concatenation and the slices back are copies of
  the same size as the message.
  """
  leaves, treedef = jax.tree.flatten(tree)
  out = list(leaves)
  for dtype in dict.fromkeys(leaf.dtype for leaf in leaves):  # In leaf order: every process issues the same.
    index = [i for i, leaf in enumerate(leaves) if leaf.dtype == dtype]
    flat = collective(jnp.concatenate([leaves[i].reshape(-1) for i in index]))
    offsets = np.cumsum([0] + [leaves[i].size for i in index])
    for i, start, stop in zip(index, offsets[:-1], offsets[1:]):
      out[i] = flat[start:stop].reshape(leaves[i].shape)
  return jax.tree.unflatten(treedef, out)


def model_averaging(axis_name: str) -> SyncAlgorithm:
  """Every replica takes the replica mean: `w_i <- mean_j w_j`.

  Periodic model averaging, as in "Parallel training of DNNs with natural gradient and parameter averaging"
  (Povey et al., 2014) and local SGD (Stich, 2019, arXiv:1805.09767).
  """

  def init(params):
    del params
    return ModelAveragingState()

  def sync(params, state):
    return replica_mean(params, axis_name), state

  def finish(params, state, mean):
    del params
    return mean, state

  return SyncAlgorithm(init, sync, contribution=lambda params, state: params, finish=finish)


def elastic_averaging(axis_name: str, alpha: float, num_replicas: int | None = None) -> SyncAlgorithm:
  """Elastic averaging: replicas and a center `c` pull toward each other with moving rate `alpha`.

  `d_i = alpha (w_i - c)`; `w_i <- w_i - d_i`; `c <- c + sum_i d_i`. The synchronous round of EASGD, "Deep
  learning with Elastic Averaging SGD" (Zhang, Choromanska & LeCun, NeurIPS 2015, arXiv:1412.6651), with
  `beta = R alpha`; the round contracts `mean_i w_i - c` by `1 - alpha (R + 1)`: monotonically for
  `alpha (R + 1) <= 1`, flipping its sign each round above that (docs/design.md §3's stability bound is `alpha R < 1`).
  The center starts at the replica mean of the initial params. `num_replicas` (R) gives the two-phase form.
  """

  def init(params):
    return ElasticAveragingState(center=replica_mean(params, axis_name))

  def sync(params, state):
    diffs = jax.tree.map(lambda w, c: alpha * (w - c), params, state.center)
    params = jax.tree.map(lambda w, d: w - d, params, diffs)
    center = jax.tree.map(lambda c, s: c + s, state.center, _psum(diffs, axis_name))
    return params, ElasticAveragingState(center=center)

  def lead(params, state):  # A replica's pull is its own: only the center needs the others.
    return jax.tree.map(lambda w, c: -alpha * (w - c), params, state.center)

  def contribution(params, state):
    return jax.tree.map(lambda w, c: alpha * (w - c), params, state.center)

  def finish(params, state, mean_diff):
    params = jax.tree.map(lambda w, d: w - d, params, contribution(params, state))
    center = jax.tree.map(lambda c, m: c + num_replicas * m, state.center, mean_diff)
    return params, ElasticAveragingState(center=center)

  if num_replicas is None:
    return SyncAlgorithm(init, sync, lead)
  return SyncAlgorithm(init, sync, lead, contribution, finish)


def bmuf(axis_name: str, block_momentum: float, block_lr: float = 1.0, nesterov: bool = False) -> SyncAlgorithm:
  """Block-wise model update filtering: the averaged block update drives a momentum step on a global model `g`.

  `G = mean_i w_i - g`; `D <- eta D + zeta G`; `g <- g + D`; `w_i <- g`, or `w_i <- g + eta D` with Nesterov
  (eta = `block_momentum`, zeta = `block_lr`). "Scalable training of deep learning machines by incremental block
  training with intra-block parallel optimization and blockwise model-update filtering" (Chen & Huo, ICASSP 2016).
  With `eta = 0, zeta = 1` it is model averaging. `g` starts at the replica mean of the initial params, `D` at 0.
  """

  def init(params):
    global_params = replica_mean(params, axis_name)
    return BmufState(global_params=global_params, momentum=jax.tree.map(jnp.zeros_like, global_params))

  def step(mean, state):
    """The round from the replica mean `mean`: (the replicas' new params, the new state)."""
    block_grad = jax.tree.map(lambda m, g: m - g, mean, state.global_params)
    momentum = jax.tree.map(lambda d, b: block_momentum * d + block_lr * b, state.momentum, block_grad)
    global_params = jax.tree.map(lambda g, d: g + d, state.global_params, momentum)
    if nesterov:
      params = jax.tree.map(lambda g, d: g + block_momentum * d, global_params, momentum)
    else:
      params = global_params
    return params, BmufState(global_params=global_params, momentum=momentum)

  def sync(params, state):
    return step(replica_mean(params, axis_name), state)

  def lead(params, state):  # The round as if this replica were the mean: eta D (zeta = 1, without Nesterov).
    return jax.tree.map(lambda new, w: new - w, step(params, state)[0], params)

  def finish(params, state, mean):
    del params
    return step(mean, state)

  return SyncAlgorithm(init, sync, lead, contribution=lambda params, state: params, finish=finish)


class MetRound(NamedTuple):
  """A round of an algorithm whose replicas meet on the host (`met_rounds`), as functions of one replica's trees
  (inside `shard_map`, no collective): `hand_over(params, sync_state) -> (led, snapshot, contribution)`,
  `land(params, snapshot, sync_state, mean) -> (params, sync_state)`, `take_back(params, snapshot, sync_state) ->
  unled`. `shadow.ShadowSync` fuses them into the training blocks."""

  hand_over: Callable[[PyTree, PyTree], tuple[PyTree, PyTree, PyTree]]
  land: Callable[[PyTree, PyTree, PyTree, PyTree], tuple[PyTree, PyTree]]
  take_back: Callable[[PyTree, PyTree, PyTree], PyTree]


def met_round(algorithm: SyncAlgorithm) -> MetRound:
  """`algorithm`'s round in two phases on one replica (`met_rounds` says what each does)."""
  if algorithm.contribution is None or algorithm.finish is None:
    raise ValueError('the algorithm has no two-phase form (contribution, finish).')
  lead = algorithm.lead or (lambda params, state: jax.tree.map(jnp.zeros_like, params))

  def hand_over(params, state):
    led = jax.tree.map(lambda w, a: w + a, params, lead(params, state))
    return led, jax.tree.map(jnp.copy, params), algorithm.contribution(params, state)

  def land(params, snapshot, state, mean):
    synced, new_state = algorithm.finish(snapshot, state, mean)
    merged = jax.tree.map(lambda w, s_new, s, a: w + (s_new - s - a), params, synced, snapshot, lead(snapshot, state))
    return merged, new_state

  def take_back(params, snapshot, state):
    return jax.tree.map(lambda w, a: w - a, params, lead(snapshot, state))

  return MetRound(hand_over, land, take_back)


def met_rounds(algorithm: SyncAlgorithm, mesh: Mesh) -> tuple[Callable[..., tuple], ...]:
  """`(hand_over_L, land_L, take_back_L)`: a round of `algorithm` in programs on this process's devices (`mesh`),
  the replicas of every process meeting between them on the host (`shadow.ShadowSync`: no collective of the job):

    led_L, snapshot_L, contributions_L = hand_over_L(params_L, sync_state_L)   # params donated
    ...                                   # the job's mean of the contributions, summed on the host
    params_L, sync_state_L = land_L(params_L, snapshot_L, sync_state_L, job_mean)   # params donated
    unled_L = take_back_L(params_L, snapshot_L, sync_state_L)               # the lead taken out, new buffers

  `hand_over_L` lands the round's lead at once and returns a copy of the params as they were (the snapshot) and
  each replica's contribution (no collective: the caller sums them on the host; an all-reduce of this process's
  devices there waits for the slowest device's block, on a CPU backend its threads taking the cores meanwhile);
  `land_L` merges the rest of the round, `synced - snapshot - lead`, into the params as they are by then (keeping
  the local steps made meanwhile: docs/design.md §3) and returns the round's sync state. `sync_state_L` is the
  state the round starts from, this process's copies. (The same round inside the training blocks: `met_round`.)"""
  parts = met_round(algorithm)
  spec, whole = P(replicas.REPLICA_AXIS), P()

  hand_over_one = lambda params_1, state_1: tuple(
    replicas.unsqueeze(out) for out in parts.hand_over(replicas.squeeze(params_1), replicas.squeeze(state_1))
  )
  land_one = lambda params_1, snapshot_1, state_1, mean: tuple(
    replicas.unsqueeze(out)
    for out in parts.land(replicas.squeeze(params_1), replicas.squeeze(snapshot_1), replicas.squeeze(state_1), mean)
  )
  take_back_one = lambda params_1, snapshot_1, state_1: replicas.unsqueeze(
    parts.take_back(replicas.squeeze(params_1), replicas.squeeze(snapshot_1), replicas.squeeze(state_1))
  )

  hand_over = jax.jit(
    jax.shard_map(hand_over_one, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec, spec)), donate_argnums=0
  )
  land = jax.jit(
    jax.shard_map(land_one, mesh=mesh, in_specs=(spec, spec, spec, whole), out_specs=(spec, spec)), donate_argnums=0
  )
  take_back = jax.jit(jax.shard_map(take_back_one, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec))
  return hand_over, land, take_back


def default_elastic_alpha(num_replicas: int) -> float:
  """EA's moving rate when none is set: `0.9 / (R + 1)`, so that a round closes 90% of the gap between the replica
  mean and the center (it contracts it by `1 - alpha (R + 1)`, `elastic_averaging`) whatever the number of
  replicas: 0.1 at R = 8, 0.3 at R = 2. A fixed alpha would close it ever less as R falls (0.1 at R = 2 closes
  30%, and a center that moves so little lags the replicas by many rounds) and break `alpha R < 1` as R grows."""
  return 0.9 / (num_replicas + 1)


class Settings(NamedTuple):
  """What the config says of a round (`sync` section), for building an algorithm (`register`)."""

  axis_name: str
  num_replicas: int
  elastic_alpha: float  # < 0: the default, `default_elastic_alpha`.
  block_momentum: float  # < 0: the default, 1 - 1/R.
  block_lr: float
  nesterov: bool = False


def _elastic_averaging(settings: Settings) -> SyncAlgorithm:
  alpha, num_replicas = settings.elastic_alpha, settings.num_replicas
  if alpha < 0:
    alpha = default_elastic_alpha(num_replicas)
  if not 0 < alpha * num_replicas < 1:
    raise ValueError(f'elastic_alpha * num_replicas = {alpha} * {num_replicas} must be in (0, 1).')
  return elastic_averaging(settings.axis_name, alpha, num_replicas)


def _bmuf(settings: Settings) -> SyncAlgorithm:
  block_momentum = settings.block_momentum
  if block_momentum < 0:
    block_momentum = 1.0 - 1.0 / settings.num_replicas
  if block_momentum >= 1:
    raise ValueError(f'block_momentum={block_momentum} must be < 1 (negative = 1 - 1/R).')
  if settings.block_lr <= 0:
    raise ValueError(f'block_lr={settings.block_lr} must be > 0.')
  return bmuf(settings.axis_name, block_momentum, settings.block_lr, settings.nesterov)


_BUILDERS: dict[str, Callable[[Settings], SyncAlgorithm]] = {
  'ma': lambda settings: model_averaging(settings.axis_name),
  'ea': _elastic_averaging,
  'bmuf': _bmuf,
}


def register(name: str, build: Callable[[Settings], SyncAlgorithm]) -> None:
  """Adds the algorithm `name`: the config's `sync.algorithm` then takes `fr_<name>` (a round every k steps) and,
  where `build` gives the two-phase form (`contribution`, `finish`), `shadow_<name>` (docs/architecture.md, "Add
  your own"). `build(settings)` returns its `SyncAlgorithm`, its collectives over `settings.axis_name`."""
  if not name.isidentifier() or name in _BUILDERS:
    raise ValueError(f'sync algorithm name {name!r} is taken or not an identifier.')
  _BUILDERS[name] = build


def names() -> tuple[str, ...]:
  """The algorithms rounds can run ('ma', 'ea', 'bmuf', and any `register`ed)."""
  return tuple(_BUILDERS)


def make(
  name: str,
  axis_name: str,
  num_replicas: int,
  elastic_alpha: float,
  block_momentum: float,
  block_lr: float,
  nesterov: bool = False,
) -> SyncAlgorithm:
  """The algorithm called `name` ('ma', 'ea', 'bmuf', or one `register`ed); `elastic_alpha < 0` means the default
  `0.9 / (R + 1)` (`default_elastic_alpha`), `block_momentum < 0` the default `1 - 1/R`."""
  if name not in _BUILDERS:
    raise ValueError(f'Unknown sync algorithm {name!r}; known: {", ".join(_BUILDERS)}.')
  return _BUILDERS[name](Settings(axis_name, num_replicas, elastic_alpha, block_momentum, block_lr, nesterov))


def stacked(
  algorithm: SyncAlgorithm, mesh: Mesh, donate: bool = False
) -> tuple[Callable[[PyTree], PyTree], Callable[[PyTree, PyTree], tuple[PyTree, PyTree]]]:
  """`(init_R, sync_R)`: `algorithm` as jit(shard_map) over params and sync state stacked on a leading axis R.

  The algorithm must have been built with `axis_name=replicas.REPLICA_AXIS`. With `donate`, `sync_R` updates
  its params and state in place (the caller must not reuse them).
  """
  spec = P(replicas.REPLICA_AXIS)

  def init_one(params_1):
    return replicas.unsqueeze(algorithm.init(replicas.squeeze(params_1)))

  def sync_one(params_1, state_1):
    params, state = algorithm.sync(replicas.squeeze(params_1), replicas.squeeze(state_1))
    return replicas.unsqueeze(params), replicas.unsqueeze(state)

  init_R = jax.jit(jax.shard_map(init_one, mesh=mesh, in_specs=spec, out_specs=spec))
  sync_R = jax.jit(
    jax.shard_map(sync_one, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec)),
    donate_argnums=(0, 1) if donate else (),
  )
  return init_R, sync_R
