"""The loop benchmark's three timings on the tiny config: each what it says, in one table."""

import os
import sys

from experiments.configs import default
from shadowsync_jax.studies import loop


def test_the_loop_the_step_alone_and_the_no_work_loop_are_timed_and_tabled(tmp_path):
  results = loop.run(
    {'tiny': lambda: default.get_config('tiny')},
    repeats=1,
    root=tmp_path,
    num_train_examples={'tiny': 32_768},
    num_eval_examples=1024,
  )
  (run,) = results['tiny']['runs']
  assert run['steps_per_dispatch'] >= 1 and run['eval_ne'] < 1.0
  # Both timed. Not which is faster (the benchmark's question): at the tiny config's step of about a millisecond
  # both run at the host's pace, and the no-work loop once read 99,391 examples/s against the loop's 106,111.
  assert run['loop_examples_per_sec'] > 0 and run['no_work_examples_per_sec'] > 0
  assert run['loop_share'] == run['loop_examples_per_sec'] / run['step_alone_examples_per_sec'] > 0
  assert run['in_memory_share'] > 0
  assert results['tiny']['loop_share_range'] == [run['loop_share']] * 2
  table = loop.table(results)
  assert table.count('\n') == 2 and '| tiny | 128 |' in table
  assert 'target 0.9' in table and 'target 5M' in table
  # The no-work runs did not train: the library's block program is back in place for everyone after.
  assert loop.dispatch.make_train_block is not loop._make_no_work_block


def test_the_jobs_step_alone_sums_its_processes_run_at_once_and_its_row_says_what_was_not_timed():
  """(a) of a job: one command a process (its index added), each pinned to its share of the cores, all at once; the
  sum of the first figures of their last lines; (a) with (d) from both figures. Its row has (b)/(a), (b')/(a), no (c),
  and (a) with (d)."""
  script = (
    'import os, sys; print("warm-up line"); index = int(sys.argv[-1].split("=")[1]); '
    'print(len(os.sched_getaffinity(0)) * 1000.0, 3000.0 * (index + 1))'
  )
  cores = len(os.sched_getaffinity(0))
  each = 1000.0 * (cores // loop.JOB_PROCESSES if cores >= loop.JOB_PROCESSES else 1)
  step_alone, with_reading = loop.time_job_step_alone([sys.executable, '-c', script])
  assert step_alone == loop.JOB_PROCESSES * each
  assert with_reading == sum(1 / (1 / each + 1 / (3000.0 * (p + 1))) for p in range(loop.JOB_PROCESSES))
  job = {
    'config': 'default, 2 x 4 replicas, shadow_ma',
    'batch_size': 256,
    'runs': [
      {
        'steps_per_dispatch': 1,
        'step_alone_examples_per_sec': 100.0,
        'loop_examples_per_sec': 80.0,
        'in_memory_share': 0.95,
        'with_reading_share': 0.85,
      }
    ],
    'loop_share_median': 0.8,
    'loop_share_range': [0.8, 0.8],
    'no_work_examples_per_sec_median': None,
  }
  assert loop.table({'job': job}).splitlines()[-1] == (
    '| default, 2 x 4 replicas, shadow_ma | 256 | 1 | 100 | 80 | 0.80 (0.80-0.80; target 0.9: not met) '
    '| 0.95 (0.95-0.95) | - | 0.85 (0.85-0.85) |'
  )


def test_a_job_is_timed_with_each_algorithm_in_turn_each_at_the_k_it_chose(monkeypatch, tmp_path):
  """Each repeat runs the `shadow_ma` job, the `none` job, then the other shadow algorithms' (so that each pair ran
  minutes apart), each (a) at the K and the algorithm of its own (b); a row each, 'job' and 'job_ALGORITHM'."""
  order, commands = [], []
  ks = {'shadow_ma': 8, 'none': 16, 'shadow_ea': 8, 'shadow_bmuf': 32}

  def fake_loop(algorithm, num_train_examples, workdir, in_memory=False):
    order.append(algorithm + (' in memory' if in_memory else ''))
    return {
      'train_steps': 100,
      'steps_per_dispatch': ks[algorithm],
      'examples_per_sec': 95.0 if in_memory else 90.0,
      'sync_rounds': 3,
      'eval_ne': 0.84,
    }

  def fake_step_alone(command):
    commands.append(command)
    return 100.0, 90.0

  monkeypatch.setattr(loop, 'time_job_loop', fake_loop)
  monkeypatch.setattr(loop, 'time_job_step_alone', fake_step_alone)
  rows = loop.run_job(2, 1000, tmp_path, ['python', '-m', 'benchmarks.loop'])
  assert order == [f'{a}{b}' for a in ('shadow_ma', 'none', 'shadow_ea', 'shadow_bmuf') for b in ('', ' in memory')] * 2
  assert commands[1][-3:] == ['--process_step_alone=100', '--process_k=16', '--process_algorithm=none']
  assert sorted(rows) == ['job', 'job_none', 'job_shadow_bmuf', 'job_shadow_ea']
  assert rows['job']['algorithm'] == 'shadow_ma' and rows['job_none']['config'].endswith('replicas, none')
  assert [r['steps_per_dispatch'] for r in rows['job_shadow_bmuf']['runs']] == [32, 32]
  assert rows['job']['loop_share_median'] == 0.9 and rows['job']['runs'][0]['in_memory_share'] == 0.95
  assert rows['job']['runs'][0]['with_reading_share'] == 0.9
  table = loop.table(rows).splitlines()
  assert table[-4].startswith('| default, 2 x 4 replicas, shadow_ma | 256 | 8 |') and ', none |' in table[-3]


def test_reading_a_processs_blocks_is_timed_on_its_own_replicas_slice():
  """(d): the blocks of some replicas read as the loop reads them; a rate over about as many steps as asked."""
  config = default.get_config('tiny')
  config.num_replicas, config.data.num_train_examples = 8, 65_536
  rate = loop.time_block_reading(config, steps_per_dispatch=4, timed_steps=16, replicas_read=range(4, 8))
  assert rate > 0
