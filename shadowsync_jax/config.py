"""The configuration schema: every key a run accepts, its default, what a run resolves, and its validation.

  config = config_lib.base_config()          # every key, with defaults
  config.num_replicas = 8                    # experiments/configs/*.py override it
  config = config_lib.resolve(config, num_processes=jax.process_count())   # num_replicas=0: one per process
  config_lib.validate(config, num_devices=len(jax.devices()))   # ConfigError naming the key, or None
  config_lib.auto_placement(config)          # what a setting means: the placement 'auto' picks

Experiment configs (`experiments/configs/*.py`) start from `base_config()` and change values, so every config has
every key (docs/design.md §9) and a typo in a config file or a `--config.KEY=VALUE` override is caught here, by name.
What each key may hold is checked in `config_checks` (the data section's files and lengths by `data.checks`), whose
names this module hands on: callers import `config` alone. The library below takes sections or plain values, never a
whole config: only the top (`cli`, `train`, `studies`, the binaries) reads one.
"""

import difflib
import math
from typing import Any

import ml_collections

from shadowsync_jax import config_checks
from shadowsync_jax.config_checks import DATA_SOURCES
from shadowsync_jax.config_checks import EMBEDDING_OPTIMIZERS
from shadowsync_jax.config_checks import EMBEDDING_PLACEMENTS
from shadowsync_jax.config_checks import FAILURE_TARGETS
from shadowsync_jax.config_checks import INTERACTIONS
from shadowsync_jax.config_checks import MAX_TOTAL_ROWS
from shadowsync_jax.config_checks import MLP_OPTIMIZERS
from shadowsync_jax.config_checks import PARAMETER_SERVER_ALGORITHMS
from shadowsync_jax.config_checks import PARTIAL_RECOVERY_MODES
from shadowsync_jax.config_checks import RECOVERY_MODES
from shadowsync_jax.config_checks import SHARD_EXCHANGES
from shadowsync_jax.config_checks import SYNCED_PARAMS
from shadowsync_jax.config_checks import ConfigError
from shadowsync_jax.config_checks import shadow_algorithms
from shadowsync_jax.config_checks import sync_algorithms
from shadowsync_jax.data import lengths
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES

__all__ = [  # The checks' names too: callers know one module, `config`.
  'AUTO_SHARDED_TABLE_BYTES',
  'CRITEO_SHAPED_CARDINALITIES',
  'DATA_SOURCES',
  'EMBEDDING_OPTIMIZERS',
  'EMBEDDING_PLACEMENTS',
  'FAILURE_TARGETS',
  'INTERACTIONS',
  'MAX_TOTAL_ROWS',
  'MLP_OPTIMIZERS',
  'NUM_SPARSE_FEATURES',
  'PARAMETER_SERVER_ALGORITHMS',
  'PARTIAL_RECOVERY_MODES',
  'RECOVERY_MODES',
  'SHARD_EXCHANGES',
  'SYNCED_PARAMS',
  'ConfigError',
  'auto_placement',
  'base_config',
  'flat_keys',
  'min_interval_from_text',
  'resolve',
  'shadow_algorithms',
  'sync_algorithms',
  'validate',
]

# 'auto' shards tables of more bytes than this (one copy of all 26) when there are several replicas.
AUTO_SHARDED_TABLE_BYTES = 256 << 20
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
  # Partial modes: the expected portion of lost samples the checkpoint interval allows the failed part, and again
  # the survivors (across processes a survivor stuck behind the dead one goes back to its newest checkpoint or copy).
  config.recovery.target_pls = 0.01
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
  # Partial modes: the share of the time a survivor's host copies of its live state may cost, at most. Copies come
  # only where the checkpoints are further apart than `target_pls` allows the survivors (none with two processes),
  # and no more often than this allows (with incremental checkpoints a copy gathers the rows changed since the
  # baseline: ~0.1 s of one core at Criteo Kaggle's size).
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
    config_checks.check_data_source(data)
  except ConfigError:
    return False
  return True


def validate(config: ml_collections.ConfigDict, num_devices: int | None, num_processes: int = 1) -> None:
  """Raises ConfigError naming the first bad key; returns quietly when the config is runnable by a job of
  `num_processes` processes with `num_devices` devices in all (evenly spread over the processes). With
  `num_devices=None` (before the runtime is up) every check but the devices' runs (`config_checks`)."""
  _check_known_keys(config)
  config_checks.check_data_source(config.data)
  config_checks.check(resolve(config, num_processes), num_devices, num_processes)


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
