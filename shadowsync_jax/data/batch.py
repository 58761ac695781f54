"""The unit of data every part of the framework agrees on.

  batch = Batch(dense=dense_BxF, sparse=ids_BxT, label=label_B)

`dense` holds the 13 dense features already transformed (`log(1 + max(x, 0))` for Criteo), `sparse` one id per
categorical feature, already inside that feature's table (`0 <= id < cardinalities[t]`), `label` the click (0/1).
Leading axes may be added (replica `R`, step): a global batch of R replicas is `Batch` with shapes [R, B, ...].
"""

from typing import NamedTuple

import numpy as np

NUM_DENSE_FEATURES = 13
NUM_SPARSE_FEATURES = 26


class Batch(NamedTuple):
  dense: np.ndarray  # float32 [..., B, NUM_DENSE_FEATURES]
  sparse: np.ndarray  # int32 [..., B, NUM_SPARSE_FEATURES]
  label: np.ndarray  # float32 [..., B]


def zeros(*leading: int) -> Batch:
  """A batch of zeros with leading shape `leading` (e.g. [L, K, B]): a block's padding, or a shape to compile for."""
  return Batch(
    dense=np.zeros((*leading, NUM_DENSE_FEATURES), np.float32),
    sparse=np.zeros((*leading, NUM_SPARSE_FEATURES), np.int32),
    label=np.zeros(leading, np.float32),
  )
