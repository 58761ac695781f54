r"""Criteo Kaggle (Display Advertising Challenge: 45,840,617 rows, 7 days) as the DLRM reference trains on it.

One pass in time order over days 1-6 (39,291,958 rows), the 7th day (6,548,659 rows) held out, as the DLRM
reference splits Kaggle's train.txt (facebookresearch/dlrm, data_utils.py). The model is the reference's:
bottom 13-512-256-64-16, 26 tables of Kaggle's cardinalities x 16 (the ids hashed into them), dot interaction,
top 367-512-256-1, SGD at 0.1, batch 128. Prepare once, then train from the prepared data:

  python -m experiments.prepare_criteo --config=experiments/configs/criteo_kaggle.py --inputs=train.txt --days=7
  python -m experiments.train --config=experiments/configs/criteo_kaggle.py --workdir=/tmp/kaggle

The tables hold 33.8M rows, 2.2 GB at width 16: one replica holds them whole (about 3 GB of memory in all); several
replicas hold them sharded (`sync.embedding_placement='auto'`: each row once in the job, docs/design.md §4), e.g.
8 replicas as 2 processes x 4 devices:

  python -m experiments.launch --num_processes=2 --cpu_devices=4 -- --workdir=/tmp/kaggle8 \
      --config=experiments/configs/criteo_kaggle.py --config.num_replicas=8 --config.sync.algorithm=shadow_ma

The prepared dataset goes to `data.prepared_dir`, ~/tensorflow_datasets/criteo_click_blocks/kaggle by default
(`tfds.data_source('criteo_click_blocks/kaggle', split='train')` reads it); override it on both commands with
--config.data.prepared_dir=DATA_DIR/criteo_click_blocks/NAME. Seven day files work as well (--inputs='day_*.gz').
The real files cannot be downloaded on the project's machines, so no figure of the real data is claimed here;
the DLRM reference reports AUC about 0.80 after one pass.

Variants:
  'dcn'    DLRM-DCNv2 (MLPerf's current DLRM): 3 low-rank cross layers of rank 108 (TorchRec: ~ width / 4 of 432),
           top 432-512-256-1.
  'local'  the same layout on generated day files (`experiments.generate_criteo`), sized for a 2-core laptop: the
           default problem's tables (Kaggle's capped at 300) and model. With 4,000,000 generated rows, 7 days:
             python -m experiments.generate_criteo --config=experiments/configs/criteo_kaggle.py:local \
                 --rows=4000000 --days=7 --output_dir=/tmp/criteo_gen
             python -m experiments.prepare_criteo --config=experiments/configs/criteo_kaggle.py:local \
                 --inputs='/tmp/criteo_gen/day_*.gz'
             python -m experiments.train --config=experiments/configs/criteo_kaggle.py:local --workdir=/tmp/local
           Days 1-6 train, day 7 is held out; the NE, the floor and the speeds measured: docs/studies/criteo.md.
  'gpu'    sized for one GPU: batch 16,384 (NVIDIA's DLRM trains Kaggle at 64k on one A100), Adagrad on the MLP and
           row-wise Adagrad on the tables at 0.03 (SGD at a batch this large needs a warm-up this config has not;
           0.03 was the best of 0.01, 0.03, 0.1 and 0.3 on the synthetic stream: BUILD.md, "Run on a GPU").
           `benchmarks/gpu_check.sh` runs it.
  'tiny'   the tests' and a quick look's: 50-row tables, a small model (generated with --rows=200000 --days=7:
           seconds for all three commands).
"""

from shadowsync_jax import config as config_lib
from shadowsync_jax.data.criteo import cardinalities
from shadowsync_jax.data.prepared import manifest

KAGGLE_CARDINALITIES = cardinalities.KAGGLE  # Distinct values of C1..C26 in train.txt (33.8M rows).


def get_config(variant: str = ''):
  config = config_lib.base_config()
  config.data.source = 'prepared'
  config.data.prepared_dir = manifest.default_dir('kaggle' if variant in ('', 'dcn', 'gpu') else f'kaggle_{variant}')
  # num_train_examples = num_eval_examples = 0 (the defaults): days 1-6 and day 7, whole.
  config.data.cardinalities = KAGGLE_CARDINALITIES
  config.batch_size = 128
  config.model.embedding_dim = 16
  config.model.bottom_mlp = (512, 256, 64, 16)
  config.model.top_mlp = (512, 256, 1)
  config.optimizer.mlp = config.optimizer.embedding = 'sgd'
  config.optimizer.mlp_learning_rate = config.optimizer.embedding_learning_rate = 0.1
  config.sync.embedding_placement = 'auto'  # One replica: its tables (2.2 GB); several: the tables sharded over them.
  config.train.log_every_steps = 1000
  config.train.checkpoint_every_steps = 0
  config.train.checkpoint_every_s = 600.0  # A save of 2.2 GB of tables blocks for seconds here: a few a run.
  config.train.progress_every_s = 30.0
  if variant == 'dcn':
    config.model.interaction = 'dcn'
    config.model.cross_layers = 3
    config.model.cross_rank = 108
  elif variant == 'local':
    defaults = config_lib.base_config()
    config.data.cardinalities = defaults.data.cardinalities
    config.batch_size = defaults.batch_size
    config.model, config.optimizer = defaults.model, defaults.optimizer
    config.train.checkpoint_every_steps = 2000
    config.train.checkpoint_every_s = 0.0
    config.train.progress_every_s = 5.0
  elif variant == 'gpu':
    config.batch_size = 16_384
    config.optimizer.mlp, config.optimizer.embedding = 'adagrad', 'rowwise_adagrad'
    config.optimizer.mlp_learning_rate = config.optimizer.embedding_learning_rate = 0.03
    config.train.log_every_steps = 20
  elif variant == 'tiny':
    config.data.cardinalities = (50,) * config_lib.NUM_SPARSE_FEATURES
    config.model.embedding_dim = 8
    config.model.bottom_mlp = (16, 8)
    config.model.top_mlp = (16, 1)
    config.optimizer.mlp = 'adagrad'
    config.optimizer.embedding = 'rowwise_adagrad'
    config.train.log_every_steps = 50
    config.train.checkpoint_every_steps = 500
    config.train.checkpoint_every_s = 0.0
    config.train.progress_every_s = 5.0
  elif variant:
    raise ValueError(
      f'unknown variant {variant!r} of experiments/configs/criteo_kaggle.py; known: dcn, gpu, local, tiny'
    )
  return config
