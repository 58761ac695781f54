"""The model a run evaluates (docs/design.md §3), read where it lives: no consensus table is ever built.

  rule = consensus.Rule('ea', groups=('mlp', 'embedding'))          # a driver's `consensus_rule()`
  predict = consensus.make_predict(config.model, config.data.cardinalities, meshes, rule)   # a job-wide program
  probabilities_ME = predict(state_L.params, sync_state_R, dense_ExF, sparse_ExT)   # every process gets all of it
  params = consensus.materialize(rule, params_L, sync_state_R, meshes)   # the whole model (small models, tests)
  fingerprint = consensus.fingerprint(rule, params_L, sync_state_R, meshes)   # the same uint32 on every process

Which model is the consensus:
- `none`, `ma`, `bmuf`: the replica mean (for BMUF it includes the local steps since the last round);
- `ea`: the center `c` for the groups the rounds sync, the replica mean for the others;
- `sync_sgd`: every replica holds the one model: each device reads its own.
Dense params are small: their consensus is computed whole on every device. A table is not: the consensus rows of
a batch are read from the tables as they are, inside `shard_map` over the job's replicas. The replica mean's rows
are the mean of every replica's own rows for the same ids (the ids all-gathered, each device reading its own
table, a reduce-scatter summing them back), since a mean of tables is read row by row; the center's rows are read
from each device's own copy of `c`; a sharded table's rows from their owners (`table_placement.Sharded`).
"""

from collections.abc import Sequence
import functools
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import ml_collections
import numpy as np

from shadowsync_jax.data.batch import Batch
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import embedding
from shadowsync_jax.model import table_placement
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms

PyTree = Any
AXIS = replicas.REPLICA_AXIS


class Tables(NamedTuple):
  """Where the tables are (`sync.embedding_placement`) and, sharded, how rows reach their readers."""

  placement: str = 'replicated'
  shard_exchange: str = 'all_gather'


REPLICATED = Tables()


class Rule(NamedTuple):
  """What a driver's consensus is: the algorithm (`none`, `sync_sgd`, `ma`, `ea`, `bmuf`), the groups its rounds sync
  (its sync state holds them), and where the tables are."""

  algorithm: str
  groups: tuple[str, ...] = ()
  tables: Tables = REPLICATED


def _parts(rule: Rule, params: PyTree, sync_state: PyTree) -> tuple[PyTree, jax.Array, str]:
  """Per device: (the consensus MLP params, the table its rows are read from, how: 'own', 'mean' or 'sharded')."""
  if rule.algorithm == 'sync_sgd':
    mlp = params['mlp']
  elif rule.algorithm == 'ea' and 'mlp' in rule.groups:
    mlp = sync_state.center['mlp']
  else:
    mlp = algorithms.replica_mean(params['mlp'], AXIS)
  if rule.tables.placement == 'sharded':
    return mlp, params['embedding'], 'sharded'
  if rule.algorithm == 'sync_sgd':
    return mlp, params['embedding'], 'own'
  if rule.algorithm == 'ea' and 'embedding' in rule.groups:
    return mlp, sync_state.center['embedding'], 'own'
  return mlp, params['embedding'], 'mean'


def _read_rows(how: str, table: jax.Array, row_ids_N: jax.Array, sharded: table_placement.Sharded) -> jax.Array:
  """The consensus rows of `row_ids_N` (this device's ids), [N, D]."""
  if how == 'own':
    return table.at[row_ids_N].get(mode='promise_in_bounds')
  if how == 'sharded':
    return sharded.lookup(table, row_ids_N)[0]
  ids_RN = lax.all_gather(row_ids_N, AXIS, tiled=True)
  rows_RNxD = table.at[ids_RN].get(mode='promise_in_bounds')
  return lax.psum_scatter(rows_RNxD, AXIS, scatter_dimension=0, tiled=True) / lax.axis_size(AXIS)


def make_predict(
  model_config: ml_collections.ConfigDict,
  cardinalities: Sequence[int],
  meshes: replicas.ReplicaMeshes,
  rule: Rule,
  per_replica=False,
):
  """`predict(params_L, sync_state_R, dense_ExF, sparse_ExT) -> probabilities [M, E]` (host numpy, on every process)
  of the DLRM of a run's `model` section over tables of `cardinalities` rows: row 0 the consensus model's, and with
  `per_replica` one row per replica of the job (its own MLP and own rows).

  A job-wide program (call it on every process with the same examples, from the thread that owns the collectives):
  the E examples are split over the job's R replicas, each device predicting its E / R (E is padded to a multiple
  of R and cut back).
  """
  model = dlrm.from_config(model_config)
  offsets_T = embedding.table_offsets(list(cardinalities))
  num_replicas = meshes.job.shape[AXIS]
  sharded = table_placement.Sharded(
    AXIS, table_placement.ShardLayout(int(sum(cardinalities)), num_replicas), rule.tables.shard_exchange
  )

  def one_device(params_1, sync_state_1, dense_1xExF, sparse_1xExT):
    params, sync_state = replicas.squeeze(params_1), replicas.squeeze(sync_state_1)
    dense_ExF, sparse_ExT = dense_1xExF[0], sparse_1xExT[0]
    mlp, table, how = _parts(rule, params, sync_state)
    row_ids_N = embedding.global_row_ids(sparse_ExT, offsets_T).reshape(-1)
    rows_ExTxD = _read_rows(how, table, row_ids_N, sharded).reshape(*sparse_ExT.shape, -1)
    probabilities = [jax.nn.sigmoid(model.apply({'params': mlp}, dense_ExF, rows_ExTxD))]
    if per_replica:  # Every replica's own model on all R E examples: its MLP, and its own (or the sharded) rows.
      all_dense = lax.all_gather(dense_ExF, AXIS, tiled=True)
      if how == 'sharded':
        all_rows = lax.all_gather(rows_ExTxD, AXIS, tiled=True)
      else:
        all_ids = lax.all_gather(row_ids_N, AXIS, tiled=True)
        all_rows = params['embedding'].at[all_ids].get(mode='promise_in_bounds').reshape(-1, *rows_ExTxD.shape[1:])
      own_RE = jax.nn.sigmoid(model.apply({'params': params['mlp']}, all_dense, all_rows))
      probabilities.append(lax.all_gather(own_RE, AXIS))  # [R, R E]: replica r's predictions of every example.
    consensus_RE = lax.all_gather(probabilities[0], AXIS, tiled=True)
    return consensus_RE, (probabilities[1] if per_replica else jnp.zeros((0, consensus_RE.shape[0])))

  spec = jax.sharding.PartitionSpec(AXIS)
  program = jax.jit(
    jax.shard_map(
      one_device,
      mesh=meshes.job,
      in_specs=(spec, spec, spec, spec),
      out_specs=(jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec()),
      check_vma=False,
    )
  )

  def predict(params_L, sync_state_R, dense_ExF, sparse_ExT) -> np.ndarray:
    replicas.check_collective_thread('predicting with the consensus model')
    count = len(dense_ExF)
    padded = -(-count // num_replicas) * num_replicas
    examples = Batch(dense_ExF, sparse_ExT, np.zeros(count, np.float32))
    if padded != count:
      examples = Batch(*(np.concatenate([x, np.zeros((padded - count, *x.shape[1:]), x.dtype)]) for x in examples))
    dense_R, sparse_R = (
      _split_over_job(x.reshape(num_replicas, padded // num_replicas, *x.shape[1:]), meshes) for x in examples[:2]
    )
    consensus_E, own_RxE = replicas.fetch(program(replicas.to_job(params_L, meshes), sync_state_R, dense_R, sparse_R))
    return np.concatenate([consensus_E[None], own_RxE])[:, :count]

  return predict


def _split_over_job(x_RxK: np.ndarray, meshes: replicas.ReplicaMeshes) -> jax.Array:
  """A host array [R, ...] (the same on every process) as the job-wide array, each process placing its own rows."""
  if meshes.job is meshes.local:
    return replicas.shard(x_RxK, meshes.local)
  num_local = meshes.local.shape[AXIS]
  first = jax.process_index() * num_local
  return jax.make_array_from_process_local_data(replicas.replica_sharding(meshes.job), x_RxK[first : first + num_local])


def materialize(rule: Rule, params_L: PyTree, sync_state_R: PyTree, meshes: replicas.ReplicaMeshes) -> PyTree:
  """The whole consensus model, one tree without the replica axis, whole on every device of the job (a sharded
  table comes back as [V', D] in its rows' order, V' its padded row count): for small models and tests only (it
  builds the consensus table)."""
  replicas.check_collective_thread('the consensus')
  return _materialize_program(rule, meshes.job)(replicas.to_job(params_L, meshes), sync_state_R)


@functools.cache
def _materialize_program(rule: Rule, mesh):
  def one_device(params_1, sync_state_1):
    params, sync_state = replicas.squeeze(params_1), replicas.squeeze(sync_state_1)
    mlp, table, how = _parts(rule, params, sync_state)
    if how == 'mean':
      table = lax.pmean(table, AXIS)
    elif how == 'sharded':  # Local row r of shard s is row r S + s: interleave the shards.
      shards_SxVsxD = lax.all_gather(table, AXIS)
      table = jnp.swapaxes(shards_SxVsxD, 0, 1).reshape(-1, table.shape[-1])
    return {**params, 'mlp': mlp, 'embedding': table}

  spec, whole = jax.sharding.PartitionSpec(AXIS), jax.sharding.PartitionSpec()
  return jax.jit(jax.shard_map(one_device, mesh=mesh, in_specs=(spec, spec), out_specs=whole, check_vma=False))


def fingerprint(rule: Rule, params_L: PyTree, sync_state_R: PyTree, meshes: replicas.ReplicaMeshes) -> np.uint32:
  """32 bits of a hash of the consensus MLP and of the tables its rows come from (every replica's, the center's
  copies, or the shards): equal on every process, and equal between two runs exactly when they end in the same
  model (but for a 2^-32 chance), computed where the tables live (a collective)."""
  replicas.check_collective_thread('the consensus fingerprint')
  mlp, table_sums_R = replicas.fetch(
    _fingerprint_program(rule, meshes.job)(replicas.to_job(params_L, meshes), sync_state_R)
  )
  return replicas.fingerprint({'mlp': mlp, 'tables': table_sums_R})


@functools.cache
def _fingerprint_program(rule: Rule, mesh):
  def one_device(params_1, sync_state_1):
    params, sync_state = replicas.squeeze(params_1), replicas.squeeze(sync_state_1)
    mlp, table, _ = _parts(rule, params, sync_state)
    return mlp, lax.all_gather(replicas.checksum(table), AXIS)

  spec, whole = jax.sharding.PartitionSpec(AXIS), jax.sharding.PartitionSpec()
  return jax.jit(jax.shard_map(one_device, mesh=mesh, in_specs=(spec, spec), out_specs=whole, check_vma=False))
