r"""TorchRec's DLRM trained on batches given to it, timed: the peer `benchmarks.torchrec_dlrm` sets beside this
framework. Runs in a Python that has torch, fbgemm-gpu-cpu and torchrec (never this framework's):

  TORCHREC_PYTHON -m benchmarks.torchrec_worker BATCHES.npz OUT.json --steps=2000 --warmup=200 --lr=0.1

BATCHES.npz holds `dense` [N, B, 13], `sparse` [N, B, 26] (ids within each table), `label` [N, B] and
`cardinalities` [26]; the N batches are cycled (built once, as TorchRec's own benchmarks do). The model is TorchRec's
`DLRM` with the same layout as `experiments/configs/criteo_kaggle.py` (bottom 13-512-256-64-16, 26 tables x 16, dot
interaction, top 367-512-256-1), the tables sharded by `DistributedModelParallel` on one CPU process (gloo), their
SGD fused into the backward pass (FBGEMM's table-batched embeddings, `apply_optimizer_in_backward`), the MLPs' SGD
apart; both at `--lr`. OUT.json: examples_per_sec over the timed steps, the mean loss of the last 100 steps, the
versions, the sharding TorchRec chose.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection
from torchrec import EmbeddingBagConfig
from torchrec import KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.models.dlrm import DLRM
from torchrec.models.dlrm import DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter


def _batches(path: str) -> tuple[list[Batch], list[int]]:
  data = np.load(path)
  dense, sparse, label = data['dense'], data['sparse'], data['label']
  num_batches, batch_size, num_tables = sparse.shape
  keys = [f'f{t}' for t in range(num_tables)]
  batches = []
  for i in range(num_batches):
    features = KeyedJaggedTensor.from_lengths_sync(
      keys=keys,
      values=torch.from_numpy(np.ascontiguousarray(sparse[i].T).reshape(-1).astype(np.int64)),  # Key-major.
      lengths=torch.ones(num_tables * batch_size, dtype=torch.int32),
    )
    batches.append(Batch(torch.from_numpy(dense[i]), features, torch.from_numpy(label[i])))
  return batches, [int(c) for c in data['cardinalities']]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('batches')
  parser.add_argument('out')
  parser.add_argument('--steps', type=int, default=2000)
  parser.add_argument('--warmup', type=int, default=200)
  parser.add_argument('--lr', type=float, default=0.1)
  args = parser.parse_args()
  batches, cardinalities = _batches(args.batches)
  os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
  os.environ.setdefault('MASTER_PORT', '29512')
  dist.init_process_group('gloo', rank=0, world_size=1)
  tables = [
    EmbeddingBagConfig(name=f't{t}', embedding_dim=16, num_embeddings=rows, feature_names=[f'f{t}'])
    for t, rows in enumerate(cardinalities)
  ]
  model = DLRMTrain(
    DLRM(
      embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device('meta')),
      dense_in_features=13,
      dense_arch_layer_sizes=[512, 256, 64, 16],
      over_arch_layer_sizes=[512, 256, 1],
    )
  )
  apply_optimizer_in_backward(torch.optim.SGD, model.model.sparse_arch.parameters(), {'lr': args.lr})
  model = DistributedModelParallel(module=model, device=torch.device('cpu'))
  dense = KeyedOptimizerWrapper(
    dict(in_backward_optimizer_filter(model.named_parameters())), lambda params: torch.optim.SGD(params, lr=args.lr)
  )
  optimizer = CombinedOptimizer([model.fused_optimizer, dense])
  losses = []

  def train(steps: int) -> None:
    for i in range(steps):
      loss, _ = model(batches[i % len(batches)])
      optimizer.zero_grad()
      loss.backward()
      optimizer.step()
      losses.append(loss.detach())

  train(args.warmup)
  started = time.perf_counter()
  train(args.steps)
  seconds = time.perf_counter() - started
  batch_size = batches[0].dense_features.shape[0]
  plan = str(model.plan).splitlines()
  result = {
    'examples_per_sec': args.steps * batch_size / seconds,
    'steps': args.steps,
    'batch_size': batch_size,
    'mean_loss_last_100': float(torch.stack(losses[-100:]).mean()),
    'torch': torch.__version__,
    'torchrec': __import__('torchrec').__version__,
    'threads': torch.get_num_threads(),
    'plan': plan[:6],
  }
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)
  print(json.dumps({k: v for k, v in result.items() if k != 'plan'}))


if __name__ == '__main__':
  main()
