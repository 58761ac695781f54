r"""Whether the training loop feeds its step: the step alone, the whole loop, the loop around a step that does no work.

  python -m benchmarks.loop [--configs=default,kaggle[,prepared]] [--prepared_dir=DIR] [--repeats=3] \
      [--root=/tmp/shadowsync_loop] [--out=benchmarks/results/loop.md]

'prepared' times `experiments/configs/criteo_kaggle.py:local` (the Kaggle layout sized for a laptop) on a prepared
Criteo dataset, Criteo-format days generated from the synthetic teacher and prepared once (that config's docstring
gives the two commands; `--prepared_dir` if it is elsewhere).

What it runs and measures, and the table it prints and writes to `--out`: `shadowsync_jax.studies.loop`.
"""

from collections.abc import Sequence
import pathlib
import sys
import tempfile

from absl import flags
import jax

from experiments.configs import criteo_kaggle
from experiments.configs import default
from shadowsync_jax import cli
from shadowsync_jax.studies import loop
from shadowsync_jax.studies import report


def _kaggle_synthetic():
  config = criteo_kaggle.get_config()
  config.data.source = 'synthetic'  # Kaggle's tables (its cardinalities) and model, on the synthetic stream.
  return config


def _prepared():
  config = criteo_kaggle.get_config('local')  # The Kaggle layout sized for a laptop, on the prepared Criteo data.
  config.data.prepared_dir = _PREPARED_DIR.value or config.data.prepared_dir
  config.data.num_eval_examples = 16_384
  return config


CONFIGS = {'default': default.get_config, 'kaggle': _kaggle_synthetic, 'prepared': _prepared}
_CONFIGS = flags.DEFINE_list('configs', ['default', 'kaggle'], f'Which of {", ".join(CONFIGS)} to time.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Repeats of the three timings a config.')
_DEFAULT_EXAMPLES = flags.DEFINE_integer('default_examples', 1_000_000, 'Training examples of a default-config run.')
_KAGGLE_EXAMPLES = flags.DEFINE_integer('kaggle_examples', 200_000, 'Training examples of a Kaggle-config run.')
_PREPARED_EXAMPLES = flags.DEFINE_integer('prepared_examples', 1_000_000, 'Training examples of a prepared run.')
_PREPARED_DIR = flags.DEFINE_string(
  'prepared_dir', '', "'prepared': the prepared dataset (default: criteo_kaggle.py:local's own)."
)
_JOB = flags.DEFINE_bool(
  'job',
  True,
  'Also time 8 replicas as 2 processes x 4 devices on the default config, with none and each shadow algorithm '
  '((a), (b)).',
)
_JOB_EXAMPLES = flags.DEFINE_integer('job_examples', 2_000_000, "Training examples of the job's runs.")
_PROCESS_STEP_ALONE = flags.DEFINE_integer(
  'process_step_alone', 0, 'Internal: as one process of the job, print (a) of its replicas over this many steps.'
)
_PROCESS_K = flags.DEFINE_integer('process_k', 1, "Internal: the job's steps a dispatch, for --process_step_alone.")
_PROCESS_ALGORITHM = flags.DEFINE_string(
  'process_algorithm', loop.JOB_ALGORITHMS[0], "Internal: the job's sync.algorithm, for --process_step_alone."
)
_PROCESS_INDEX = flags.DEFINE_integer(
  'process_index', 0, 'Internal: which process of the job, for --process_step_alone.'
)
_ROOT = flags.DEFINE_string('root', '', 'Where the runs go (default: a temporary directory).')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/loop.md', 'Where the table and raw figures go.')


def _process_step_alone(steps: int, steps_per_dispatch: int, algorithm: str, index: int) -> tuple[float, float]:
  """A process of the job's (a): its replicas' block program of the job's K alone, on its devices; and its (d): the
  blocks of its replicas read from the job's stream, as its reader reads them."""
  jax.config.update('jax_num_cpu_devices', loop.JOB_DEVICES)
  config = default.get_config()
  config.num_replicas, config.sync.algorithm = loop.JOB_DEVICES, algorithm
  config.data.num_train_examples, config.data.num_eval_examples = _JOB_EXAMPLES.value // loop.JOB_PROCESSES, 16_384
  step_alone = loop.time_step_alone(config, steps_per_dispatch, steps)
  job = default.get_config()
  job.num_replicas, job.data.num_train_examples = loop.JOB_PROCESSES * loop.JOB_DEVICES, _JOB_EXAMPLES.value
  own = range(index * loop.JOB_DEVICES, (index + 1) * loop.JOB_DEVICES)
  return step_alone, loop.time_block_reading(job, steps_per_dispatch, steps, own)


def main(argv: Sequence[str]) -> None:
  del argv
  if _PROCESS_STEP_ALONE.value:
    rates = _process_step_alone(
      _PROCESS_STEP_ALONE.value, _PROCESS_K.value, _PROCESS_ALGORITHM.value, _PROCESS_INDEX.value
    )
    print(*rates)
    return
  root = _ROOT.value or tempfile.mkdtemp(prefix='shadowsync_loop_')
  configs = {name: CONFIGS[name] for name in _CONFIGS.value}
  examples = {
    'default': _DEFAULT_EXAMPLES.value,
    'kaggle': _KAGGLE_EXAMPLES.value,
    'prepared': _PREPARED_EXAMPLES.value,
  }
  results = loop.run(configs, _REPEATS.value, root, examples)
  if _JOB.value:
    command = [sys.executable, '-m', 'benchmarks.loop']
    results |= loop.run_job(_REPEATS.value, _JOB_EXAMPLES.value, pathlib.Path(root), command)
  print(loop.table(results))
  changed = "the Kaggle config's data.source='synthetic' (its tables at Kaggle's cardinalities, its model)"
  if 'prepared' in configs:
    changed += '; prepared: criteo_kaggle.py:local on Criteo-format days generated and prepared once (days 1-6 train)'
  out = report.write(
    _OUT.value,
    'The training loop against its own step',
    report.command_line(),
    loop.table(results),
    results,
    note=loop.note(results, _REPEATS.value, changed),
    root=root,
  )
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
