"""Generated Criteo data that the data tests share: three days with missing values, and their prepared dataset.

paths = generated_criteo.write_days(directory)     # day_0.gz (gzip), day_1, day_2 (plain); 4,000 rows each
version_dir, result = generated_criteo.prepare(paths, data_dir)   # train: days 0-1, heldout: day 2
"""

import gzip
import os

from shadowsync_jax.data import synthetic
from shadowsync_jax.data.criteo import files
from shadowsync_jax.data.criteo import generate
from shadowsync_jax.data.prepared import builder

CARDINALITIES = (1000,) * 20 + (7, 100_000, 3, 50, 2, 1)
ROWS = 12_000
SMALL = dict(block_rows=500, part_blocks=2, unit_bytes=200_000)  # Several units per file, several parts per unit.


def write_days(directory: str) -> list[str]:
  spec = synthetic.SyntheticSpec(seed=1, cardinalities=CARDINALITIES)
  paths = generate.write_days(directory, ROWS, 3, spec, gzip=False, num_workers=0)
  with open(paths[0], 'rb') as plain, gzip.open(paths[0] + '.gz', 'wb') as packed:
    packed.write(plain.read())
  os.replace(files.true_probability_path(paths[0]), files.true_probability_path(paths[0] + '.gz'))
  return [paths[0] + '.gz', *paths[1:]]


def plain(path: str) -> str:
  """The plain twin of a day (day_0.gz was compressed from day_0, which stays)."""
  return path.removesuffix('.gz')


def prepare(days: list[str], data_dir: str, name: str = 'gen', num_workers: int = 2):
  splits = files.day_layout(days, heldout_days=1)
  return builder.prepare_dataset(splits, data_dir, name, CARDINALITIES, num_workers=num_workers, **SMALL)
