r"""Stragglers across processes: does one slow process hold the others back?

  python -m benchmarks.stragglers [--slowdown=2] [--algorithms=none,shadow_ma,shadow_ea,shadow_bmuf,sync_sgd] \
      [--num_train_examples=N] [--min_interval_s=S] [--pin_cpus] [--out=benchmarks/results/stragglers.md]

Runs each algorithm as a job of 2 processes (`experiments.launch`), one replica per process, without and with a
straggler (process 1 `--slowdown` times slower), on the default config: checkpoints on (every
`train.checkpoint_every_steps`, each process at its own pace), every other setting at its default unless a flag
says otherwise. Prints a markdown table: per-process examples/sec, the fast process's examples/sec relative to the
same algorithm without the straggler, eval NE and AUC; writes it with the raw summaries to `--out`. Targets: under
`none` and the shadow algorithms the fast process keeps at least 0.9 of its examples/sec, while under sync_sgd it
falls to about the straggler's pace. An algorithm written `ALGORITHM@PLACEMENT` also sets
`sync.embedding_placement` (e.g. `shadow_ma@sharded`: the tables sharded over the two processes, so every lookup
is a collective of both).
"""

import io
import json
import pathlib
import tempfile

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.parallel import supervisor
from shadowsync_jax.studies import report as study_report

flags.DEFINE_float('slowdown', 2.0, 'How many times slower the straggler (process 1) is.')
flags.DEFINE_integer('num_train_examples', None, "Length of the one-pass training stream (default: the config's).")
flags.DEFINE_list(
  'algorithms',
  ['none', 'shadow_ma', 'shadow_ea', 'shadow_bmuf', 'sync_sgd'],
  'Sync algorithms to compare (none: the ceiling, no coupling at all).',
)
flags.DEFINE_string(
  'min_interval_s', None, "shadow_*: least seconds between rounds, or 'auto' (default: the config's)."
)
flags.DEFINE_bool('pin_cpus', False, 'Each process on its own share of the cores, like separate hosts.')
flags.DEFINE_string('out', 'benchmarks/results/stragglers.md', 'Where the table and raw summaries go.')
FLAGS = flags.FLAGS


def run_job(workdir: pathlib.Path, algorithm: str, slowdown: float) -> dict:
  """One 2-process job; its summary.json (raises with the job's output if it failed)."""
  algorithm, _, placement = algorithm.partition('@')
  train_flags = [f'--workdir={workdir}', f'--config.sync.algorithm={algorithm}', '--config.train.progress_every_s=30']
  if placement:
    train_flags.append(f'--config.sync.embedding_placement={placement}')
  if FLAGS.num_train_examples:
    train_flags.append(f'--config.data.num_train_examples={FLAGS.num_train_examples}')
  if FLAGS.min_interval_s is not None:
    train_flags.append(f'--config.sync.min_interval_s={FLAGS.min_interval_s}')
  if slowdown > 1:
    train_flags += ['--config.straggler.process=1', f'--config.straggler.slowdown={slowdown}']
  output = io.StringIO()
  code = supervisor.supervise(
    train_flags,
    num_processes=2,
    cpu_devices=supervisor.DEFAULT_CPU_DEVICES,
    peer_timeout_s=60.0,
    grace_s=30.0,
    pin_cpus=FLAGS.pin_cpus,
    out=output,
  )
  if code != 0:
    raise RuntimeError(f'{algorithm} (slowdown {slowdown}) failed:\n{output.getvalue()}')
  return json.loads((workdir / 'summary.json').read_text())


def table(results: dict[tuple[str, float], dict]) -> str:
  lines = [
    '| algorithm | straggler | p0 (fast) ex/s | p1 ex/s | p0 vs. no straggler | eval NE | eval AUC | '
    'sync rounds | mean sync gap |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for (algorithm, slowdown), summary in results.items():
    fast, slow = summary['examples_per_sec_per_process']  # `algorithm` may say its placement: ALGORITHM@PLACEMENT.
    baseline = results[(algorithm, 1.0)]['examples_per_sec_per_process'][0]
    gap = summary['mean_sync_gap']
    lines.append(
      f'| {algorithm} | {f"p1 {slowdown:g}x slower" if slowdown > 1 else "none"} | {fast:,.0f} | '
      f'{slow:,.0f} | {fast / baseline:.2f} | {summary["eval_ne"]:.4f} | {summary["eval_auc"]:.4f} | '
      f'{summary["sync_rounds"]} | {"-" if gap is None else f"{gap:.1f}"} |'
    )
  return '\n'.join(lines)


def main(argv):
  del argv
  results = {}
  with tempfile.TemporaryDirectory() as root:
    for algorithm in FLAGS.algorithms:
      for slowdown in (1.0, FLAGS.slowdown):
        print(f'--- {algorithm}, straggler slowdown {slowdown:g}', flush=True)
        results[(algorithm, slowdown)] = run_job(pathlib.Path(root) / f'{algorithm}_{slowdown:g}', algorithm, slowdown)
  text = table(results)
  print(text)
  raw = {f'{a} x{s:g}': r for (a, s), r in results.items()}
  note = (
    f"2 processes x 1 replica (on the launcher's default {supervisor.DEFAULT_CPU_DEVICES} CPU devices), "
    f'process 1 {FLAGS.slowdown:g}x slower in the second run of each algorithm; '
    f"pinned cores: {'yes' if FLAGS.pin_cpus else 'no'}; everything else at the default config's values "
    '(checkpoints on, each process at its own pace).'
  )
  out = study_report.write(
    FLAGS.out, 'Stragglers across 2 processes', study_report.command_line(), text, raw, note=note
  )
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
