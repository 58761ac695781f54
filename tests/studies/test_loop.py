"""The loop benchmark's three timings on the tiny config: each what it says, in one table."""

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
  # A loop around a block that trains nothing feeds more than the loop that trains; neither is free.
  assert 0 < run['loop_examples_per_sec'] < run['no_work_examples_per_sec']
  assert run['loop_share'] == run['loop_examples_per_sec'] / run['step_alone_examples_per_sec'] > 0
  assert run['in_memory_share'] > 0
  assert results['tiny']['loop_share_range'] == [run['loop_share']] * 2
  table = loop.table(results)
  assert table.count('\n') == 2 and '| tiny | 128 |' in table
  assert 'target 0.9' in table and 'target 5M' in table
  # The no-work runs did not train: the library's block program is back in place for everyone after.
  assert loop.train.make_train_block is not loop._make_no_work_block
