r"""Whether the training loop feeds its step: the step alone, the whole loop, the loop around a step that does no work.

  python -m benchmarks.loop [--configs=default,kaggle] [--repeats=3] [--root=/tmp/shadowsync_loop] \
      [--out=benchmarks/results/loop.md]

What it runs and measures, and the table it prints and writes to `--out`: `shadowsync_jax.studies.loop`.
"""

from collections.abc import Sequence
import tempfile

from absl import flags

from experiments.configs import criteo_kaggle
from experiments.configs import default
from shadowsync_jax import cli
from shadowsync_jax.studies import loop
from shadowsync_jax.studies import report


def _kaggle_synthetic():
  config = criteo_kaggle.get_config()
  config.data.source = 'synthetic'  # Kaggle's tables (its cardinalities) and model, on the synthetic stream.
  return config


CONFIGS = {'default': default.get_config, 'kaggle': _kaggle_synthetic}
_CONFIGS = flags.DEFINE_list('configs', list(CONFIGS), f'Which of {", ".join(CONFIGS)} to time.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Repeats of the three timings a config.')
_DEFAULT_EXAMPLES = flags.DEFINE_integer('default_examples', 1_000_000, 'Training examples of a default-config run.')
_KAGGLE_EXAMPLES = flags.DEFINE_integer('kaggle_examples', 200_000, 'Training examples of a Kaggle-config run.')
_ROOT = flags.DEFINE_string('root', '', 'Where the runs go (default: a temporary directory).')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/loop.md', 'Where the table and raw figures go.')


def main(argv: Sequence[str]) -> None:
  del argv
  root = _ROOT.value or tempfile.mkdtemp(prefix='shadowsync_loop_')
  configs = {name: CONFIGS[name] for name in _CONFIGS.value}
  examples = {'default': _DEFAULT_EXAMPLES.value, 'kaggle': _KAGGLE_EXAMPLES.value}
  results = loop.run(configs, _REPEATS.value, root, examples)
  print(loop.table(results))
  changed = "the Kaggle config's data.source='synthetic' (its tables at Kaggle's cardinalities, its model)"
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
