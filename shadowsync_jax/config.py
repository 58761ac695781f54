"""The configuration schema: every key a run accepts, its default, and the checks that run before anything compiles.

  config = config_lib.base_config()          # every key, with defaults
  config.num_replicas = 8                    # experiments/configs/*.py override it
  config = config_lib.resolve(config, num_processes=jax.process_count())   # num_replicas=0: one per process
  config_lib.validate(config, num_devices=len(jax.devices()))   # ConfigError naming the key, or None
  config_lib.auto_placement(config)          # what a setting means: the placement 'auto' picks

Experiment configs (`experiments/configs/*.py`) start from `base_config()` and change values, so every config has
every key (docs/design.md §9) and a typo in a config file or a `--config.KEY=VALUE` override is caught here, by name.
"""

import difflib
import math
import os
from typing import Any

import ml_collections

from shadowsync_jax.data import lengths
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.criteo import files as criteo_files
from shadowsync_jax.data.prepared import manifest as prepared_manifest
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
# 'auto' shards tables of more bytes than this (one copy of all 26) when there are several replicas.
AUTO_SHARDED_TABLE_BYTES = 256 << 20
SHARD_EXCHANGES = table_placement.EXCHANGES
MLP_OPTIMIZERS = ('sgd', 'adagrad', 'adam')
EMBEDDING_OPTIMIZERS = ('sgd', 'rowwise_adagrad')
DATA_SOURCES = ('synthetic', 'criteo', 'prepared')
INTERACTIONS = dlrm.INTERACTIONS
RECOVERY_MODES = recovery_modes.MODES
PARTIAL_RECOVERY_MODES = recovery_modes.PARTIAL_MODES
FAILURE_TARGETS = recovery_modes.FAILURE_TARGETS


MAX_TOTAL_ROWS = 2**31 - 1  # The tables are one concatenated table whose row ids are int32.
# Criteo Kaggle's 26 cardinalities (1460, 583, 10131227, ...) capped at 300: the shape of real data, laptop-sized.
CRITEO_SHAPED_CARDINALITIES = (
  300,
  300,
  300,
  300,
  300,
  24,
  300,
  300,
  3,
  300,
  300,
  300,
  300,
  27,
  300,
  300,
  10,
  300,
  300,
  4,
  300,
  18,
  15,
  300,
  105,
  300,
)


class ConfigError(ValueError):
  """An invalid configuration; the message names the offending key."""


def base_config() -> ml_collections.ConfigDict:
  """All keys with their defaults: a small synthetic problem that trains on one CPU replica in about a minute."""
  config = ml_collections.ConfigDict()
  config.seed = 0  # Seeds the synthetic teacher and stream, the model init and everything random.
  config.num_replicas = (
    0  # R: trainers, one per device, each reading a disjoint 1/R of the stream; 0 = one per process.
  )
  config.batch_size = 256  # Examples per replica per step.

  config.data = ml_collections.ConfigDict()
  # 'synthetic' (the embedded teacher stream), 'criteo' (Kaggle/Terabyte TSV files, parsed as they are read) or
  # 'prepared' (Criteo prepared once by experiments.prepare_criteo: blocks read through grain).
  config.data.source = 'synthetic'
  config.data.train_path = ''  # criteo: the TSV file(s) of the training stream, comma-separated, in time order.
  config.data.eval_path = ''  # criteo: held-out TSV file(s); empty = the last day of the training files.
  # prepared: the dataset's directory, DATA_DIR/criteo_click_blocks/NAME (experiments.prepare_criteo writes there), or
  # a directory above it that holds no other prepared dataset.
  config.data.prepared_dir = ''
  config.data.train_split = 'train'  # prepared: the split of the training stream.
  config.data.eval_split = 'heldout'  # prepared: the held-out split; empty = the last day of the training split.
  # N: length of the one-pass training stream, shared by all replicas; 0 = all of it: synthetic 2,000,000, criteo
  # and prepared every training row (data/lengths.py).
  config.data.num_train_examples = 0
  # M: held-out examples; 0 = all of them: synthetic the 200,000 after the training stream, criteo and prepared the
  # held-out file(s) or split, or without one the last day of the training data.
  config.data.num_eval_examples = 0
  # Rows of each of the 26 tables (criteo: hash buckets). Default: Criteo Kaggle's per-feature cardinalities capped
  # at 300, so the default problem is learnable from 2M examples (docs/studies/default_problem.md).
  config.data.cardinalities = CRITEO_SHAPED_CARDINALITIES
  config.data.zipf_exponent = 1.05  # synthetic: skew of the categorical ids.
  config.data.drift = 0.0  # synthetic: how fast the teacher drifts along the stream (0 = stationary).
  # Readers of a block of the training stream, side by side while the block before trains, or 'auto': one a core
  # this process may run on, less one (1 on a 2-core machine, 8 at most). Typed `object`: a number or 'auto'.
  config.data.readers = ml_collections.FieldReference('auto', field_type=object)
  # Whether they are processes (a GIL each; the source sent to them once) or threads; 'auto': processes where the
  # source can be sent (the synthetic stream), threads elsewhere. Typed `object`: True, False or 'auto'.
  config.data.reader_processes = ml_collections.FieldReference('auto', field_type=object)
  # synthetic: where the training stream's blocks are made: 'device' (generated inside jitted code on the devices
  # that train them: data/synthetic_device.py), 'host' (the readers above) or 'auto': 'device' on accelerators,
  # 'host' on CPU (where the device is the host's cores, and the readers run beside the steps).
  config.data.generator = 'auto'
  # Read the whole training stream into memory before training (every process all of it, ~170 bytes an example),
  # then serve the blocks from there: the loop without the stream's reading (`benchmarks.loop`'s (b')).
  config.data.in_memory = False

  config.model = ml_collections.ConfigDict()
  config.model.embedding_dim = 16  # D: width of every embedding row; the bottom MLP ends at D.
  config.model.bottom_mlp = (64, 16)  # Hidden widths of the bottom MLP over the 13 dense features.
  config.model.top_mlp = (128, 64, 1)  # Widths of the top MLP over the interaction's output.
  # 'dot' (DLRM: [bottom output, pairwise dots]) or 'dcn' (DLRM-DCNv2, MLPerf's: low-rank cross layers over
  # [bottom output, embeddings], (T + 1) D wide; model/dcn.py).
  config.model.interaction = 'dot'
  config.model.cross_layers = 3  # dcn: cross layers (MLPerf DLRM-DCNv2: 3).
  config.model.cross_rank = 64  # dcn: rank of each layer (MLPerf: 512 at width 3456; TorchRec advises ~ width / 4).

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.mlp = 'adagrad'  # optax optimizer of the MLP weights: 'sgd', 'adagrad' or 'adam'.
  config.optimizer.mlp_learning_rate = 0.05
  config.optimizer.embedding = 'rowwise_adagrad'  # Sparse optimizer of the tables: 'sgd' or 'rowwise_adagrad'.
  config.optimizer.embedding_learning_rate = 0.05

  config.sync = ml_collections.ConfigDict()
  config.sync.algorithm = 'none'  # One of sync_algorithms() (docs/design.md §3).
  config.sync.every_k_steps = 10  # Foreground algorithms: steps between blocking rounds.
  # Shadow algorithms: least seconds between the starts of two background rounds, or 'auto': paced, as the run
  # measures what rounds cost, to cost the trainers at most sync.max_overhead (sync/pacing.py). Typed `object` so
  # that a number (--config.sync.min_interval_s=0.2) and 'auto' are both accepted.
  config.sync.min_interval_s = ml_collections.FieldReference('auto', field_type=object)
  config.sync.max_overhead = 0.05  # 'auto': the share of the trainers' examples/sec the rounds may cost.
  config.sync.elastic_alpha = -1.0  # ea: moving rate alpha (< 1/R); negative = the default 0.9 / (R + 1).
  config.sync.block_momentum = -1.0  # bmuf: eta; negative = the default 1 - 1/R.
  config.sync.block_lr = 1.0  # bmuf: zeta, the block learning rate.
  config.sync.nesterov = False  # bmuf: replicas restart from g + eta D instead of g.
  config.sync.what = 'all'  # What a round syncs: 'all' (MLP weights and embedding tables) or 'dense' (MLP only).
  # Where the tables live (docs/design.md §4; model/table_placement.py): 'replicated' (a table per replica),
  # 'shared' (one table per process, a copy on each of its devices, updated every step by all its replicas' gradients),
  # 'sharded' (each table's rows spread over every replica's device of the job, each row held once; lookups and
  # updates are collectives in every step, so the processes step together; rounds sync the dense part alone), or
  # 'auto': 'sharded' for tables above AUTO_SHARDED_TABLE_BYTES (256 MB) when there are several replicas, else
  # 'replicated' (the Criteo configs' choice).
  config.sync.embedding_placement = 'replicated'
  # sharded: how rows reach the replicas that look them up: 'all_gather' (the ids all-gathered, rows
  # reduce-scattered back) or 'all_to_all' (ids to their owners and rows back, one all-to-all each way).
  config.sync.shard_exchange = 'all_gather'

  config.straggler = ml_collections.ConfigDict()
  config.straggler.process = -1  # The process made slower (-1 = none): a straggler, to study sync under one.
  config.straggler.slowdown = (
    1.0  # How many times as long its own steps take (it sleeps before each block; calibrated).
  )
  config.straggler.warmup_steps = 100  # Its first steps after the compiling one, slower than steady ones: not timed.
  config.straggler.calibration_steps = 100  # Then timed, not slowed: their mean is its own step time.

  # Emulated failures and how the run recovers from them (docs/design.md §7, CPR: Maeng et al., MLSys 2021).
  config.recovery = ml_collections.ConfigDict()
  config.recovery.mode = 'none'  # 'none', 'full', 'partial', 'cpr_mfu', 'cpr_ssu' or 'cpr' (chooses): how a run
  # recovers from failures; in one process they are emulated (below), across processes real (a process dies).
  # Mean training steps between failures: the emulation's schedule (exponential gaps, seeded by `seed`); across
  # processes the expected MTBF, which sets the checkpoint interval and `cpr`'s choice.
  config.recovery.mtbf_steps = 1000.0
  config.recovery.failure_target = 'embedding_shard'  # Emulated: what a failure takes down, 'replica' or a shard.
  config.recovery.num_embedding_shards = 4  # S: shard s holds the s-th of S row ranges of every table.
  config.recovery.target_pls = 0.01  # Partial modes: the expected portion of lost samples the interval allows.
  # Checkpoint interval in place of train.checkpoint_every_steps; 0 = chosen (full: Young's; partial: the PLS target).
  config.recovery.checkpoint_every_steps = 0
  # Cost of one save or restore in steps: negative = measured (the time the loop is blocked); > 0 = emulated (the
  # loop is held that many mean step times, scaled by the bytes for partial restores and priority saves).
  config.recovery.save_cost_steps = -1.0
  config.recovery.restore_cost_steps = -1.0
  config.recovery.priority_fraction = 0.1  # cpr_*: the share of embedding rows, most used first, saved often.
  # cpr_*: at most this many bytes a priority save writes a process (the rows' values and optimizer state, every
  # replica's), fewer rows where the share would write more; 0 = the share alone. A tenth of Criteo Kaggle's rows is
  # 216 MB a save, whose copy blocked the loop most of a second; the most used rows take most lookups well before.
  config.recovery.priority_max_bytes = 64 << 20
  # cpr_*: steps between priority saves; 0 = a quarter of the interval until a save's ranking and writing (threads
  # beside training) are timed, then as often as keeps them within `priority_max_overhead` of the time.
  config.recovery.priority_every_steps = 0
  config.recovery.priority_max_overhead = 0.05
  # Partial modes: the share of the time a survivor's host copies of its live state may cost (with incremental
  # checkpoints a copy scans the row stamps: ~0.3 s of one core for a process's 16.9M Kaggle rows, here; a copy every
  # ~0.5 s stepped a partial-recovery run 1.4x slower). Copies then come that much less often: a survivor stuck in a
  # collective with the dead process writes the newest, which is older.
  config.recovery.live_max_overhead = 0.05
  config.recovery.ssu_sample_rate = 0.05  # cpr_ssu: the share of lookups counted.
  # Checkpoints that cost what changed (recovery/incremental.py; Check-N-Run, NSDI 2022): a full baseline, then
  # only the rows written since it, in the background. 'auto': where only the steps change the tables and a full
  # save would block the loop (tables this large); True or False. Typed `object`: 'auto' or a boolean.
  config.recovery.incremental = ml_collections.FieldReference('auto', field_type=object)
  # A new baseline once the rows changed since the last are this share of the table rows: a baseline blocks the loop,
  # a differential does not; a restore reads the tables at most 1 + this share times.
  config.recovery.rebaseline_fraction = 0.5

  # gba / async_sgd (docs/design.md §8; GBA: Su et al., NeurIPS 2022): the server's staleness rule; in one process the
  # emulated worker step times that order the gradients' arrivals (gba/emulated.py); across processes the workers
  # run for real and a thread exchanges their gradients (gba/processes.py; stragglers: straggler.process).
  config.gba = ml_collections.ConfigDict()
  config.gba.staleness_threshold = 2  # gba: gradients at most this stale (g - token) count fully.
  config.gba.staleness_decay = 0.5  # gba: beyond the threshold a gradient is weighted decay ** (excess); 0 = dropped.
  config.gba.step_time_s = 0.01  # Mean emulated seconds of a worker's step.
  config.gba.step_time_jitter = 0.1  # Sigma of the lognormal noise on every step time (0 = all steps equal).
  config.gba.straggler_prob = 0.0  # Chance that a worker's step is a straggler's (its machine is busy).
  config.gba.straggler_slowdown = 4.0  # How many times longer a straggler's step takes.
  config.gba.failure_prob = 0.0  # Chance that a worker fails mid-step: its token is lost, its gradient never sent.
  config.gba.max_in_flight_steps = 1  # Across processes: local steps pushed but not yet received by the server copy
  # before the loop waits (1: push, then pull the server that has it, as a parameter-server worker does; more
  # overlaps computing with the exchange, at the price of staleness).

  config.train = ml_collections.ConfigDict()
  config.train.log_every_steps = 1000  # Steps between scalar writes (loss, examples/sec) to the metric stream.
  # Seconds between them as well (at the first block boundary after); 0 = steps only. A write a second, however fast
  # the steps: every 100 steps was a few writes a second on this CPU and tens on a GPU.
  config.train.log_every_s = 1.0
  # Training steps in one dispatch (a jitted block of K steps over K batches already on the device; blocks end
  # where an event is due), or 'auto': the smallest K whose dispatch is long against the host's own work for it,
  # measured over the first blocks (block_plan.py). Typed `object`: a number or 'auto'.
  config.train.steps_per_dispatch = ml_collections.FieldReference('auto', field_type=object)
  # Blocks of all K steps run a second program, whose loop count is static (parallel/replicas.py): on an H200 the
  # default job 1.23-1.28x the examples a second, on this CPU ~3%, for a second compile of the block at the start
  # (~1 s here). False: every block runs the one program whose count is an argument (a run of a few hundred steps).
  config.train.all_steps_program = True
  config.train.progress_every_s = 5.0  # Seconds between progress lines on stdout.
  config.train.checkpoint_every_steps = 0  # Steps between async orbax saves; 0 = by seconds only (and at the end).
  # Seconds between them (at the first block boundary after; without recovery.mode; processes that step together
  # turn them into common steps once their steps are timed); 0 = by steps only. In seconds by default: a step
  # interval set for one machine saves many times a second on a faster one.
  config.train.checkpoint_every_s = 60.0
  config.train.stop_at_step = 0  # Save and end this process when the stream reaches this step (0 = run to the
  #                                end); rerunning with the same workdir resumes there. For time-sliced jobs, tests.
  config.train.eval_batch_size = 8192  # Examples per forward pass in evaluation.
  config.train.eval_per_replica = False  # Also evaluate every replica alone (summary: eval_ne_per_replica).
  return config


def min_interval_from_text(text: str) -> float | str:
  """`sync.min_interval_s` from a flag's text: 'auto', or seconds >= 0; ConfigError otherwise."""
  if text == 'auto':
    return text
  try:
    seconds = float(text)
  except ValueError:
    seconds = -1.0
  if not (math.isfinite(seconds) and seconds >= 0):
    raise ConfigError(f"sync.min_interval_s={text!r} must be 'auto' (paced to sync.max_overhead) or seconds >= 0.")
  return seconds


def resolve(config: ml_collections.ConfigDict, num_processes: int = 1) -> ml_collections.ConfigDict:
  """`config` with the values the run decides filled in (a copy): `num_replicas=0` becomes one per process, the
  placement 'auto' a placement (`auto_placement`), and data lengths of 0 the whole of the data (`data.lengths`:
  the rows of the Criteo files or prepared splits are counted). Data that cannot be found is left for `validate` to
  name; lengths the data cannot give raise ConfigError."""
  resolved = ml_collections.ConfigDict(config.to_dict())
  if resolved.get('num_replicas') == 0:
    resolved.num_replicas = num_processes
  sync = resolved.get('sync')
  if sync is not None and sync.get('embedding_placement') == 'auto':
    sync.embedding_placement = auto_placement(resolved)
  data = resolved.get('data')
  if data is not None and 0 in (data.num_train_examples, data.num_eval_examples) and _data_found(data):
    try:
      stream = lengths.resolve(data)
    except ValueError as error:
      raise ConfigError(str(error)) from error
    data.num_train_examples, data.num_eval_examples = stream.num_train, stream.num_eval
  return resolved


def auto_placement(config: ml_collections.ConfigDict) -> str:
  """What `sync.embedding_placement='auto'` means for `config`: 'sharded' where a copy of the tables per replica
  would be large, 'replicated' otherwise."""
  try:
    table_bytes = int(sum(config.data.cardinalities)) * int(config.model.embedding_dim) * 4
  except (TypeError, ValueError):
    return 'replicated'  # Validation names the bad value.
  return 'sharded' if table_bytes > AUTO_SHARDED_TABLE_BYTES and config.num_replicas > 1 else 'replicated'


def _data_found(data: ml_collections.ConfigDict) -> bool:
  """Whether the data the `data` section names is there to be measured (validation names what is missing)."""
  try:
    _check_data_source(data)
  except ConfigError:
    return False
  return True


def validate(config: ml_collections.ConfigDict, num_devices: int | None, num_processes: int = 1) -> None:
  """Raises ConfigError naming the first bad key; returns quietly when the config is runnable by a job of
  `num_processes` processes with `num_devices` devices in all (evenly spread over the processes). With
  `num_devices=None` (before the runtime is up) every check but the devices' runs."""
  _check_known_keys(config)
  _check_data_source(config.data)
  config = resolve(config, num_processes)
  _check_data(config)
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


def flat_keys(config: ml_collections.ConfigDict, prefix: str = '') -> dict[str, Any]:
  """{'data.source': 'synthetic', ...}: every leaf of `config` by its dotted key."""
  flat = {}
  for key, value in config.items():
    name = f'{prefix}{key}'
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(flat_keys(value, name + '.'))
    else:
      flat[name] = value
  return flat


def _check_known_keys(config: ml_collections.ConfigDict) -> None:
  known, given = flat_keys(base_config()), flat_keys(config)
  for key in given:
    if key not in known:
      nearest = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
      hint = f'did you mean {nearest[0]!r}?' if nearest else 'every key is in shadowsync_jax/config.py (base_config).'
      raise ConfigError(f'unknown config key {key!r}; {hint}')
  for key in known:
    if key not in given:
      raise ConfigError(f'config key {key!r} is missing; start configs from config.base_config().')


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


def _check_data_source(data: ml_collections.ConfigDict) -> None:
  """The source and the files or prepared dataset it reads: there, and of the right kind."""
  readers = data.readers
  if readers != 'auto' and not (isinstance(readers, int) and not isinstance(readers, bool) and readers >= 1):
    raise ConfigError(f"data.readers={readers!r} must be 'auto' or an integer >= 1.")
  if data.reader_processes not in ('auto', True, False):
    raise ConfigError(f"data.reader_processes={data.reader_processes!r} must be 'auto', True or False.")
  if data.generator not in ('auto', 'host', 'device'):
    raise ConfigError(f"data.generator={data.generator!r} must be 'auto', 'host' or 'device'.")
  if data.generator == 'device' and data.source != 'synthetic':
    raise ConfigError(
      f"data.generator='device' makes the synthetic stream; data.source={data.source!r} is read on "
      "the host (data.generator='auto' or 'host')."
    )
  if data.source not in DATA_SOURCES:
    raise ConfigError(f'data.source={data.source!r} is not one of {", ".join(DATA_SOURCES)}.')
  if data.source == 'criteo':
    if not data.train_path:
      raise ConfigError(
        "data.train_path must name Criteo TSV file(s) when data.source='criteo' (--config.data.train_path=FILE)."
      )
    for key in ('data.train_path', 'data.eval_path'):
      value = _get(data, key.split('.', 1)[1])
      for path in criteo_files.split_paths(value):
        named = f'{key}={path!r}' if path == value else f'{key}={value!r}: {path!r}'
        if not os.path.isfile(path):
          raise ConfigError(f'{named}: no such file (from {os.getcwd()}); give the path of a Criteo TSV file.')
        if criteo_files.is_gzip(path):
          raise ConfigError(
            f'{named} is gzip-compressed and cannot be read at random; prepare it once '
            "(python -m experiments.prepare_criteo) and train with data.source='prepared'."
          )
  if data.source == 'prepared':
    if not data.prepared_dir:
      raise ConfigError(
        "data.prepared_dir must name a prepared dataset when data.source='prepared' "
        '(what python -m experiments.prepare_criteo wrote).'
      )
    try:
      version_dir = prepared_manifest.find(data.prepared_dir)
      manifest = prepared_manifest.read(version_dir)
    except (OSError, ValueError) as error:
      raise ConfigError(f'data.prepared_dir={data.prepared_dir!r}: {error}') from error
    for key in ('data.train_split', 'data.eval_split'):
      split = _get(data, key.split('.', 1)[1])
      if (split or key == 'data.train_split') and split not in manifest['splits']:
        raise ConfigError(f'{key}={split!r} is not a split of {version_dir}; it has {", ".join(manifest["splits"])}.')
    try:
      prepared_manifest.check_cardinalities(manifest, data.cardinalities, version_dir)
    except ValueError as error:
      raise ConfigError(str(error)) from error


def _check_data(config: ml_collections.ConfigDict) -> None:
  data = config.data
  for key in ('data.num_train_examples', 'data.num_eval_examples'):
    if _get(config, key) < 0:
      raise ConfigError(f'{key}={_get(config, key)} must be >= 0 (0 = all of the data).')
  if data.num_eval_examples == 0:  # Still 0 once resolved: the held-out data has no row.
    raise ConfigError('data.num_eval_examples=0: the held-out file or split has no row to evaluate on.')
  cardinalities = list(data.cardinalities)
  if len(cardinalities) != NUM_SPARSE_FEATURES or any(int(c) < 1 for c in cardinalities):
    raise ConfigError(f'data.cardinalities must be {NUM_SPARSE_FEATURES} positive table sizes, got {cardinalities}.')
  if sum(int(c) for c in cardinalities) > MAX_TOTAL_ROWS:
    raise ConfigError(
      f'data.cardinalities hold {sum(int(c) for c in cardinalities):,} rows in all, more than the '
      f'{MAX_TOTAL_ROWS:,} that int32 row ids address in the concatenated table (Criteo Terabyte: 0.88 billion).'
    )
  if data.zipf_exponent < 0:
    raise ConfigError(f'data.zipf_exponent={data.zipf_exponent} must be >= 0.')
  if data.drift < 0:
    raise ConfigError(f'data.drift={data.drift} must be >= 0.')


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
