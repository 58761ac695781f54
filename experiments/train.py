r"""Trains a DLRM on R replicas and evaluates it: the framework's main binary.

  python -m experiments.train --workdir=/tmp/run [--config=experiments/configs/default.py] \
      [--config.num_replicas=8 --config.sync.algorithm=sync_sgd ...]

Rerunning with the same --workdir resumes from its newest checkpoint. Results: WORKDIR/summary.json,
WORKDIR/metrics.jsonl and TensorBoard events (`tensorboard --logdir=WORKDIR`).

One process of a multi-process job (`experiments.launch` starts them on one machine; BUILD.md shows several hosts):

  python -m experiments.train --coordinator_address=HOST0:PORT --num_processes=N --process_id=I --workdir=... \
      [--config.num_replicas=R ...]     # every process: the same flags but its own --process_id

A config the schema refuses (an unknown key, a bad value, a replica count that does not fit, a missing data file)
prints one line, `error: ...`, and exits with status 2 (`shadowsync_jax.cli`).
"""

# ruff: noqa: E402  (the imports follow the start's timestamp)
import time

_STARTED_AT = time.time()  # Before the imports: this interpreter's start, whatever a wrapping shell did before it.

import contextlib
import faulthandler
import json
import os
import signal
import sys

from absl import app
from absl import flags
from absl import logging
import jax

from shadowsync_jax import cli
from shadowsync_jax import config as config_lib

flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and summary.json.', required=True)
flags.DEFINE_integer(
  'cpu_devices',
  8,
  'Virtual devices to create when running on CPU (each hosts one replica); per process in a multi-process job.',
)
flags.DEFINE_string('coordinator_address', None, 'host:port of process 0, for a job of several processes.')
flags.DEFINE_integer('num_processes', 1, 'Processes in the job (jax.distributed); 1 = this process alone.')
flags.DEFINE_integer('process_id', 0, "This process's index in the job, 0 .. num_processes - 1.")
flags.DEFINE_float(
  'peer_timeout_s',
  30.0,
  'Stop when another process of the job has given no sign of life for this long (it died, was killed or hangs).',
)
flags.DEFINE_bool(
  'start_coordinator',
  True,
  "Process 0 starts the coordination service (JAX's way); false where it runs apart (experiments.coordinator), "
  'so that process 0 may die without the others.',
)
flags.DEFINE_string(
  'compilation_cache_dir',
  None,
  'JAX persistent compilation cache, so that a restarted job does not compile again (default: '
  '$JAX_COMPILATION_CACHE_DIR if set, else WORKDIR/compilation_cache; empty: none, and no WORKDIR/programs either).',
)
flags.DEFINE_bool(
  'standby',
  False,
  'Warm standby (experiments.launch starts the next start of a job ahead): import everything, then wait for one '
  'line on stdin, JSON {"environment": {...}}, before joining the job.',
)
cli.define_config_flag('experiments/configs/default.py')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO; keep the console to progress and results.
    logging.set_verbosity(logging.WARNING)
  faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` prints every thread's stack.
  if FLAGS.num_processes > 1 and not FLAGS.coordinator_address:
    cli.exit_with_usage_error('--num_processes > 1 needs --coordinator_address=HOST:PORT (of process 0).')
  # Everything but the device count is checked before the job forms: a refused config stops each process alone.
  config_lib.validate(FLAGS.config, num_devices=None, num_processes=FLAGS.num_processes)
  jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  from shadowsync_jax import train  # pylint: disable=g-import-not-at-top  (after the device count is set)
  from shadowsync_jax.parallel import compilation_cache  # pylint: disable=g-import-not-at-top
  from shadowsync_jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  from shadowsync_jax.parallel import program_store  # pylint: disable=g-import-not-at-top
  from shadowsync_jax.parallel.exit_codes import UNRECOVERABLE  # pylint: disable=g-import-not-at-top
  from shadowsync_jax.recovery import real as real_failures  # pylint: disable=g-import-not-at-top

  if FLAGS.num_processes == 1:  # The device count too, before a private API's version warning can print.
    config_lib.validate(FLAGS.config, num_devices=jax.device_count(), num_processes=1)
  cache_dir = compilation_cache.directory_for(FLAGS.compilation_cache_dir, f'{FLAGS.workdir}/compilation_cache')
  if cache_dir:
    compilation_cache.enable(cache_dir, FLAGS.process_id)
  if FLAGS.standby:
    _wait_to_join()
  if FLAGS.num_processes > 1:
    distributed.initialize(
      FLAGS.coordinator_address,
      FLAGS.num_processes,
      FLAGS.process_id,
      FLAGS.peer_timeout_s,
      start_service=FLAGS.start_coordinator,
    )
  # Beside the cache, its compiled programs themselves: a restart of this workdir neither traces nor lowers them.
  programs = contextlib.nullcontext()
  if cache_dir:
    identity = {'config': FLAGS.config.to_json_best_effort(sort_keys=True)}
    programs = program_store.active(f'{FLAGS.workdir}/programs', identity)
  try:
    with programs:
      summary = train.train_and_evaluate(FLAGS.config, FLAGS.workdir, started_at=_STARTED_AT)
  except BaseException as error:  # pylint: disable=broad-except
    if FLAGS.num_processes == 1 and type(error) is real_failures.UnrecoverableError:
      print(f'{cli.ERROR_PREFIX}{error}', file=sys.stderr)  # A checkpoint gone or of another run: one line.
      sys.exit(UNRECOVERABLE)
    if FLAGS.num_processes == 1:
      raise
    # A device count that does not fit, or a restart whose checkpoint is gone: one line, and no restart.
    exit_code = {config_lib.ConfigError: cli.USAGE_EXIT_CODE, real_failures.UnrecoverableError: UNRECOVERABLE}.get(
      type(error), 1
    )
    explain = f'{cli.ERROR_PREFIX}{error}' if exit_code != 1 else None  # 1: its traceback, unless a peer died.
    distributed.fail(error, exit_code=exit_code, explain=explain)  # Names the peer that is gone, or tells the peers.
  distributed.finish()
  if FLAGS.process_id != 0:  # Process 0 prints the results (and wrote summary.json).
    return
  print(json.dumps({k: v for k, v in summary.items() if k != 'config'}, indent=2))
  if summary.get('eval_ne') is not None:
    floor = summary['bayes_ne']
    vs_floor = f' (Bayes NE floor {floor:.4f}: {100 * (summary["eval_ne"] / floor - 1):+.1f}%)' if floor else ''
    speed = summary['examples_per_sec']
    # None: the workdir held a finished run, resumed at its end; its model was evaluated, nothing was trained.
    speed = (
      'no step trained (the workdir held a finished run; a new --workdir trains again)'
      if speed is None
      else f'{speed:,.0f} examples/sec'
    )
    print(
      f'eval NE {summary["eval_ne"]:.4f}{vs_floor}  AUC {summary["eval_auc"]:.4f}  {speed}  '
      f'-> {FLAGS.workdir}/summary.json'
    )


def _wait_to_join() -> None:
  """A warm standby: everything imported, it waits for the launcher's word (EOF: it was not needed)."""
  line = sys.stdin.readline()
  if not line:
    sys.exit(0)
  os.environ.update(json.loads(line)['environment'])


if __name__ == '__main__':
  cli.run(main)
