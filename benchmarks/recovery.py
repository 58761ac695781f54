r"""The CPR study: the same data and failure schedule under no failures, full, partial, cpr_mfu, cpr_ssu and cpr.

  python -m benchmarks.recovery [--config=experiments/configs/default.py] [--modes=none,full,...] [--seeds=0,1,2] \
      [--workdir=DIR] [--out=benchmarks/results/recovery.md] [--config.recovery.mtbf_steps=1500 ...]

With no flags it runs the defaults (the default problem, failures of one of 4 embedding shards every 1000 steps on
average, a 1% PLS budget); `--config=experiments/configs/recovery.py
--out=benchmarks/results/recovery_8_shards_pls_0.02.md` is the labelled extra setting closer to the paper's (8
shards, PLS 2%, MTBF 1200 steps).

Every mode runs on every seed (a seed sets the failure schedule, the data and the initial model). Prints each
mode's mean and range over the seeds (against the runs of the same seed), then a markdown table of every run (eval
NE and its difference to its seed's run without failures; the failures met; the checkpoint and priority-save
intervals chosen; time blocked on saves, re-trained and spent restoring, and the total overhead, as % of each
run's failure-free time; the estimated and actual portion of lost samples; the share of embedding lookups whose
updates were lost; wall time) and writes them with the raw summaries to --out. The expected result is in the
config's docstring; docs/studies/cpr.md shows a run.
"""

import pathlib
import tempfile

from absl import app
from absl import flags
from absl import logging
import jax

from shadowsync_jax import cli
from shadowsync_jax.studies import report as study_report

flags.DEFINE_list('modes', None, 'Recovery modes to run, in order (default: none,full,partial,cpr_mfu,cpr_ssu).')
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds (`seed`): each mode runs once on each.')
flags.DEFINE_string(
  'workdir', None, 'Where the runs go, one directory per seed and mode (default: a new temp directory).'
)
flags.DEFINE_string('out', 'benchmarks/results/recovery.md', 'Where the table and the raw summaries go.')
cli.define_config_flag('experiments/configs/default.py', "The study's base config (the defaults).")
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:  # orbax logs every save at INFO.
    logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_num_cpu_devices', 8)
  from shadowsync_jax.studies import cpr as recovery_study  # pylint: disable=g-import-not-at-top  (after the device count is set)

  modes = tuple(FLAGS.modes or recovery_study.MODES)
  root = pathlib.Path(FLAGS.workdir or tempfile.mkdtemp(prefix='recovery_study_'))
  rows = recovery_study.run(FLAGS.config, root, modes, seeds=tuple(int(seed) for seed in FLAGS.seeds))
  text = recovery_study.table(rows)
  print(text)
  out = study_report.write(FLAGS.out, 'CPR study', study_report.command_line(), text, rows, root=root)
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
