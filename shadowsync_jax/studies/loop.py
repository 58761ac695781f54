r"""Whether the training loop feeds its step (docs/design.md §13): the step alone, the whole loop, and the loop
around a step that does no work, timed in one run.

  from experiments.configs import default
  results = loop.run({'default': default.get_config}, repeats=3, root='/tmp/loop')   # one dict a config
  print(loop.table(results))

For each config (`benchmarks.loop`: the default one, and Criteo Kaggle's at its real cardinalities on the synthetic
stream), on one replica, with every other setting the config's own, `repeats` times in turn:

- (b) the loop: `train.train_and_evaluate` as a user runs it, in this process, with `train.steps_per_dispatch`
  at its default ('auto'); its `examples_per_sec` (every step after the first block, the data read and placed
  while the blocks train, the hooks at every boundary);
- (a) the step alone: the same block program (`dispatch.make_train_block`, the K that (b) chose) dispatched back to
  back on blocks of the same stream already on the device, as many steps as (b) trained: what the device can do,
  nothing else;
- (c) the host's ceiling: (b) again with a block program that does no work (it returns the state it was given),
  at the same K: how many examples a second the loop and its input can feed;
- (b') the loop again on the stream read into memory before training (K chosen anew): what the loop costs without
  its input's reading, so that (b') - (b) is the reading's share on this machine.

The ratio (b)/(a) of each repeat is read as the loop's share of its step, its median with the range over the repeats;
(c) in examples/sec. Each run (its directory deleted after, its summary kept) trains `num_train_examples` of the stream
and evaluates on `num_eval_examples` (both smaller than the configs' own, said in the note).
"""

from collections.abc import Callable, Mapping
import functools
import gc
import os
import pathlib
import shutil
import statistics
import subprocess
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from shadowsync_jax import config as config_lib
from shadowsync_jax import dispatch
from shadowsync_jax import train
from shadowsync_jax.data import input_pipeline
from shadowsync_jax.parallel import children
from shadowsync_jax.parallel import replicas
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import result_files

TARGET_LOOP_SHARE = 0.9  # (b) >= 0.9 (a) (issue 42).
TARGET_CEILING = 5_000_000  # (c) >= 5M examples/s for the synthetic stream,
TARGET_CEILING_PREPARED = 2_000_000  # >= 2M for prepared Criteo data, a process.
# The headline's targets (the loop's share of its step alone; the ceilings of the synthetic stream, prepared data).
TARGET = {'share': TARGET_LOOP_SHARE, 'ceiling': TARGET_CEILING, 'ceiling_prepared': TARGET_CEILING_PREPARED}
_DEVICE_BLOCKS = 64  # Blocks (a) places on the device, and cycles.


def one_replica(make_config: Callable[[], ml_collections.ConfigDict], num_train: int, num_eval: int):
  """The config `make_config` gives, on one replica, with these stream lengths."""
  config = make_config()
  config.num_replicas = 1
  config.data.num_train_examples = num_train
  config.data.num_eval_examples = num_eval
  return config


def time_step_alone(config, steps_per_dispatch: int, timed_steps: int) -> float:
  """(a): examples/sec of `dispatch.make_train_block`'s program (all `config.num_replicas` replicas, on this process's
  devices) on full blocks of K steps already on the device, about `timed_steps` steps (as many as the loop timed),
  the first `_DEVICE_BLOCKS` blocks of the stream cycled."""
  config = config_lib.resolve(config)
  meshes = replicas.make_meshes(config.num_replicas)
  state = train.init_replicated_state(config, meshes)
  train_block = dispatch.make_train_block(config, meshes)
  num_replicas = config.num_replicas  # All of them on this process's devices.
  read, available = _block_reader(config, steps_per_dispatch)
  blocks = [
    replicas.shard(read(i * steps_per_dispatch, steps_per_dispatch, steps_per_dispatch), meshes.local)
    for i in range(max(1, min(_DEVICE_BLOCKS, available)))
  ]
  steps_L = replicas.shard(np.full(num_replicas, steps_per_dispatch, np.int32), meshes.local)
  for block in blocks[:2]:  # Compile, warm up. Full blocks: the program of all K steps, as the loop's full blocks.
    state, metrics = train_block(state, block, steps_L, full=True)
  jax.block_until_ready((state, metrics))
  num_blocks = max(1, timed_steps // steps_per_dispatch)
  started = time.perf_counter()
  for i in range(num_blocks):
    state, metrics = train_block(state, blocks[i % len(blocks)], steps_L, full=True)
  jax.block_until_ready((state, metrics))
  seconds = time.perf_counter() - started
  del state, blocks
  return num_blocks * steps_per_dispatch * num_replicas * config.batch_size / seconds


def _block_reader(config, steps_per_dispatch: int, replicas_read: range | None = None):
  """`read(first_step, num_steps, block_steps)` of the training stream's blocks of `replicas_read` (default: all of
  `config.num_replicas`), as the loop reads them, and how many blocks of K steps the stream holds."""
  source, _ = input_pipeline.make_sources(config.data, config.seed)
  read = functools.partial(
    input_pipeline.read_block, source, config.num_replicas, config.batch_size, replicas=replicas_read
  )
  return read, input_pipeline.num_steps(len(source), config.num_replicas, config.batch_size) // steps_per_dispatch


def time_block_reading(config, steps_per_dispatch: int, timed_steps: int, replicas_read: range) -> float:
  """(d): examples/sec of reading the blocks of `replicas_read` (of all `config.num_replicas`) from the stream on this
  thread, as the loop's reader reads them (`input_pipeline.read_block`: generated or read, checked, laid out), about
  `timed_steps` steps of the stream from its start: what the input costs the cores it runs on."""
  input_pipeline.pin_blas_threads()  # As the loop's readers run.
  read, available = _block_reader(config_lib.resolve(config), steps_per_dispatch, replicas_read)
  num_blocks = max(1, min(timed_steps // steps_per_dispatch, available))
  read(0, steps_per_dispatch, steps_per_dispatch)  # Warm: the source's caches, the allocator.
  started = time.perf_counter()
  for i in range(num_blocks):
    read(i * steps_per_dispatch, steps_per_dispatch, steps_per_dispatch)
  seconds = time.perf_counter() - started
  return num_blocks * steps_per_dispatch * len(replicas_read) * config.batch_size / seconds


def _make_no_work_block(config, meshes, between=None):
  """A block program that trains nothing: the state back as it came (donated), zero losses (for a run without fused
  rounds: `between` None)."""
  del config, meshes
  if between is not None:
    raise ValueError('the no-work block has no fused rounds: time it on an algorithm without them.')

  @functools.partial(jax.jit, donate_argnums=0)
  def nothing(state_L, block_L, steps_L):
    del steps_L
    return state_L, {'loss': jnp.zeros(block_L.label.shape[:2], jnp.float32)}

  return lambda state_L, block_L, steps_L, full=False: nothing(state_L, block_L, steps_L)  # One program.


def time_loop(config, workdir: pathlib.Path, no_work: bool = False, in_memory: bool = False) -> dict[str, Any]:
  """(b), with `no_work` (c), with `in_memory` (b': `data.in_memory`): the summary of `train.train_and_evaluate` on
  `config`."""
  config.data.in_memory = in_memory
  try:
    return train.train_and_evaluate(config, workdir, make_block=_make_no_work_block if no_work else None)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)  # Its checkpoints: 2.2 GB a run at Kaggle's size; the summary is kept.
    gc.collect()


def run(
  configs: Mapping[str, Callable[[], ml_collections.ConfigDict]],
  repeats: int,
  root: str | pathlib.Path,
  num_train_examples: Mapping[str, int],
  num_eval_examples: int = 16_384,
) -> dict[str, dict[str, Any]]:
  """Every config's (a), (b), (c), `repeats` times in turn (module docstring); `num_train_examples` by config."""
  root = pathlib.Path(root)
  results = {}
  for name, make_config in configs.items():
    make = functools.partial(one_replica, make_config, num_train_examples[name], num_eval_examples)
    runs = []
    for repeat in range(repeats):
      loop = time_loop(make(), root / f'{name}_loop_{repeat}')
      steps_per_dispatch = loop['steps_per_dispatch']
      step_alone = time_step_alone(make(), steps_per_dispatch, loop['train_steps'])
      gc.collect()
      no_work_config = make()
      no_work_config.train.steps_per_dispatch = steps_per_dispatch
      ceiling = time_loop(no_work_config, root / f'{name}_no_work_{repeat}', no_work=True)
      in_memory = time_loop(make(), root / f'{name}_in_memory_{repeat}', in_memory=True)
      runs.append(
        {
          'steps_per_dispatch': steps_per_dispatch,
          'dispatch_host_s': loop['dispatch_host_s'],
          'dispatch_step_s': loop['dispatch_step_s'],
          'step_alone_examples_per_sec': step_alone,
          'loop_examples_per_sec': loop['examples_per_sec'],
          'no_work_examples_per_sec': ceiling['examples_per_sec'],
          'loop_share': loop['examples_per_sec'] / step_alone,
          'in_memory_examples_per_sec': in_memory['examples_per_sec'],
          'in_memory_share': in_memory['examples_per_sec'] / step_alone,
          'eval_ne': loop['eval_ne'],
        }
      )
      print(f'{name} repeat {repeat}: {runs[-1]}', flush=True)
    shares = [r['loop_share'] for r in runs]
    results[name] = {
      'config': name,
      'batch_size': make().batch_size,
      'num_train_examples': num_train_examples[name],
      'num_eval_examples': num_eval_examples,
      'runs': runs,
      'loop_share_median': statistics.median(shares),
      'loop_share_range': [min(shares), max(shares)],
      'no_work_examples_per_sec_median': statistics.median(r['no_work_examples_per_sec'] for r in runs),
      'source': make().data.source,
      'backend': jax.default_backend(),
    }
  return results


def _verdict(low: float, high: float, target: float) -> str:
  if low >= target:
    return 'met'
  return 'within noise' if high >= target else 'not met'


def table(results: dict[str, dict[str, Any]]) -> str:
  """A row a config: K, the three figures (medians), the loop's share of its step (median, range) and the
  verdicts against the targets."""
  lines = [
    "| config | batch | K | (a) step alone, ex/s | (b) loop, ex/s | (b)/(a) (range) | (b')/(a): stream in memory "
    '| (c) no-work loop, ex/s | (a) with (d), the reading, on the same cores: /(a) |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for result in results.values():
    runs, (low, high) = result['runs'], result['loop_share_range']
    alone = statistics.median(r['step_alone_examples_per_sec'] for r in runs)
    whole = statistics.median(r['loop_examples_per_sec'] for r in runs)
    ceiling = result['no_work_examples_per_sec_median']
    ks = ', '.join(map(str, sorted({r['steps_per_dispatch'] for r in runs})))
    row = (
      f'| {result["config"]} | {result["batch_size"]} | {ks} | {alone:,.0f} | {whole:,.0f} | '
      f'{result["loop_share_median"]:.2f} ({low:.2f}-{high:.2f}; target {TARGET_LOOP_SHARE}: '
      f'{_verdict(low, high, TARGET_LOOP_SHARE)}) |'
    )
    memory = [r['in_memory_share'] for r in runs]
    in_memory = f'{statistics.median(memory):.2f} ({min(memory):.2f}-{max(memory):.2f})'
    if ceiling is None:  # A job: (c) is not timed, (d) is.
      reading = [r['with_reading_share'] for r in runs if 'with_reading_share' in r]
      with_reading = f'{statistics.median(reading):.2f} ({min(reading):.2f}-{max(reading):.2f})' if reading else '-'
      lines.append(f'{row} {in_memory} | - | {with_reading} |')
      continue
    target = TARGET_CEILING_PREPARED if result.get('source') == 'prepared' else TARGET_CEILING
    verdict = _verdict(ceiling, 0, target)
    lines.append(f'{row} {in_memory} | {ceiling:,.0f} (target {target / 1e6:.0f}M: {verdict}) | - |')
  return '\n'.join(lines)


def _streams(results: dict[str, dict[str, Any]]) -> str:
  prepared = [r['config'] for r in results.values() if r.get('source') == 'prepared']
  if not prepared:
    return 'the synthetic stream'
  return f'the synthetic stream ({", ".join(prepared)}: prepared Criteo-format data, read from disk)'


def note(results: dict[str, dict[str, Any]], repeats: int, changed: str) -> str:
  """The settings under the table: `changed` says what the binary changed in the configs."""
  lengths = ', '.join(
    f'{r["config"]} {r["num_train_examples"]:,}' for name, r in results.items() if not name.startswith('job')
  )
  held_out = next(iter(results.values()))['num_eval_examples']
  return (
    f'One replica on {jax.default_backend()}, {_streams(results)}; {repeats} repeats of (b) the whole loop '
    "(`train.train_and_evaluate`, `train.steps_per_dispatch='auto'`, everything else the config's own), (a) its "
    'block program alone at the K (b) chose, on blocks already on the device, and (c) the loop at that K around a '
    f'block that does no work. Changed from the configs: num_replicas=1; the training stream shortened ({lengths} '
    f'examples), {held_out:,} held-out examples; {changed}. (b)/(a) per repeat: median and range.' + _job_note(results)
  )


def _job_note(results: dict[str, dict[str, Any]]) -> str:
  algorithms = [r['algorithm'] for name, r in results.items() if name.startswith('job')]
  if not algorithms:
    return ''
  return (
    f' The job ({JOB_PROCESSES} processes x {JOB_DEVICES} devices, `experiments.launch --pin_cpus`, '
    f"`sync.algorithm` {' and '.join(algorithms)} in turn, the default config otherwise): (b) its summary's "
    "examples/sec (the processes' sum), (a) the block program of each process's replicas alone at the K (b) chose, "
    "the processes run at once, pinned as the launcher pins them, (b') the job again with `data.in_memory` (every "
    'process reads the whole stream into memory before training); (c) is not timed for a job; (d) each process '
    "reading its replicas' blocks of the stream alone (`input_pipeline.read_block`, on its cores), and (a) with (d) "
    'the most a process trains when its cores also read its stream, 1 / (1/(a) + 1/(d)) summed over the processes '
    '(a bound for (b) where no core is spare).'
  )


# A job of processes: 8 replicas as 2 processes x 4 devices with each shadow algorithm, and with `none` (the same job
# without rounds: what the rounds cost it, beside what the loop does).

JOB_PROCESSES, JOB_DEVICES = 2, 4
JOB_ALGORITHMS = ('shadow_ma', 'none', 'shadow_ea', 'shadow_bmuf')


def time_job_loop(
  algorithm: str, num_train_examples: int, workdir: pathlib.Path, in_memory: bool = False
) -> dict[str, Any]:
  """(b) of the job (with `in_memory`, (b'): `data.in_memory`, every process holding the stream): `experiments.launch`
  with every process pinned to its share of the cores, as a user runs it; its summary (`examples_per_sec`: the
  processes' sum)."""
  job = jobs.launch(
    jobs.fresh(workdir),
    [f'--num_processes={JOB_PROCESSES}', f'--cpu_devices={JOB_DEVICES}', '--pin_cpus'],
    [
      f'--config.num_replicas={JOB_PROCESSES * JOB_DEVICES}',
      f'--config.sync.algorithm={algorithm}',
      f'--config.data.num_train_examples={num_train_examples}',
      '--config.data.num_eval_examples=16384',
      f'--config.data.in_memory={in_memory}',
    ],
  )
  shutil.rmtree(workdir, ignore_errors=True)
  return job.summary


def time_job_step_alone(process_command: list[str]) -> tuple[float, float]:
  """(a) of the job, and (a) with (d) after it on the same cores: `process_command` (a process that prints its
  replicas' (a) and (d), `time_step_alone` and `time_block_reading` at the job's K, as its last line) started once a
  process of the job (`--process_index`), each pinned to its share of the cores as `--pin_cpus` pins them, all at
  once; the sums over the processes. A process whose cores also read its stream trains at most 1 / (1/a + 1/d)."""
  shares = [children.cpu_share(p, JOB_PROCESSES) for p in range(JOB_PROCESSES)]
  running = [
    subprocess.Popen(
      [*process_command, f'--process_index={p}'],
      stdout=subprocess.PIPE,
      text=True,
      preexec_fn=functools.partial(os.sched_setaffinity, 0, share),
    )
    for p, share in enumerate(shares)
  ]
  outputs = [process.communicate()[0] for process in running]
  for process, output in zip(running, outputs):
    if process.returncode != 0:
      raise RuntimeError(f'{" ".join(process_command)} failed ({process.returncode}): {output[-2000:]}')
  rates = [tuple(map(float, output.strip().splitlines()[-1].split())) for output in outputs]
  return sum(step for step, _ in rates), sum(1 / (1 / step + 1 / reading) for step, reading in rates)


def run_job(
  repeats: int, num_train_examples: int, root: pathlib.Path, process_command: list[str]
) -> dict[str, dict[str, Any]]:
  """The job's (b), (b'), (a) and (a) with (d) for each of `JOB_ALGORITHMS`, in turn within each of `repeats` repeats
  (so that each pair ran minutes apart); a row of `table` each, keyed 'job' (the first) and 'job_ALGORITHM' ((c) is
  not timed for a job). `process_command` with `--process_step_alone=STEPS --process_k=K --process_algorithm=NAME
  --process_index=P` prints process P's (a) and (d)."""
  runs = {algorithm: [] for algorithm in JOB_ALGORITHMS}
  for repeat in range(repeats):
    for algorithm, algorithm_runs in runs.items():
      loop = time_job_loop(algorithm, num_train_examples, pathlib.Path(root) / f'job_{algorithm}_{repeat}')
      in_memory = time_job_loop(
        algorithm, num_train_examples, pathlib.Path(root) / f'job_{algorithm}_in_memory_{repeat}', in_memory=True
      )
      steps, per_dispatch = loop['train_steps'], loop['steps_per_dispatch']
      step_alone, with_reading = time_job_step_alone(
        [
          *process_command,
          f'--process_step_alone={steps}',
          f'--process_k={per_dispatch}',
          f'--process_algorithm={algorithm}',
        ]
      )
      algorithm_runs.append(
        {
          'steps_per_dispatch': per_dispatch,
          'step_alone_examples_per_sec': step_alone,
          'loop_examples_per_sec': loop['examples_per_sec'],
          'loop_share': loop['examples_per_sec'] / step_alone,
          'in_memory_examples_per_sec': in_memory['examples_per_sec'],
          'in_memory_share': in_memory['examples_per_sec'] / step_alone,
          'with_reading_examples_per_sec': with_reading,
          'with_reading_share': with_reading / step_alone,
          'sync_rounds': loop['sync_rounds'],
          'eval_ne': loop['eval_ne'],
        }
      )
      print(f'job {algorithm} repeat {repeat}: {algorithm_runs[-1]}', flush=True)
  return {
    ('job' if algorithm == JOB_ALGORITHMS[0] else f'job_{algorithm}'): _job_row(
      algorithm, algorithm_runs, num_train_examples
    )
    for algorithm, algorithm_runs in runs.items()
  }


def _job_row(algorithm: str, runs: list[dict[str, Any]], num_train_examples: int) -> dict[str, Any]:
  shares = [r['loop_share'] for r in runs]
  return {
    'config': f'default, {JOB_PROCESSES} x {JOB_DEVICES} replicas, {algorithm}',
    'algorithm': algorithm,
    'batch_size': config_lib.base_config().batch_size,  # The job runs experiments.train's default config.
    'num_train_examples': num_train_examples,
    'num_eval_examples': 16_384,
    'runs': runs,
    'loop_share_median': statistics.median(shares),
    'loop_share_range': [min(shares), max(shares)],
    'no_work_examples_per_sec_median': None,
    'backend': jax.default_backend(),
  }


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): the loop's share of its step alone, config by config, and
  what a step that does no work is fed, against `TARGET`."""
  rows = result_files.rows(path)
  shares = []
  for name, row in rows.items():
    low, high = row['loop_share_range']
    what, bound = f'the {name} config', ''
    if name.startswith('job'):
      what = f'{JOB_PROCESSES} processes x {JOB_DEVICES} devices with {row["algorithm"]}'
      reading = [r['with_reading_share'] for r in row['runs'] if 'with_reading_share' in r]
      if reading:  # (a) with (d): the most it could train with its stream read on the same cores.
        bound = f'; its stream read on the same cores bounds it at {statistics.median(reading):.2f}'
    shares.append(
      f'{row["loop_share_median"]:.2f} ({low:.2f} to {high:.2f}) for {what} (target {TARGET["share"]:g}: '
      f'{result_files.verdict(low, high, TARGET["share"])}{bound})'
    )
  ceilings = {False: [], True: []}  # By whether the source is prepared data (its own target).
  for row in rows.values():
    if row['no_work_examples_per_sec_median'] is not None:  # None: a job, whose ceiling is not timed.
      ceilings[row.get('source') == 'prepared'].append(row['no_work_examples_per_sec_median'])
  fed = []
  for prepared, figures in ceilings.items():
    if figures:
      goal = TARGET['ceiling_prepared' if prepared else 'ceiling']
      what = 'prepared data' if prepared else 'the synthetic stream'
      span = f'{min(figures):,.0f}' if len(figures) == 1 else f'{min(figures):,.0f} to {max(figures):,.0f}'
      verdict = result_files.verdict(min(figures), max(figures), goal)
      fed.append(f'{span} examples/s of {what} (target {goal / 1e6:g}M: {verdict})')
  return (
    f'one replica, the whole loop at {", ".join(shares)} of its own step alone; with a step that does no work it '
    f'feeds {" and ".join(fed)}'
  )
