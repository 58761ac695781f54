"""The counter-based hash every random number of the synthetic stream comes from: a pure function of (key, counter),
so any example, id or parameter can be computed alone, in any order, on any host.

  words = counter_hash.splitmix64(counters_uint64, key)    # uint64, one output per counter
"""

import numpy as np

_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def splitmix64(counter: np.ndarray, key: int) -> np.ndarray:
  """Output number `counter` of the splitmix64 generator seeded with `key` (uint64, vectorized, stateless)."""
  z = (counter.astype(np.uint64) + np.uint64(1)) * _GOLDEN_GAMMA + np.uint64(key)
  z ^= z >> np.uint64(30)
  z *= _MIX_1
  z ^= z >> np.uint64(27)
  z *= _MIX_2
  z ^= z >> np.uint64(31)
  return z
