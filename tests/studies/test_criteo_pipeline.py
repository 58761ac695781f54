"""The Criteo study's table: each figure beside its target, met or not, reading compared with training in the
same layout (the faster replica: the stricter ratio)."""

from experiments.configs import criteo_kaggle
from shadowsync_jax.studies import criteo_pipeline


def _reading(compression, processes, local, per_process):
  return {
    'compression': compression,
    'processes': [
      {
        'num_processes': processes,
        'replicas_per_process': local,
        'batch_size': 256,
        'examples_per_s': rate,
        'examples_per_cpu_s': rate,
      }
      for rate in per_process
    ],
  }


def _training(processes, per_process):
  return {
    'num_processes': processes,
    'num_replicas': processes,
    'examples_per_sec_per_process': per_process,
    'train_examples': 999_936,
    'eval_ne': 0.84,
    'bayes_ne': 0.82,
  }


def test_the_table_checks_every_target():
  raw = {
    'preparing': [
      {
        'compression': 'uncompressed',
        'rows': 4_000_000,
        'workers': 2,
        'rows_per_cpu_s': 150_000,
        'rows_per_s': 200_000,
        'bytes_per_row': 157,
      },
      {
        'compression': 'zstd:1',
        'rows': 4_000_000,
        'workers': 2,
        'rows_per_cpu_s': 90_000,
        'rows_per_s': 120_000,
        'bytes_per_row': 61,
      },
    ],
    'reading': [
      _reading('uncompressed', 1, 1, [2_000_000]),
      _reading('uncompressed', 2, 1, [1_500_000, 1_200_000]),
      _reading('zstd:1', 2, 1, [900_000, 950_000]),
    ],
    'training': [_training(1, [50_000]), _training(2, [40_000, 70_000])],
  }
  rows = criteo_pipeline.table(raw, criteo_kaggle.get_config('local')).splitlines()[2:]
  assert [row.rsplit('|', 2)[1].strip() for row in rows] == [
    'yes',
    '**no**',
    'yes',
    'yes',
    '**no**',
    '40x: yes',
    '17x: **no**',
  ]
  assert '1,200,000 examples/s per process (the slower)' in rows[3]
  assert '70,000 examples/s a replica (the faster)' in rows[6]


def test_the_training_job_is_launched_as_a_user_launches_it(tmp_path, monkeypatch):
  """`experiments.launch` through the studies' one job runner, one replica a process, the prepared data."""
  launched = []

  def fake_launch(workdir, launch_flags, train_flags):
    launched.append((workdir, launch_flags, train_flags))
    return criteo_pipeline.jobs.Job({'eval_ne': 0.84, 'config': {}}, 1.0, None, None)

  monkeypatch.setattr(criteo_pipeline.jobs, 'launch', fake_launch)
  summary = criteo_pipeline.measure_training_job('CONFIG.py', '/data', tmp_path, 1000, num_processes=2)
  assert summary == {'eval_ne': 0.84}
  ((workdir, launch_flags, train_flags),) = launched
  assert workdir == tmp_path and '--num_processes=2' in launch_flags
  assert {'--config=CONFIG.py', '--config.data.prepared_dir=/data', '--config.num_replicas=2'} <= set(train_flags)
