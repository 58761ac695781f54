r"""Training throughput of one replica of the reference DLRM, against this machine's matmul rate.

  python -m benchmarks.throughput [--batch_sizes=128,1024] [--steps=50] [--repeats=10] [--json] \
      [--out=benchmarks/results/throughput.md]

What it runs and measures, and the table it prints and writes to `--out`: `shadowsync_jax.studies.throughput`.
"""

from collections.abc import Sequence
import json

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.studies import report
from shadowsync_jax.studies import throughput

_BATCH_SIZES = flags.DEFINE_list('batch_sizes', ['128', '1024'], 'Per-replica batch sizes to time.')
_STEPS = flags.DEFINE_integer('steps', 50, 'Timed steps per repetition.')
_REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed repetitions per batch size; the best is reported.')
_OUT = flags.DEFINE_string('out', 'benchmarks/results/throughput.md', 'Where the table and raw figures go.')
_NUM_BATCHES = flags.DEFINE_integer('num_batches', 8, 'Distinct pre-generated batches, cycled.')
_ZIPF = flags.DEFINE_float('zipf', 1.05, 'Zipf exponent of the ids (0 = uniform).')
_CARDINALITY = flags.DEFINE_integer('cardinality', 100_000, 'Rows of each of the 26 tables.')
_JSON = flags.DEFINE_bool('json', False, 'One JSON object per line per batch size instead of text.')


def main(argv: Sequence[str]) -> None:
  del argv
  results = throughput.run(
    map(int, _BATCH_SIZES.value), _STEPS.value, _REPEATS.value, _NUM_BATCHES.value, _CARDINALITY.value, _ZIPF.value
  )
  for result in results:
    print(json.dumps(result) if _JSON.value else throughput.summary_line(result), flush=True)
  note = throughput.note(_STEPS.value, _REPEATS.value)
  out = report.write(
    _OUT.value,
    'Throughput of the reference model',
    report.command_line(),
    throughput.table(results),
    results,
    note=note,
  )
  print(f'-> {out}')


if __name__ == '__main__':
  cli.run(main)
