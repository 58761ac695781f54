r"""Tables at their real size: memory, speed, save and restore across table sizes and placements.

  python -m benchmarks.table_size [--examples=300000] [--eval_examples=16384] \
      [--only=Kaggle --only='Terabyte, sharded'] [--root=DIR] [--out=benchmarks/results/table_size.md] [--update]

Runs `shadowsync_jax.studies.table_size`'s cells: Criteo Kaggle's reference DLRM (its config, on the synthetic
stream) with tables of Kaggle's cardinalities capped at 300 and at 100k rows, Kaggle's own and Terabyte's, in each
placement; two jobs a cell (train, then restore), each under GNU time. Settings changed from the Kaggle config's
defaults, per cell: data.source=synthetic, data.cardinalities, data.num_train_examples and num_eval_examples,
num_replicas, batch_size, sync.embedding_placement, sync.shard_exchange, sync.algorithm (and the progress line's
period). Prints a line a cell, then writes the table, a plot beside it (`.png`) and the raw rows to `--out`;
docs/studies/table_size.md embeds it. With `--update`, the cells run replace their rows of the existing `--out`
and the others are kept (the result file then mixes runs; its rows carry their cells' labels).
"""

import pathlib
import tempfile

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.studies import report
from shadowsync_jax.studies import result_files
from shadowsync_jax.studies import table_size

flags.DEFINE_integer('examples', 300_000, 'Training examples of every job.')
flags.DEFINE_integer('eval_examples', 16_384, 'Held-out examples of every job.')
flags.DEFINE_multi_string(
  'only', [], 'Run only the cells whose label contains this text; repeat the flag for more (default: every cell).'
)
flags.DEFINE_string('root', None, 'Where the jobs go (default: a new temporary directory).')
flags.DEFINE_string('out', 'benchmarks/results/table_size.md', 'Where the table and raw rows go.')
flags.DEFINE_bool('update', False, 'Replace the rows of the cells run in the existing --out; keep the others.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  root = pathlib.Path(FLAGS.root or tempfile.mkdtemp(prefix='table_size_'))
  cells = [c for c in table_size.default_cells() if not FLAGS.only or any(s in c.label for s in FLAGS.only)]
  rows = table_size.run(cells, root, FLAGS.examples, FLAGS.eval_examples)
  updated = ''
  if FLAGS.update:
    fresh = {row['cell']: row for row in rows}
    before = result_files.command_of(FLAGS.out)
    updated = f' Rerun by this command: {"; ".join(fresh)}; every other row from `{before}`.'
    rows = [fresh.pop(row['cell'], row) for row in result_files.read_rows(FLAGS.out)] + list(fresh.values())
  text = table_size.table(rows)
  print(text)
  out = pathlib.Path(FLAGS.out)
  image = table_size.plot(rows, out.with_suffix('.png'))
  note = (
    f"Criteo Kaggle's reference DLRM, {FLAGS.examples:,} training and {FLAGS.eval_examples:,} held-out examples "
    f'of the synthetic stream a job; cells "size, placement, processes x replicas each, batch"; memory a process '
    f'(peak RSS from outside: the largest process of the job), the bound 1.5 x state + 2 GB; save s: the final '
    f"save's blocking seconds; restore s: the second job's restore. Plot: `{image.name}` beside this file.{updated}"
  )
  written = report.write(out, 'Tables at their real size', report.command_line(), text, rows, note=note, root=root)
  print(f'-> {written}')


if __name__ == '__main__':
  cli.run(main)
