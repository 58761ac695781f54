r"""Failure recovery on real failures: a job of 2 processes killed on seeded schedules, under each recovery mode.

  python -m benchmarks.real_failures [--size=default|kaggle] [--kill_mtbf_s=S] [--kill_seeds=0,1,2] \
      [--modes=full,full:whole,partial,cpr_mfu,cpr_ssu,cpr] [--num_train_examples=N] [--root=DIR [--reuse]] \
      [--out=FILE] [--tiny]

Runs the job once without failures and without recovery (the reference), then each mode on each seed's kill schedule:
the launcher SIGKILLs a random process at exponential times of mean `--kill_mtbf_s` seconds
(`shadowsync_jax.studies.real_failures`); at Kaggle size full recovery runs twice, with incremental checkpoints (the
default there) and with whole ones (`full:whole`), so the page shows what incremental checkpoints bought. Settings
changed from the defaults: the size's launcher flags and config (`default`: `--num_processes=2 --cpu_devices=1
--pin_cpus`, each process on a core of its own, like two hosts; `kaggle`: Criteo Kaggle's cardinalities, synthetic
data, 8 replicas with sharded tables over 2 processes x 4 devices, pinned), `recovery.mode` and `recovery.mtbf_steps`
(the schedule's mean in the reference's steps). Prints the tables and writes them, the JSON by mode and the raw
summaries, to `--out` (default: benchmarks/results/real_failures.md, or real_failures_kaggle.md for `--size=kaggle`).
"""

import json
import pathlib
import tempfile

from absl import app
from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.studies import real_failures
from shadowsync_jax.studies import report

flags.DEFINE_enum('size', 'default', list(real_failures.SIZES), 'The job: the default problem, or Criteo Kaggle.')
flags.DEFINE_float('kill_mtbf_s', None, "Mean seconds between the kills (default: the size's, 20 s or 60 s at Kaggle).")
flags.DEFINE_list('kill_seeds', ['0', '1', '2'], 'Seeds of the kill schedules (each mode runs on every one).')
flags.DEFINE_list(
  'modes',
  None,
  'Recovery modes to run after the reference; MODE:whole runs MODE with whole checkpoints (recovery.incremental='
  'false). Default: full, partial, cpr_mfu, cpr_ssu, cpr, and at Kaggle size full:whole after full.',
)
flags.DEFINE_string('root', None, 'Where the runs go (default: a new temporary directory).')
flags.DEFINE_string('out', None, 'Where the tables and raw summaries go (default: by --size).')
flags.DEFINE_bool('tiny', False, 'The tiny config (seconds per run), for a smoke test.')
flags.DEFINE_integer('num_train_examples', 0, "Examples of the one-pass stream (0: the size's).")
flags.DEFINE_bool(
  'reuse',
  False,
  'Runs that ended in --root before (each keeps its row) are read, not run again: a study stopped goes on where it '
  'stopped, or more kill seeds are added to it.',
)
FLAGS = flags.FLAGS

TITLES = {'default': 'Recovery from real failures', 'kaggle': 'Recovery from real failures at Criteo Kaggle size'}
OUTS = {'default': 'benchmarks/results/real_failures.md', 'kaggle': 'benchmarks/results/real_failures_kaggle.md'}


def main(argv):
  del argv
  size = real_failures.SIZES[FLAGS.size]
  root = pathlib.Path(FLAGS.root or tempfile.mkdtemp(prefix=f'real_failures_{size.name}_'))
  train_flags = ['--config.train.progress_every_s=60']
  if FLAGS.tiny:
    train_flags.insert(0, '--config=experiments/configs/default.py:tiny')
  if FLAGS.num_train_examples:
    train_flags.append(f'--config.data.num_train_examples={FLAGS.num_train_examples}')
  seeds = tuple(int(seed) for seed in FLAGS.kill_seeds)
  modes = tuple(FLAGS.modes or real_failures.DEFAULT_MODES[size.name])
  kill_mtbf_s = FLAGS.kill_mtbf_s or size.kill_mtbf_s
  if FLAGS.reuse and not FLAGS.root:
    raise app.UsageError('--reuse reads the runs of a study in --root: give it.')
  rows = real_failures.run(root, size, modes, kill_mtbf_s, seeds, train_flags=tuple(train_flags), reuse=FLAGS.reuse)
  by_mode = real_failures.by_mode(rows)
  text = real_failures.table(rows) + '\n\nBy mode (means over the kill seeds; `_range`: lowest and highest):\n\n'
  text += f'```json\n{json.dumps(by_mode, indent=1)}\n```'
  print(text)
  reference = rows[0]
  step_ms = 1e3 * real_failures.steps_time(reference) / reference['train_steps']
  note = (
    f'{size.description}{" (tiny)" if FLAGS.tiny else ""}; kills at exponential times of mean {kill_mtbf_s:g} '
    f's, seeds {", ".join(map(str, seeds))}; MTBF {rows[-1]["mtbf_steps"]:.0f} steps; reference step time '
    f"{step_ms:.1f} ms. Overheads are shares of the reference's steps time (`checkpoint_overhead_pct`: blocking "
    "saves, the steps' slowdown at pace charged to recovery's boundary work, background writes, priority saves' "
    "threads and live copies by the CPU each took on the processes' cores (at most that), restores, work trained "
    'again; `restart_overhead_pct`: each death to every process training again, restores left out, the warm-ups '
    "back to pace and the warm standbys' CPU); the wall overhead is the run's wall time over the reference's; "
    "beside the parts, steps slowed beyond every CPU counted (`other slower steps s`) and the first start's "
    "start-up and the last one's end against the reference's; what no part explains is `unexplained s`."
  )
  out = FLAGS.out or OUTS[size.name]
  out = report.write(out, TITLES[size.name], report.command_line(), text, rows, note=note, root=root)
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
