r"""Training throughput of one replica of the reference DLRM, against this machine's matmul rate.

  results = throughput.run(batch_sizes=(128, 1024), steps=50, repeats=10)   # one dict a batch size
  print(throughput.table(results))

Trains the reference configuration (bottom 13-512-256-64-16, 26 tables of 100000 x 16, top 367-512-256-1) with
the library's `make_train_step` (row-wise Adagrad embeddings, optax Adagrad MLP, jitted, state donated) on
pre-generated batches cycled on the device, so neither data generation nor compilation is timed. The compute
limit is the best f32 matmul rate, measured right before each repetition of the steps; one training example costs
2.916 MFLOP, so

  fraction_of_compute_limit = examples_per_sec * 2.916e6 / best_matmul_flops_per_sec,

reported as the median over the repetitions with the interval between the second lowest and second highest (the
machine is shared: the limit alone moves between 115 and 157 GFLOP/s from one run to the next on this 2-core VM).
The current figures are in benchmarks/results/throughput.md (docs/studies/throughput.md), written by
`benchmarks.throughput`.
"""

from collections.abc import Iterable, Sequence
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from shadowsync_jax.data.batch import NUM_DENSE_FEATURES
from shadowsync_jax.data.batch import NUM_SPARSE_FEATURES
from shadowsync_jax.data.batch import Batch
from shadowsync_jax.model import embedding
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.model.dlrm import DLRM
from shadowsync_jax.studies import result_files

FLOPS_PER_EXAMPLE = 2.916e6  # forward + backward of the reference MLPs and interaction
TARGET = {128: 0.5, 1024: 0.75}  # The headline's: the share of the matmul limit a batch size reaches.


def best_matmul_flops_per_sec(sizes: Sequence[int] = (256, 512, 1024, 2048), repeats: int = 5) -> float:
  """Best f32 rate of jitted square matmuls, the compute limit the step is measured against."""
  best = 0.0
  for n in sizes:
    a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.float32) for i in range(2))
    matmul = jax.jit(lambda a, b: a @ b)
    calls = max(1, int(2e9 // (2 * n**3)))  # about 2 GFLOP per timing
    matmul(a, b).block_until_ready()
    for _ in range(repeats):
      start = time.perf_counter()
      for _ in range(calls):
        out = matmul(a, b)
      out.block_until_ready()
      best = max(best, calls * 2 * n**3 / (time.perf_counter() - start))
  return best


def make_batches(
  key: jax.Array, num_batches: int, batch_size: int, cardinalities: Sequence[int], zipf: float
) -> list[Batch]:
  """Random batches on the device: normal dense features, Zipf-ish (or uniform) ids, coin-flip labels."""
  rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
  cards_T = np.asarray(cardinalities)
  batches = []
  for _ in range(num_batches):
    if zipf > 0:
      ids_BxT = (rng.zipf(1.0 + zipf, (batch_size, len(cards_T))) - 1) % cards_T
    else:
      ids_BxT = rng.integers(0, cards_T, (batch_size, len(cards_T)))
    batches.append(
      jax.device_put(
        Batch(
          dense=rng.standard_normal((batch_size, NUM_DENSE_FEATURES), np.float32),
          sparse=ids_BxT.astype(np.int32),
          label=(rng.random(batch_size) < 0.25).astype(np.float32),
        )
      )
    )
  return batches


def time_training(
  batch_size: int, steps: int, repeats: int, num_batches: int, cardinality: int, zipf: float
) -> dict[str, float]:
  """Examples/sec and their fraction of the compute limit over `repeats` timings of `steps` steps, each right after a
  measure of the limit (paired: a busy moment of the shared machine slows both), after compiling and warming up.
  The fraction's median comes with the interval between the second lowest and second highest repetition's (a
  distribution-free interval for the median: 89% at 10 repetitions)."""
  cardinalities = [cardinality] * NUM_SPARSE_FEATURES
  model = DLRM(bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1))
  mlp_opt, emb_opt = optax.adagrad(0.01), embedding.rowwise_adagrad(0.05)
  state = step_lib.init_train_state(jax.random.key(0), model, cardinalities, 16, mlp_opt, emb_opt)
  train_step = jax.jit(step_lib.make_train_step(model, cardinalities, mlp_opt, emb_opt), donate_argnums=0)
  batches = make_batches(jax.random.key(1), num_batches, batch_size, cardinalities, zipf)
  for i in range(2 * num_batches):
    state, metrics = train_step(state, batches[i % num_batches])
  jax.block_until_ready(state)
  seconds, fractions, limits = [], [], []
  for _ in range(repeats):
    limits.append(best_matmul_flops_per_sec(repeats=1))
    start = time.perf_counter()
    for i in range(steps):
      state, metrics = train_step(state, batches[i % num_batches])
    jax.block_until_ready((state, metrics))
    seconds.append(time.perf_counter() - start)
    fractions.append(steps * batch_size / seconds[-1] * FLOPS_PER_EXAMPLE / limits[-1])
  if not np.isfinite(float(metrics['loss'])):
    raise FloatingPointError(f'loss is {metrics["loss"]} at batch {batch_size}')
  ordered = sorted(fractions)
  low, high = (ordered[1], ordered[-2]) if repeats >= 4 else (ordered[0], ordered[-1])
  return {
    'examples_per_sec': steps * batch_size / float(np.median(seconds)),
    'ms_per_step_median': 1e3 * float(np.median(seconds)) / steps,
    'ms_per_step_best': 1e3 * min(seconds) / steps,
    'fraction_of_compute_limit': float(np.median(fractions)),
    'fraction_interval': [low, high],
    'matmul_gflops_per_sec_median': float(np.median(limits)) / 1e9,
  }


def run(
  batch_sizes: Iterable[int],
  steps: int = 50,
  repeats: int = 10,
  num_batches: int = 8,
  cardinality: int = 100_000,
  zipf: float = 1.05,
) -> list[dict[str, Any]]:
  """`time_training` at each batch size, in turn; each result with its 'batch_size' and 'backend'."""
  return [
    time_training(batch_size, steps, repeats, num_batches, cardinality, zipf)
    | {'batch_size': batch_size, 'backend': jax.default_backend()}
    for batch_size in batch_sizes
  ]


def summary_line(result: dict[str, Any]) -> str:
  """One batch size's figures as a line of text."""
  low, high = result['fraction_interval']
  return (
    f'batch {result["batch_size"]:5d}: {result["examples_per_sec"]:9.0f} examples/s '
    f'({result["ms_per_step_median"]:.2f} ms/step), {result["fraction_of_compute_limit"]:.2f} of the compute '
    f'limit ({low:.2f}-{high:.2f}; {result["matmul_gflops_per_sec_median"]:.1f} GFLOP/s matmul)'
  )


def table(results: Sequence[dict[str, Any]]) -> str:
  """A row a batch size: examples/sec, ms per step, the fraction of the compute limit (median, interval), the
  matmul rate."""
  lines = [
    '| batch | examples/sec | ms per step | fraction of the compute limit (median, interval) | matmul GFLOP/s |',
    '|---|---|---|---|---|',
  ]
  for result in results:
    low, high = result['fraction_interval']
    lines.append(
      f'| {result["batch_size"]} | {result["examples_per_sec"]:,.0f} | {result["ms_per_step_median"]:.2f} | '
      f'{result["fraction_of_compute_limit"]:.2f} ({low:.2f}-{high:.2f}) | '
      f'{result["matmul_gflops_per_sec_median"]:.1f} |'
    )
  return '\n'.join(lines)


def note(steps: int, repeats: int) -> str:
  """The setup under the table."""
  return (
    f'One replica of the reference model on {jax.default_backend()}; {FLOPS_PER_EXAMPLE / 1e6:.3f} MFLOP per '
    f'example; {repeats} repetitions of {steps} steps, each paired with a measure of the compute limit '
    '(the best f32 matmul rate of square matmuls of 256-2048) just before it; medians, and the interval between '
    'the second lowest and second highest repetition.'
  )


def headline(path: str) -> str:
  """The result file's one-sentence reading (`headlines`): each batch size's share of the matmul limit, against
  `TARGET`."""
  parts = []
  for row in result_files.rows(path):
    low, high = row['fraction_interval']
    target = TARGET[row['batch_size']]
    parts.append(
      f'{row["fraction_of_compute_limit"]:.2f} at batch {row["batch_size"]} (interval {low:.2f}-{high:.2f}; '
      f'target {target:g}: {result_files.verdict(low, high, target)})'
    )
  return "of this machine's matmul limit (measured in the same run): " + ', '.join(parts)
