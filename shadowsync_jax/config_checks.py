"""The config's checks: what every key may hold, alone and beside the others, for a job of a given size.

  config_checks.check(resolved, num_devices=8, num_processes=1)   # ConfigError naming the first bad key, or None
  config_checks.check_data_source(config.data)                    # before the lengths are counted from the data

`shadowsync_jax.config` holds the schema and calls these (`config.validate`): the unknown and missing keys first,
then the data's source, then, on the resolved config, every section. A lower package that reads a section checks it
itself where it knows more than its keys (`data.checks`); its ValueError comes back here as a ConfigError.
"""

import math
from typing import Any

import ml_collections

from shadowsync_jax.data import checks as data_checks
from shadowsync_jax.model import dlrm
from shadowsync_jax.model import table_placement
from shadowsync_jax.recovery import intervals as checkpoint_interval
from shadowsync_jax.recovery import modes as recovery_modes
from shadowsync_jax.sync import algorithms as sync_algorithms_lib

PARAMETER_SERVER_ALGORITHMS = ('gba', 'async_sgd')  # One server model (the gba package).


def shadow_algorithms() -> tuple[str, ...]:
  """Rounds off the training path (docs/design.md §3): `shadow_` and each of `sync.algorithms.names()`."""
  return tuple(f'shadow_{name}' for name in sync_algorithms_lib.names())


def sync_algorithms() -> tuple[str, ...]:
  """Every `sync.algorithm`: none, sync SGD, each round algorithm (`sync.algorithms`, registered ones included)
  in the foreground (`fr_`) and in the background (`shadow_`), and the parameter server's."""
  foreground = tuple(f'fr_{name}' for name in sync_algorithms_lib.names())
  return ('none', 'sync_sgd', *foreground, *shadow_algorithms(), *PARAMETER_SERVER_ALGORITHMS)


SYNCED_PARAMS = ('dense', 'all')
EMBEDDING_PLACEMENTS = (*table_placement.PLACEMENTS, 'auto')
SHARD_EXCHANGES = table_placement.EXCHANGES
MLP_OPTIMIZERS = ('sgd', 'adagrad', 'adam')
EMBEDDING_OPTIMIZERS = ('sgd', 'rowwise_adagrad')
DATA_SOURCES = data_checks.SOURCES
INTERACTIONS = dlrm.INTERACTIONS
RECOVERY_MODES = recovery_modes.MODES
PARTIAL_RECOVERY_MODES = recovery_modes.PARTIAL_MODES
FAILURE_TARGETS = recovery_modes.FAILURE_TARGETS
MAX_TOTAL_ROWS = data_checks.MAX_TOTAL_ROWS


class ConfigError(ValueError):
  """An invalid configuration; the message names the offending key."""


def check_data_source(data: ml_collections.ConfigDict) -> None:
  """The source and the files or prepared dataset it reads: there, and of the right kind (`data.checks`)."""
  try:
    data_checks.check_source(data)
  except ValueError as error:
    raise ConfigError(str(error)) from error


def check(config: ml_collections.ConfigDict, num_devices: int | None, num_processes: int = 1) -> None:
  """Raises ConfigError naming the first bad key of `config`, resolved (`config.resolve`) and of known keys; returns
  quietly when a job of `num_processes` processes with `num_devices` devices in all (evenly spread over the
  processes; None: not known yet) can run it."""
  try:
    data_checks.check(config.data)
  except ValueError as error:
    raise ConfigError(str(error)) from error
  _check_model(config)
  _check_optimizer(config)
  _check_sync(config)
  _check_straggler(config, num_processes)
  _check_train(config, num_processes)
  _check_recovery(config, num_processes)
  _check_gba(config, num_processes)
  if config.num_replicas < 1:
    raise ConfigError(f'num_replicas={config.num_replicas} must be at least 1 (or 0: one per process).')
  if config.num_replicas % num_processes:
    raise ConfigError(
      f'num_replicas={config.num_replicas} must be a multiple of the process count '
      f'({num_processes}): every process trains the same number of replicas; 0 = one per process.'
    )
  if num_devices is not None and config.num_replicas > num_devices:
    raise ConfigError(
      f'num_replicas={config.num_replicas} is more than the {num_devices} devices of the job; on '
      'CPU, more devices come from --cpu_devices (jax_num_cpu_devices).'
    )
  if num_devices is not None and config.num_replicas // num_processes > num_devices // num_processes:
    raise ConfigError(
      f'num_replicas={config.num_replicas} puts {config.num_replicas // num_processes} replicas on '
      f'each process, which has {num_devices // num_processes} devices.'
    )
  if config.batch_size <= 0:
    raise ConfigError(f'batch_size={config.batch_size} must be positive.')
  global_batch = config.num_replicas * config.batch_size
  if config.data.num_train_examples < global_batch:
    raise ConfigError(
      f'data.num_train_examples={config.data.num_train_examples} is less than one global batch '
      f'(num_replicas * batch_size = {global_batch}).'
    )


def _check_positive(config: ml_collections.ConfigDict, *keys: str) -> None:
  for key in keys:
    value = _get(config, key)
    if not value > 0:
      raise ConfigError(f'{key}={value} must be positive.')


def _get(config: ml_collections.ConfigDict, dotted_key: str) -> Any:
  value = config
  for part in dotted_key.split('.'):
    value = value[part]
  return value


def _check_choice(config: ml_collections.ConfigDict, key: str, choices: tuple[str, ...]) -> None:
  value = _get(config, key)
  if value not in choices:
    raise ConfigError(f'{key}={value!r} is not one of {", ".join(choices)}.')


def _check_model(config: ml_collections.ConfigDict) -> None:
  model = config.model
  _check_positive(config, 'model.embedding_dim')
  bottom, top = list(model.bottom_mlp), list(model.top_mlp)
  if not bottom or any(w < 1 for w in bottom) or bottom[-1] != model.embedding_dim:
    raise ConfigError(
      f'model.bottom_mlp={bottom} must be positive widths ending at model.embedding_dim '
      f'({model.embedding_dim}): the interaction sets it beside the embeddings.'
    )
  _check_choice(config, 'model.interaction', INTERACTIONS)
  for key in ('model.cross_layers', 'model.cross_rank'):
    value = _get(config, key)
    if model.interaction == 'dcn' and not (isinstance(value, int) and value >= 1):
      raise ConfigError(f'{key}={value} must be an integer >= 1 for the dcn interaction.')
  if not top or any(w < 1 for w in top) or top[-1] != 1:
    raise ConfigError(f'model.top_mlp={top} must be positive widths ending at 1 (the logit).')


def _check_optimizer(config: ml_collections.ConfigDict) -> None:
  _check_choice(config, 'optimizer.mlp', MLP_OPTIMIZERS)
  _check_choice(config, 'optimizer.embedding', EMBEDDING_OPTIMIZERS)
  _check_positive(config, 'optimizer.mlp_learning_rate', 'optimizer.embedding_learning_rate')


def _check_sync(config: ml_collections.ConfigDict) -> None:
  sync = config.sync
  _check_choice(config, 'sync.algorithm', sync_algorithms())
  _check_choice(config, 'sync.what', SYNCED_PARAMS)
  _check_choice(config, 'sync.embedding_placement', EMBEDDING_PLACEMENTS)
  _check_choice(config, 'sync.shard_exchange', SHARD_EXCHANGES)
  if sync.embedding_placement == 'sharded' and sync.algorithm in PARAMETER_SERVER_ALGORITHMS:
    raise ConfigError(
      f"sync.embedding_placement='sharded' is not implemented for sync.algorithm={sync.algorithm!r} (its server "
      "model holds the tables whole): use 'replicated'."
    )
  _check_positive(config, 'sync.every_k_steps', 'sync.block_lr')
  interval = sync.min_interval_s
  is_seconds = isinstance(interval, (int, float)) and not isinstance(interval, bool) and math.isfinite(interval)
  if interval != 'auto' and not (is_seconds and interval >= 0):
    raise ConfigError(f"sync.min_interval_s={interval!r} must be 'auto' (paced to sync.max_overhead) or seconds >= 0.")
  if not 0 < sync.max_overhead < 1:
    raise ConfigError(f'sync.max_overhead={sync.max_overhead} must be in (0, 1): a share of the throughput.')
  if sync.elastic_alpha == 0 or sync.elastic_alpha >= 1:
    raise ConfigError(f'sync.elastic_alpha={sync.elastic_alpha} must be in (0, 1) (negative = 0.9 / (R + 1)).')
  if sync.algorithm.endswith('_ea') and sync.elastic_alpha * config.num_replicas >= 1:
    raise ConfigError(
      f'sync.elastic_alpha * num_replicas = {sync.elastic_alpha * config.num_replicas} must be < 1 '
      'for elastic averaging to be stable.'
    )
  if sync.block_momentum >= 1:
    raise ConfigError(f'sync.block_momentum={sync.block_momentum} must be < 1 (negative = 1 - 1/R).')


def _check_straggler(config: ml_collections.ConfigDict, num_processes: int) -> None:
  if not -1 <= config.straggler.process < num_processes:
    raise ConfigError(
      f'straggler.process={config.straggler.process} must be -1 (none) or a process index below '
      f'the process count ({num_processes}).'
    )
  if not config.straggler.slowdown >= 1:
    raise ConfigError(f'straggler.slowdown={config.straggler.slowdown} must be >= 1 (times slower).')
  if config.straggler.warmup_steps < 0:
    raise ConfigError(f'straggler.warmup_steps={config.straggler.warmup_steps} must be >= 0.')
  _check_positive(config, 'straggler.calibration_steps')
  if config.straggler.process < 0 or config.straggler.slowdown == 1 or min(config.num_replicas, config.batch_size) < 1:
    return  # No straggler (a bad replica count or batch size is named by its own check).
  unslowed = 1 + config.straggler.warmup_steps + config.straggler.calibration_steps
  total_steps = config.data.num_train_examples // (config.num_replicas * config.batch_size)
  if unslowed >= total_steps:
    raise ConfigError(
      f'straggler.warmup_steps + straggler.calibration_steps = {unslowed - 1} (after a compiling step) leave none '
      f'of the {total_steps} steps a process runs to be slowed: make them smaller or the stream longer.'
    )


def _check_train(config: ml_collections.ConfigDict, num_processes: int) -> None:
  _check_positive(config, 'train.log_every_steps', 'train.progress_every_s', 'train.eval_batch_size')
  for key in ('train.log_every_s', 'train.checkpoint_every_s'):
    if not _get(config, key) >= 0:
      raise ConfigError(f'{key}={_get(config, key)} must be >= 0 (0 = by steps only).')
  per_dispatch = config.train.steps_per_dispatch
  is_count = isinstance(per_dispatch, int) and not isinstance(per_dispatch, bool)
  if per_dispatch != 'auto' and not (is_count and per_dispatch >= 1):
    raise ConfigError(f"train.steps_per_dispatch={per_dispatch!r} must be 'auto' or an integer >= 1.")
  for key in ('train.checkpoint_every_steps', 'train.stop_at_step'):
    if _get(config, key) < 0:
      raise ConfigError(f'{key}={_get(config, key)} must be >= 0.')


def _check_recovery(config: ml_collections.ConfigDict, num_processes: int) -> None:
  recovery = config.recovery
  _check_choice(config, 'recovery.mode', RECOVERY_MODES)
  _check_choice(config, 'recovery.failure_target', FAILURE_TARGETS)
  _check_positive(config, 'recovery.mtbf_steps', 'recovery.num_embedding_shards')
  if not 0 < recovery.target_pls < 1:
    raise ConfigError(f'recovery.target_pls={recovery.target_pls} must be in (0, 1).')
  if not 0 < recovery.priority_fraction <= 1:
    raise ConfigError(f'recovery.priority_fraction={recovery.priority_fraction} must be in (0, 1].')
  for key in ('recovery.priority_max_overhead', 'recovery.live_max_overhead'):
    if not 0 < _get(config, key) <= 1:
      raise ConfigError(f'{key}={_get(config, key)} must be in (0, 1].')
  if recovery.priority_max_bytes < 0:
    raise ConfigError(f'recovery.priority_max_bytes={recovery.priority_max_bytes} must be >= 0 (0 = no cap).')
  if not 0 < recovery.ssu_sample_rate <= 1:
    raise ConfigError(f'recovery.ssu_sample_rate={recovery.ssu_sample_rate} must be in (0, 1].')
  setting = recovery_modes.incremental_setting(recovery.incremental)
  if setting is None:
    raise ConfigError(f"recovery.incremental={recovery.incremental!r} must be 'auto', true or false.")
  sync = config.sync
  why = recovery_modes.incremental_why_not(sync.algorithm, sync.embedding_placement, config.num_replicas, sync.what)
  if setting is True and why:
    raise ConfigError(f'recovery.incremental=true: {why}.')
  if not recovery.rebaseline_fraction > 0:
    raise ConfigError(f'recovery.rebaseline_fraction={recovery.rebaseline_fraction} must be > 0.')
  for key in ('recovery.checkpoint_every_steps', 'recovery.priority_every_steps'):
    if _get(config, key) < 0:
      raise ConfigError(f'{key}={_get(config, key)} must be >= 0 (0 = chosen by the run).')
  for key in ('recovery.save_cost_steps', 'recovery.restore_cost_steps'):
    if _get(config, key) == 0:
      raise ConfigError(f'{key}=0: use a negative value for the measured cost or a positive one to emulate one.')
  if recovery.mode == 'none':
    return
  if config.sync.embedding_placement == 'sharded' and num_processes == 1:
    raise ConfigError(
      f"recovery.mode={recovery.mode!r} is not implemented with sync.embedding_placement='sharded' in one process "
      '(emulated failures split the tables into their own shards): use several processes, or '
      "recovery.mode='none'."
    )
  if config.sync.algorithm in PARAMETER_SERVER_ALGORITHMS:
    raise ConfigError(
      f'recovery.mode={recovery.mode!r} is not implemented for sync.algorithm='
      f'{config.sync.algorithm!r} (its server model trains in the gba package, without recovery).'
    )
  partial = recovery.mode in PARTIAL_RECOVERY_MODES
  if num_processes > 1 and config.sync.algorithm == 'sync_sgd' and (partial or recovery.mode == 'cpr'):
    raise ConfigError(
      f"recovery.mode={recovery.mode!r}: sync.algorithm='sync_sgd' keeps one model on every replica, which a "
      "partial recovery across processes would split in two: use recovery.mode='full'."
    )
  if partial and recovery.checkpoint_every_steps == 0:
    # Across processes a failure takes down a process (real failures); in one, a replica or a shard (emulated).
    num_parts = config.num_replicas if recovery.failure_target == 'replica' else recovery.num_embedding_shards
    num_parts = num_processes if num_processes > 1 else num_parts
    total_steps = config.data.num_train_examples // (config.num_replicas * config.batch_size)
    try:
      checkpoint_interval.partial_recovery_interval(
        recovery.target_pls, recovery.mtbf_steps, num_parts, max(1, total_steps)
      )
    except ValueError as error:
      raise ConfigError(f'recovery.target_pls={recovery.target_pls}: {error}') from error


def _check_gba(config: ml_collections.ConfigDict, num_processes: int) -> None:
  gba = config.gba
  if not (isinstance(gba.staleness_threshold, int) and gba.staleness_threshold >= 0):
    raise ConfigError(f'gba.staleness_threshold={gba.staleness_threshold} must be an integer >= 0.')
  if not 0 <= gba.staleness_decay <= 1:
    raise ConfigError(f'gba.staleness_decay={gba.staleness_decay} must be in [0, 1] (0 = drop stale gradients).')
  _check_positive(config, 'gba.step_time_s')
  if gba.step_time_jitter < 0:
    raise ConfigError(f'gba.step_time_jitter={gba.step_time_jitter} must be >= 0.')
  if not 0 <= gba.straggler_prob <= 1:
    raise ConfigError(f'gba.straggler_prob={gba.straggler_prob} must be in [0, 1].')
  if not gba.straggler_slowdown >= 1:
    raise ConfigError(f'gba.straggler_slowdown={gba.straggler_slowdown} must be >= 1 (times slower).')
  if not 0 <= gba.failure_prob < 1:
    raise ConfigError(f'gba.failure_prob={gba.failure_prob} must be in [0, 1).')
  algorithm = config.sync.algorithm
  if algorithm not in PARAMETER_SERVER_ALGORITHMS:
    return
  if num_processes > 1 and gba.straggler_prob > 0:
    raise ConfigError(
      f'gba.straggler_prob={gba.straggler_prob} emulates stragglers in one process; across '
      f'{num_processes} processes the workers run for real: slow one down with straggler.process '
      'and straggler.slowdown, and set gba.straggler_prob=0.'
    )
  if not (isinstance(gba.max_in_flight_steps, int) and gba.max_in_flight_steps >= 1):
    raise ConfigError(f'gba.max_in_flight_steps={gba.max_in_flight_steps} must be an integer >= 1.')
  if config.recovery.mode != 'none':
    raise ConfigError(
      f'recovery.mode={config.recovery.mode!r} is not implemented with sync.algorithm={algorithm!r}; '
      "its worker failures are gba.failure_prob: use recovery.mode='none'."
    )
  if num_processes == 1 and config.straggler.process != -1:
    raise ConfigError(
      f'straggler.process={config.straggler.process} slows a process down for real; in one process '
      f'sync.algorithm={algorithm!r} emulates stragglers with gba.straggler_prob: set it to -1.'
    )
  if config.train.eval_per_replica:
    raise ConfigError(
      f'train.eval_per_replica: sync.algorithm={algorithm!r} trains one server model, there are no '
      'replica models to evaluate.'
    )
