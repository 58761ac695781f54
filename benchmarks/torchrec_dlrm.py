r"""Criteo Kaggle's config beside TorchRec's DLRM on the same tables, on this machine, in one run.

  python -m benchmarks.torchrec_dlrm --torchrec_python=/opt/torchrec/bin/python [--repeats=3] \
      [--out=benchmarks/results/torchrec_dlrm.md]

TorchRec runs in a Python of its own (it is no requirement of this framework). One that ran here, CPU wheels, torch
first so that nothing pulls a CUDA build:

  python3.11 -m venv /opt/torchrec
  /opt/torchrec/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  /opt/torchrec/bin/pip install numpy tensordict torchmetrics==1.0.3 tqdm pyre-extensions
  /opt/torchrec/bin/pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0

What it runs and measures: `shadowsync_jax.studies.torchrec_peer`.
"""

from collections.abc import Sequence
import os
import tempfile

from absl import flags

from experiments.configs import criteo_kaggle
from shadowsync_jax import cli
from shadowsync_jax.studies import report
from shadowsync_jax.studies import torchrec_peer


def _kaggle_synthetic():
  config = criteo_kaggle.get_config()
  config.data.source = 'synthetic'  # Kaggle's tables (its cardinalities) and model, on the synthetic stream.
  return config


_TORCHREC_PYTHON = flags.DEFINE_string(
  'torchrec_python', os.environ.get('TORCHREC_PYTHON', ''), 'A Python with torch, fbgemm-gpu-cpu and torchrec.'
)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Repeats of both timings.')
_EXAMPLES = flags.DEFINE_integer('examples', 400_000, "Training examples of this framework's run.")
_STEPS = flags.DEFINE_integer('torchrec_steps', 2000, "TorchRec's timed steps.")
_ROOT = flags.DEFINE_string('root', '', 'Where the runs go (default: a temporary directory).')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/torchrec_dlrm.md', 'Where the table and raw figures go.')


def main(argv: Sequence[str]) -> None:
  del argv
  if not _TORCHREC_PYTHON.value:
    cli.exit_with_usage_error(
      '--torchrec_python (or $TORCHREC_PYTHON) must name a Python with torchrec: see the docstring.'
    )
  root = _ROOT.value or tempfile.mkdtemp(prefix='shadowsync_torchrec_')
  results = torchrec_peer.run(
    _kaggle_synthetic, _TORCHREC_PYTHON.value, _REPEATS.value, _EXAMPLES.value, root, torchrec_steps=_STEPS.value
  )
  print(torchrec_peer.table(results))
  out = report.write(
    _OUT.value,
    "Criteo Kaggle's config beside TorchRec's DLRM",
    report.command_line(),
    torchrec_peer.table(results),
    {'comparison': results},
    note=torchrec_peer.note(results, _REPEATS.value),
    root=root,
  )
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
