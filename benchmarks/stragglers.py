r"""Stragglers across processes: does one slow process hold the others back? (shadow_ma against sync_sgd.)

  python -m benchmarks.stragglers [--slowdown=2] [--num_train_examples=600000] [--batch_size=256] \
      [--algorithms=none,shadow_ma,sync_sgd] [--min_interval_s=0] [--out=benchmarks/results/stragglers.md]

Runs each algorithm as a job of 2 processes (`experiments.launch --pin_cpus`: each process on its own share of the
cores, like two hosts), one replica per process, without and with a straggler (process 1 `--slowdown` times
slower), on the default synthetic data. Prints a markdown table: per-process examples/sec, the fast process's
examples/sec relative to the same algorithm without the straggler, eval NE and AUC; writes it with the raw
summaries to `--out`. Target (issue 4): under shadow_ma the fast process keeps at least 0.9 of its examples/sec,
while under sync_sgd it falls to about the straggler's pace.
"""

import io
import json
import pathlib
import tempfile

from absl import flags

from experiments import launch
from shadowsync_jax import cli
from shadowsync_jax.studies import report as study_report

flags.DEFINE_float('slowdown', 2.0, 'How many times slower the straggler (process 1) is.')
flags.DEFINE_integer('num_train_examples', 600_000, 'Length of the one-pass training stream, for every run.')
flags.DEFINE_integer('batch_size', 256, 'Examples per replica per step.')
flags.DEFINE_list(
  'algorithms', ['none', 'shadow_ma', 'sync_sgd'], 'Sync algorithms to compare (none: the ceiling, no coupling at all).'
)
flags.DEFINE_float('min_interval_s', 0.0, 'shadow_*: least seconds between background rounds.')
flags.DEFINE_string('out', 'benchmarks/results/stragglers.md', 'Where the table and raw summaries go.')
FLAGS = flags.FLAGS


def run_job(workdir: pathlib.Path, algorithm: str, slowdown: float) -> dict:
  """One 2-process job; its summary.json (raises with the job's output if it failed)."""
  train_flags = [
    f'--workdir={workdir}',
    '--config.num_replicas=2',
    f'--config.sync.algorithm={algorithm}',
    f'--config.batch_size={FLAGS.batch_size}',
    f'--config.data.num_train_examples={FLAGS.num_train_examples}',
    f'--config.sync.min_interval_s={FLAGS.min_interval_s}',
    '--config.train.checkpoint_every_steps=0',
    '--config.train.progress_every_s=30',
  ]
  if slowdown > 1:
    train_flags += ['--config.straggler.process=1', f'--config.straggler.slowdown={slowdown}']
  output = io.StringIO()
  code = launch.launch(
    train_flags, num_processes=2, cpu_devices=1, peer_timeout_s=60.0, grace_s=30.0, pin_cpus=True, out=output
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
    fast, slow = summary['examples_per_sec_per_process']
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
  command = (
    f'python -m benchmarks.stragglers --slowdown={FLAGS.slowdown:g} '
    f'--num_train_examples={FLAGS.num_train_examples} --batch_size={FLAGS.batch_size} '
    f'--algorithms={",".join(FLAGS.algorithms)} --min_interval_s={FLAGS.min_interval_s:g}'
  )
  raw = {f'{a} x{s:g}': r for (a, s), r in results.items()}
  out = study_report.write(FLAGS.out, 'Stragglers across 2 processes', command, text, raw)
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
