"""The examples of docs/architecture.md's "Add your own", run: a hook of one's own cuts the blocks where it is due,
sees every boundary and changes nothing it does not touch; a sync algorithm of one's own trains in the foreground
and in the background as the built-in ones do."""

import jax
import numpy as np
import pytest

from experiments.configs import default
from shadowsync_jax import hooks
from shadowsync_jax import train
from shadowsync_jax.sync import algorithms


class EveryNSteps(hooks.Hook):
  """Reads the replicas' mean loss every `n` steps (the example in docs/architecture.md)."""

  def __init__(self, n: int):
    self.n, self.seen, self.losses = n, [], {}

  def next_due(self, step):
    return (step // self.n + 1) * self.n  # The loop ends a block here.

  def at_boundary(self, b):
    self.seen.append((b.step, b.steps))
    if b.step % self.n == 0:
      self.losses[b.step] = float(np.mean(jax.device_get(b.metrics['loss'])[:, : b.steps]))


def _tiny(steps_per_dispatch):
  config = default.get_config('tiny')
  config.num_replicas = 2
  config.data.num_train_examples = 4096  # 16 steps of 2 x 128.
  config.train.steps_per_dispatch = steps_per_dispatch
  config.train.all_steps_program = True
  return config


def test_a_hook_of_ones_own_cuts_the_blocks_where_it_is_due_and_sees_every_boundary(tmp_path):
  hook = EveryNSteps(6)
  summary = train.train_and_evaluate(_tiny(4), tmp_path / 'hooked', extra_hooks=[hook])
  assert summary['train_steps'] == 16
  ends = [step for step, _ in hook.seen]
  assert ends == sorted(ends) and ends[-1] == 16 and {6, 12} <= set(ends)
  assert all(steps <= 4 for _, steps in hook.seen) and sum(steps for _, steps in hook.seen) == 16
  assert sorted(hook.losses) == [6, 12] and all(0 < loss < 1 for loss in hook.losses.values())
  # Blocks cut elsewhere train the same model (tests/test_train.py): the hook changed nothing it did not touch.
  plain = train.train_and_evaluate(_tiny(4), tmp_path / 'plain')
  assert plain['eval_ne'] == summary['eval_ne']
  assert plain['consensus_fingerprint_per_process'] == summary['consensus_fingerprint_per_process']


def half_averaging(settings: algorithms.Settings) -> algorithms.SyncAlgorithm:
  """Each replica moves halfway to the replica mean: `w_i <- (w_i + mean_j w_j) / 2` (the example in
  docs/architecture.md)."""
  halfway = lambda params, mean: jax.tree.map(lambda w, m: (w + m) / 2, params, mean)

  def sync(params, state):
    return halfway(params, algorithms.replica_mean(params, settings.axis_name)), state

  return algorithms.SyncAlgorithm(
    init=lambda params: (),  # No state.
    sync=sync,
    contribution=lambda params, state: params,  # What the round averages over the replicas (shadow rounds).
    finish=lambda params, state, mean: (halfway(params, mean), state),  # The round, given that average.
  )


@pytest.fixture(name='registered')
def _registered():
  algorithms.register('half', half_averaging)  # As docs/architecture.md does it: `fr_half` and `shadow_half` exist.
  yield
  algorithms._BUILDERS.pop('half')  # pylint: disable=protected-access  (the next test finds the registry as it was)


@pytest.mark.parametrize('mode', ['fr', 'shadow'])
def test_a_sync_algorithm_of_ones_own_runs_in_the_foreground_and_in_the_background(tmp_path, registered, mode):
  del registered
  summaries = {}
  for algorithm in ('none', f'{mode}_half'):
    config = _tiny(4)
    config.sync.algorithm = algorithm
    summaries[algorithm] = train.train_and_evaluate(config, tmp_path / algorithm)
  ours = summaries[f'{mode}_half']
  assert ours['sync_rounds'] > 0 and ours['eval_ne'] < 1
  assert ours['replica_divergence'] < summaries['none']['replica_divergence']  # The rounds pull the replicas together.


def test_a_name_taken_is_refused():
  with pytest.raises(ValueError, match="'ma' is taken"):
    algorithms.register('ma', half_averaging)
