r"""Writes Criteo-format day files from the synthetic teacher, with the true click probabilities beside them.

  python -m experiments.generate_criteo --output_dir=/tmp/criteo_gen --rows=4000000 --days=7 \
      [--config=experiments/configs/criteo_kaggle.py:local] [--nogzip] [--workers=0]

Writes day_0.gz .. day_{days-1}.gz (plain day_N with --nogzip) and day_N.p_true.npy: the synthetic stream of the
config (its seed, `data.cardinalities`, `data.zipf_exponent`, `data.drift`), cut into days as the DLRM reference
cuts Kaggle. Prepared or read with the same config's cardinalities, they give back the stream's ids and labels
(`shadowsync_jax/data/criteo/generate.py`), and the Bayes NE floor is reported on them. About 50k rows/s a core.
"""

from absl import flags

from shadowsync_jax import cli
from shadowsync_jax.data import synthetic
from shadowsync_jax.data.criteo import generate

_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Directory of the day files.', required=True)
_ROWS = flags.DEFINE_integer('rows', 4_000_000, 'Rows in all the days together.')
_DAYS = flags.DEFINE_integer('days', 7, 'Day files (7: Kaggle; 24: Terabyte).')
_GZIP = flags.DEFINE_bool('gzip', True, 'Write day_N.gz (as Criteo ships Terabyte) rather than plain day_N.')
_WORKERS = flags.DEFINE_integer('workers', 0, 'Worker processes; 0 = one per core.')
cli.define_config_flag('experiments/configs/criteo_kaggle.py:local')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    cli.exit_with_usage_error(f'unexpected arguments {argv[1:]}.')
  if not 1 <= _DAYS.value <= _ROWS.value:
    cli.exit_with_usage_error(f'--days={_DAYS.value} and --rows={_ROWS.value}: need at least one row a day.')
  data = FLAGS.config.data
  spec = synthetic.SyntheticSpec(
    seed=FLAGS.config.seed,
    cardinalities=tuple(int(c) for c in data.cardinalities),
    zipf_exponent=data.zipf_exponent,
    drift=data.drift,
  )
  generate.write_days(_OUTPUT_DIR.value, _ROWS.value, _DAYS.value, spec, _GZIP.value, _WORKERS.value or None)


if __name__ == '__main__':
  cli.run(main)
