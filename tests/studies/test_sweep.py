"""The sweep: its grid, CSV and figures on hand-made rows, and one real two-cell sweep that trains, resumes and
refuses to mix configs."""

import jax
import pytest

from experiments.configs import default
from shadowsync_jax import train
from shadowsync_jax.studies import provenance
from shadowsync_jax.studies import sweep

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _summary(eval_ne, examples_per_sec, rounds=0, mean_gap=None, max_gap=None):
  return {
    'eval_ne': eval_ne,
    'eval_auc': 0.75,
    'eval_logloss': 0.4,
    'bayes_ne': 0.82,
    'examples_per_sec': examples_per_sec,
    'sync_rounds': rounds,
    'mean_sync_gap': mean_gap,
    'max_sync_gap': max_gap,
    'mean_round_latency_s': None,
    'replica_divergence': 0.0,
    'train_examples': 1024,
    'wall_time_s': 3.0,
  }


@pytest.fixture
def rows():
  """A 1-2-4 replica grid of `none` and `fr_ma`; `fr_ma` runs at 3/4 and 1/2 of `none`'s speed."""
  summaries = {
    (1, 'none'): _summary(0.84, 1000.0),
    (2, 'none'): _summary(0.86, 1200.0),
    (2, 'fr_ma'): _summary(0.85, 900.0, rounds=5, mean_gap=10.0, max_gap=12),
    (4, 'none'): _summary(0.88, 1100.0),
    (4, 'fr_ma'): _summary(0.855, 550.0, rounds=0),  # A run too short for a round to merge.
  }
  return [sweep.row_from_summary(sweep.Cell(*key), s, f'/runs/{key[1]}/R{key[0]}') for key, s in summaries.items()]


def _line(ax, label):
  return next(line for line in ax.get_lines() if line.get_label() == label)


def test_grid_is_one_single_replica_cell_then_every_algorithm_per_replica_count():
  cells = sweep.grid([4, 1, 2, 2], ['fr_ma', 'none', 'fr_ma'])
  assert cells == [
    sweep.Cell(1, 'none'),
    sweep.Cell(2, 'fr_ma'),
    sweep.Cell(2, 'none'),
    sweep.Cell(4, 'fr_ma'),
    sweep.Cell(4, 'none'),
  ]
  assert cells[3].name == 'fr_ma/R4' and cells[3].label == 'fr_ma R=4'


@pytest.mark.parametrize(
  'replicas, algorithms, message',
  [
    ([1, 2], ['fr_ma', 'gossip'], 'gossip'),  # Unknown to the config.
    ([1, 2], ['shadow_mma'], 'shadow_mma'),
    ([0, 2], ['fr_ma'], 'positive'),
  ],
)
def test_grid_rejects_what_cannot_run(replicas, algorithms, message):
  with pytest.raises(sweep.SweepError, match=message):
    sweep.grid(replicas, algorithms)


def test_cell_config_sets_replicas_and_algorithm_on_a_copy():
  base = default.get_config('tiny')
  config = sweep.cell_config(base, sweep.Cell(4, 'shadow_ea'))
  assert (config.num_replicas, config.sync.algorithm) == (4, 'shadow_ea')
  assert (base.num_replicas, base.sync.algorithm) == (0, 'none')  # 0: one per process.
  assert config.data.num_train_examples == base.data.num_train_examples  # The total stream stays fixed.


def test_csv_round_trip_with_throughput_relative_to_none(rows, tmp_path):
  sweep.write_csv(rows, tmp_path / 'sweep.csv')
  read = sweep.read_csv(tmp_path / 'sweep.csv')
  assert [(r['replicas'], r['algorithm']) for r in read] == [
    (1, 'none'),
    (2, 'none'),
    (2, 'fr_ma'),
    (4, 'none'),
    (4, 'fr_ma'),
  ]
  assert [r['examples_per_sec_vs_none'] for r in read] == pytest.approx([1.0, 1.0, 0.75, 1.0, 0.5])
  assert read[0]['ne_vs_floor_pct'] == pytest.approx(100 * (0.84 / 0.82 - 1))
  assert read[2]['sync_rounds'] == 5 and isinstance(read[2]['sync_rounds'], int)
  assert read[2]['mean_sync_gap'] == 10.0 and read[0]['mean_sync_gap'] is None
  assert read[4]['workdir'] == '/runs/fr_ma/R4'


def test_ne_figure_starts_every_curve_at_the_single_replica_cell_and_draws_the_floor(rows, tmp_path):
  fig = sweep.plot_eval_ne(rows, tmp_path / 'eval_ne.png')
  ax = fig.axes[0]
  assert list(_line(ax, 'fr_ma').get_xdata()) == [1, 2, 4]
  assert list(_line(ax, 'fr_ma').get_ydata()) == [0.84, 0.85, 0.855]
  assert list(_line(ax, 'none').get_ydata()) == [0.84, 0.86, 0.88]
  assert list(_line(ax, 'Bayes NE floor 0.8200').get_ydata()) == [0.82, 0.82]
  assert (tmp_path / 'eval_ne.png').read_bytes().startswith(PNG_MAGIC)


def test_throughput_figure_shows_the_ratio_to_none_and_the_note(rows, tmp_path):
  fig = sweep.plot_examples_per_sec(rows, tmp_path / 'eps.png', note='8 virtual devices on 2 cores')
  absolute_ax, ratio_ax = fig.axes
  assert list(_line(absolute_ax, 'fr_ma').get_ydata()) == [1000.0, 900.0, 550.0]
  assert list(_line(ratio_ax, 'fr_ma').get_ydata()) == pytest.approx([1.0, 0.75, 0.5])
  assert '8 virtual devices on 2 cores' in fig.texts[0].get_text()  # The suptitle.


def test_sync_gap_figure_has_a_bar_per_cell_with_rounds_and_says_where_none_merged(rows, tmp_path):
  fig = sweep.plot_sync_gap(rows, tmp_path / 'gap.png')
  ax = fig.axes[0]
  assert [label.get_text() for label in ax.get_xticklabels()] == ['fr_ma']
  assert [patch.get_height() for patch in ax.patches] == [10.0]
  assert [text.get_text() for text in ax.texts] == ['no round']


@pytest.fixture(scope='module')
def small_base_config():
  config = default.get_config('tiny')
  config.data.num_train_examples = 8192
  config.data.num_eval_examples = 1024
  config.batch_size = 64
  config.train.progress_every_s = 600.0
  return config


def _must_not_train(config, workdir):
  raise AssertionError(f'trained {config.sync.algorithm} R={config.num_replicas} in {workdir}')


def test_sweep_trains_each_cell_on_the_same_stream_and_resumes(small_base_config, tmp_path):
  cells = sweep.grid([1, 2], ['fr_ma'])
  printed = []
  rows = sweep.run(
    cells,
    small_base_config,
    tmp_path,
    train.train_and_evaluate,
    num_devices=len(jax.devices()),
    print_fn=printed.append,
  )

  assert [(r['replicas'], r['algorithm'], r['train_examples']) for r in rows] == [(1, 'none', 8192), (2, 'fr_ma', 8192)]
  # fr_ma: 8192 / (2 replicas x 64) = 64 steps, a round every 10.
  assert (rows[1]['sync_rounds'], rows[1]['mean_sync_gap']) == (6, 10.0)
  assert all(r['bayes_ne'] < r['eval_ne'] for r in rows), rows
  for cell in cells:
    assert {'summary.json', 'metrics.jsonl'} <= {p.name for p in (tmp_path / cell.name).iterdir()}
    assert list((tmp_path / cell.name).glob('events.out.tfevents.*'))
  assert [r['eval_ne'] for r in sweep.read_csv(tmp_path / sweep.CSV_FILENAME)] == [r['eval_ne'] for r in rows]
  for name in sweep.PLOT_FILENAMES:
    assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC), name
  assert printed[0].startswith('cell 1/2: none R=1 (8,192 examples, 1 x batch 64)'), printed
  assert any(line.startswith('cell 2/2: fr_ma R=2 done in') and 'eval NE' in line for line in printed), printed

  printed.clear()
  again = sweep.run(
    cells, small_base_config, tmp_path, _must_not_train, num_devices=8, print_fn=printed.append, command='the sweep'
  )
  assert again == rows
  text = (tmp_path / sweep.CSV_FILENAME).read_text()
  record = provenance.read(text)  # A finished sweep with its command says where its CSV came from.
  assert record['command'] == 'the sweep' and text.startswith('# `the sweep`\n# Written ')
  assert 'shadowsync_jax/studies/sweep.py' in record['measures']
  assert [r['eval_ne'] for r in sweep.read_csv(tmp_path / sweep.CSV_FILENAME)] == [r['eval_ne'] for r in rows]
  assert all('finished earlier' in line for line in printed), printed

  changed = small_base_config.copy_and_resolve_references()
  changed.batch_size = 32
  with pytest.raises(sweep.SweepError, match='batch_size'):
    sweep.run(cells, changed, tmp_path, _must_not_train, num_devices=8, print_fn=printed.append)


def test_sweep_validates_every_cell_before_training_any(small_base_config, tmp_path):
  with pytest.raises(sweep.SweepError, match='fr_ma R=16: num_replicas=16'):
    sweep.run(sweep.grid([1, 16], ['fr_ma']), small_base_config, tmp_path, _must_not_train, num_devices=8)
  stopping = small_base_config.copy_and_resolve_references()
  stopping.train.stop_at_step = 10
  with pytest.raises(sweep.SweepError, match='stop_at_step'):
    sweep.run(sweep.grid([1], ['none']), stopping, tmp_path, _must_not_train, num_devices=8)
  assert not list(tmp_path.iterdir())
