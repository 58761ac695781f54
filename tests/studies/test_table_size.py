"""The table-size study's pieces that need no job: its cells, the commands it runs, its table and its ratios."""

import pathlib

from shadowsync_jax.studies import table_size


def _row(cell: table_size.Cell, examples_per_sec: float, **extra) -> dict:
  return {
    'cell': cell.label,
    **cell._asdict(),
    'state_bytes': 2.16e9,
    'peak_rss_bytes': 2.8e9,
    'bound_bytes': 5.24e9,
    'examples_per_sec': examples_per_sec,
    'startup_s': 11.0,
    'save_blocking_s': 9.0,
    'saves_block': True,
    'restore_s': 5.0,
    'restore_peak_rss_bytes': 3.3e9,
    'eval_ne': 0.91,
    **extra,
  }


def test_cells_are_distinct_and_cover_every_size_and_placement():
  cells = table_size.default_cells(speed_runs=2)
  labels = [cell.label for cell in cells]
  assert len(set(labels)) == len(labels)
  assert {cell.size for cell in cells} == set(table_size.SIZES)
  assert {cell.placement for cell in cells} == {'replicated', 'shared', 'sharded'}
  assert {cell.exchange for cell in cells if cell.placement == 'sharded'} == {'all_gather', 'all_to_all'}


def test_a_cell_runs_the_training_binary_or_the_launcher_with_its_settings():
  one = table_size._args(table_size.Cell('Kaggle', 'replicated'), pathlib.Path('/w'), 1000, 100)
  assert one[:3] == ['-m', 'experiments.train', '--cpu_devices=1']
  assert '--config.data.cardinalities=' + ','.join(map(str, table_size.SIZES['Kaggle'])) in one
  cell = table_size.Cell('Terabyte', 'sharded', 8, 2, exchange='all_to_all', algorithm='shadow_ma')
  two = table_size._args(cell, pathlib.Path('/w'), 1000, 100)
  assert two[:5] == ['-m', 'experiments.launch', '--num_processes=2', '--cpu_devices=4', '--']
  for flag in (
    '--config.num_replicas=8',
    '--config.sync.shard_exchange=all_to_all',
    '--config.sync.algorithm=shadow_ma',
  ):
    assert flag in two
  other = table_size._args(table_size.Cell('Terabyte', 'sharded', 8, 2, config='c.py:v'), pathlib.Path('/w'), 1, 1)
  assert '--config=c.py:v' in other and not any(arg.startswith('--config.batch_size') for arg in other)


def test_speed_ratios_pair_runs_of_the_same_number_and_the_table_shows_refusals():
  cells = [table_size.Cell(size, 'replicated', run=run) for run in range(3) for size in ('100k', 'Kaggle')]
  rows = [_row(cell, speed) for cell, speed in zip(cells, (100.0, 80.0, 100.0, 95.0, 50.0, 60.0))]
  assert table_size.speed_ratios(rows) == [(128, [0.8, 0.95, 1.2])]
  refused = table_size.Cell('Terabyte', 'replicated', 8, 2)
  rows.append(
    {'cell': refused.label, **refused._asdict(), 'refused': 'the train state needs 105 GB', 'peak_rss_bytes': 1}
  )
  text = table_size.table(rows)
  assert 'refused: the train state needs 105 GB' in text
  assert 'batch 128: median 0.95 (runs in turn: 0.80, 0.95, 1.20)' in text
