r"""Criteo Terabyte (Criteo 1TB Click Logs: about 4.37B rows in day_0 .. day_23) as MLPerf trains DLRM-DCNv2 on it.

One pass in time order over days 0-22 (4,195,197,692 rows), day 23 (178,274,637 rows) held out, as MLPerf splits
it. Table sizes are MLPerf's: each of the 26 features hashed into at most 40M rows (torchrec's
`num_embeddings_per_feature` of the MLPerf DLRM-DCNv2 reference; ids here are `int(hex, 16) % size`, one pass, no
dictionary). The model is MLPerf's DLRM-DCNv2: embeddings of 128, bottom 13-512-256-128, 3 low-rank cross layers of
rank 512 over 27 x 128 = 3456 inputs, top 3456-1024-1024-512-256-1, Adagrad at 0.004, global batch 65,536 (8
replicas of 8,192). Prepare once (day_N.gz as Criteo ships them, or gunzipped), then train:

  python -m experiments.prepare_criteo --config=experiments/configs/criteo_terabyte.py --inputs='day_*.gz'
  python -m experiments.train --config=experiments/configs/criteo_terabyte.py --workdir=/tmp/terabyte

The tables hold 204M rows: 105 GB of float32 at width 128, 13 GB at width 16. They are sharded over the replicas'
devices (`sync.embedding_placement='auto'`: each row held once in the job, docs/design.md §4), so the full variants need
machines that hold 105 GB between them, and `dim16` trains here, on 8 replicas as 2 processes x 4 devices:

  python -m experiments.launch --num_processes=2 --cpu_devices=4 -- --workdir=/tmp/terabyte16 \
      --config=experiments/configs/criteo_terabyte.py:dim16 --config.data.source=synthetic \
      --config.data.num_train_examples=2000000 --config.data.num_eval_examples=200000

The real files cannot be downloaded on the project's machines, so no figure of the real data is claimed here;
MLPerf's quality target is AUC 0.8025 (v1 DLRM).

Variants:
  'dot'    MLPerf v1's DLRM: the dot interaction, top 479-1024-1024-512-256-1, SGD at 1.0, 8 replicas of 2,048.
  'dim16'  'dot' with embeddings of 16 (bottom 13-512-256-16, top 367-1024-1024-512-256-1): the same 204M rows,
           13 GB, sharded over 8 replicas: 1.6 GB a device, 6.5 GB a process of 4.
  'local'  24 generated day files sized for a 2-core laptop (the default problem's tables and model, a DCN
           interaction of rank 64): generate, prepare and train as criteo_kaggle.py:local, with --days=24.
  'tiny'   the tests' and a quick look's: 50-row tables, a small DCN model; generate --rows=240000 --days=24.
"""

from shadowsync_jax import config as config_lib
from shadowsync_jax.data.criteo import cardinalities
from shadowsync_jax.data.prepared import manifest

TERABYTE_CARDINALITIES = cardinalities.TERABYTE  # MLPerf's: every feature hashed into at most 40M rows.


def get_config(variant: str = ''):
  config = config_lib.base_config()
  config.data.source = 'prepared'
  config.data.prepared_dir = manifest.default_dir(
    'terabyte' if variant in ('', 'dot', 'dim16') else f'terabyte_{variant}'
  )
  # num_train_examples = num_eval_examples = 0 (the defaults): days 0-22 and day 23, whole.
  config.data.cardinalities = TERABYTE_CARDINALITIES
  config.num_replicas = 8
  config.batch_size = 8192
  config.model.embedding_dim = 128
  config.model.bottom_mlp = (512, 256, 128)
  config.model.top_mlp = (1024, 1024, 512, 256, 1)
  config.model.interaction = 'dcn'
  config.model.cross_layers = 3
  config.model.cross_rank = 512
  config.optimizer.mlp = 'adagrad'
  config.optimizer.embedding = 'rowwise_adagrad'
  config.optimizer.mlp_learning_rate = config.optimizer.embedding_learning_rate = 0.004
  config.sync.algorithm = 'sync_sgd'  # MLPerf trains one model on the global batch.
  config.sync.embedding_placement = 'auto'  # Sharded over the replicas: the tables do not fit one device.
  config.train.log_every_steps = 1000
  config.train.checkpoint_every_steps = 0
  config.train.checkpoint_every_s = 600.0  # Tables of tens of GB: a save blocks for a while, a few a run.
  config.train.progress_every_s = 30.0
  config.train.eval_batch_size = 65_536
  if variant in ('dot', 'dim16'):
    config.model.interaction = 'dot'
    config.batch_size = 2048
    config.optimizer.mlp = config.optimizer.embedding = 'sgd'
    config.optimizer.mlp_learning_rate = config.optimizer.embedding_learning_rate = 1.0
    if variant == 'dim16':  # The same data and tables, narrower.
      config.model.embedding_dim = 16
      config.model.bottom_mlp = (512, 256, 16)
  elif variant in ('local', 'tiny'):
    defaults = config_lib.base_config()
    config.num_replicas, config.sync.algorithm = defaults.num_replicas, defaults.sync.algorithm
    config.batch_size = defaults.batch_size
    config.optimizer = defaults.optimizer
    config.train = defaults.train
    config.data.cardinalities = defaults.data.cardinalities
    config.model = defaults.model
    config.model.interaction = 'dcn'
    if variant == 'tiny':
      config.data.cardinalities = (50,) * config_lib.NUM_SPARSE_FEATURES
      config.model.embedding_dim = 8
      config.model.bottom_mlp = (16, 8)
      config.model.top_mlp = (16, 1)
      config.model.cross_layers, config.model.cross_rank = 2, 16
      config.optimizer.mlp_learning_rate = config.optimizer.embedding_learning_rate = 0.1
  elif variant:
    raise ValueError(
      f'unknown variant {variant!r} of experiments/configs/criteo_terabyte.py; known: dot, dim16, local, tiny'
    )
  return config
