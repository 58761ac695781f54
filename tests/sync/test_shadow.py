"""ShadowSync (docs/design.md §3): the merge rule, a loop that never waits, errors, shutdown, donation, no leaks.

Most tests drive the real driver with a fake train step that adds a known per-replica delta to the params, so the
params at every step boundary are known exactly. A round is held or observed by wrapping its thread's `_meet` (where
the thread meets every process's sums, on the host): the wrapper records the snapshot `s` handed over and the synced
`s'` the algorithm makes of it, and holds the round until the test releases it. Nothing here sleeps to
pass; tests wait on events with generous timeouts, and every loop that could hang has a deadline.
"""

from collections.abc import Callable
import contextlib
import gc
import math
import threading
import time
from typing import Any

import fake_training
from fake_training import FakeState
import jax
import numpy as np
import optax
import pytest

from shadowsync_jax import hooks
from shadowsync_jax.data import batch as batch_lib
from shadowsync_jax.model import dlrm as model_lib
from shadowsync_jax.model import embedding
from shadowsync_jax.model import step as step_lib
from shadowsync_jax.parallel import replicas
from shadowsync_jax.sync import algorithms as sync_algorithms
from shadowsync_jax.sync import rounds as sync_rounds
from shadowsync_jax.sync import shadow as shadow_sync

TIMEOUT_S = 60.0  # Only reached when something is broken (a hang); healthy runs take well under a second.
ALL = ('mlp', 'embedding')


class Loop:
  """A training loop as train.py runs it, with the fake step in blocks of one (the driver's rounds fused in):
  `before_block`, the block, `at_boundary`, then read the step back. Each snapshot a block hands over is kept as
  numpy (`handed_over`): the next block takes the driver's copies of it."""

  def __init__(self, driver, num_replicas: int):
    self.mesh = replicas.make_mesh(num_replicas)
    self.initial, self.delta = fake_training.initial(num_replicas)
    self._deltas = replicas.shard(jax.tree.map(lambda d: d[:, None], self.delta), self.mesh)  # [R, 1, ...]
    self._one = replicas.shard(np.ones(num_replicas, np.int32), self.mesh)
    self.state = replicas.shard(FakeState(params=self.initial, step=np.zeros(num_replicas, np.int32)), self.mesh)
    self.driver, self.step = driver, 0
    self._block = fake_training.block_program(self.mesh, driver.between_steps())
    self._work_s = 0.0  # The loop's own work at the last boundary (`hooks.Boundary.work_s`).
    # (snapshot, sync state) of each round handed over, as numpy, in order; `handed_over_ready` when one is added.
    driver._handed_over_for_tests = self.handed_over = []  # pylint: disable=protected-access  (`HeldRounds`)
    self.handed_over_ready = driver._handed_over_ready_for_tests = threading.Condition()  # pylint: disable=protected-access

  def work(self, seconds: float) -> None:
    """The loop's own work at this boundary (a save, a metric write) took `seconds`."""
    self._work_s = seconds

  def advance(self) -> None:
    self.driver.before_block(hooks.Boundary(self.step, self.state, self.driver, steps=1))
    snapshot_step = self.driver._snapshot_step  # pylint: disable=protected-access
    carry = self.driver.block_carry(self.step, 1)
    self.state, _, carry = self._block(self.state, self._deltas, self._one, carry)
    self.driver.after_block(carry)
    if self.driver._snapshot_step != snapshot_step:  # pylint: disable=protected-access  (handed over in the block)
      with self.handed_over_ready:
        self.handed_over.append(jax.tree.map(np.asarray, (carry.snapshot, carry.sync_state)))
        self.handed_over_ready.notify_all()
    self.step += 1
    b = hooks.Boundary(self.step, self.state, self.driver, steps=1, work_s=self._work_s)
    self._work_s = 0.0
    self.driver.at_boundary(b)
    jax.block_until_ready(self.state.step)  # Keeps the dispatch queue short, as train.py's loss read-back does.

  def advance_until(self, condition: Callable[[], bool], what: str) -> None:

    def steps():
      deadline = time.monotonic() + TIMEOUT_S
      while not condition():
        assert time.monotonic() < deadline, f'{what} did not happen within {TIMEOUT_S} s'
        self.advance()

    _within(TIMEOUT_S * 1.5, steps)

  def run(self, num_steps: int) -> None:
    _within(TIMEOUT_S, lambda: [self.advance() for _ in range(num_steps)])

  def wait_for_rounds(self, rounds: int) -> None:
    _within(TIMEOUT_S * 1.5, lambda: self.driver.wait_for_rounds(rounds, self.advance, TIMEOUT_S))

  def unsynced(self, steps: int) -> dict[str, Any]:
    """The params of every replica after `steps` fake steps and no round."""
    return jax.tree.map(lambda p, d: p + steps * d, self.initial, self.delta)


class HeldRounds:
  """Stands in for a driver's thread's `_meet` (where a round's sums meet every process's): records each round, and
  holds it until `release` (fails it if `fail`). A round's snapshot and its synced params are recorded as the
  algorithm's round (`algorithms.stacked`) makes them from the snapshot handed over."""

  def __init__(self, driver, algorithm, fail: BaseException | None = None):
    self._driver, self._meet, self._fail = driver, driver._rounds._meet, fail  # pylint: disable=protected-access
    self._mesh = replicas.make_mesh(driver._rounds._num_replicas)  # pylint: disable=protected-access
    self._sync_R = sync_algorithms.stacked(algorithm, self._mesh)[1]
    self.entered, self.release = threading.Event(), threading.Event()
    self.rounds = []  # (snapshot s, synced s', sync state after the round), as numpy
    self.met = []  # The rounds that came to the meeting.

  def __call__(self, vector, stopped):
    if self._driver._served is not None:  # pylint: disable=protected-access  (served after the last step)
      return self._meet(vector, stopped)
    handed_over, ready = self._driver._handed_over_for_tests, self._driver._handed_over_ready_for_tests  # pylint: disable=protected-access
    with ready:  # The loop keeps a copy of each snapshot handed over, right after its block.
      if not ready.wait_for(lambda: len(handed_over) > len(self.met), TIMEOUT_S):
        raise TimeoutError('the loop kept no copy of the snapshot handed over')
      snapshot_L, sync_state_L = handed_over[len(self.met)]
    self.met.append(len(self.met))
    self.entered.set()
    if not self.release.wait(TIMEOUT_S):
      raise TimeoutError('the test never released the round')
    if self._fail is not None:
      raise self._fail
    synced, sync_state = self._sync_R(*replicas.shard((snapshot_L, sync_state_L), self._mesh))
    as_numpy = lambda tree: jax.tree.map(np.asarray, tree)
    self.rounds.append((as_numpy(snapshot_L), as_numpy(synced), as_numpy(sync_state)))
    return self._meet(vector, stopped)


@contextlib.contextmanager
def _holding_rounds(driver, monkeypatch, fail: BaseException | None = None):
  """Installs `HeldRounds` on `driver`; on exit releases it, so a failing test leaves no thread waiting."""
  held = HeldRounds(driver, driver._algorithm_for_tests, fail)  # pylint: disable=protected-access
  monkeypatch.setattr(driver._rounds, '_meet', held)
  try:
    yield held
  finally:
    held.release.set()


def _driver(name: str, num_replicas: int, groups=ALL, min_interval_s=0.0, algorithm=None, first_round_after=1):
  algorithm = algorithm or sync_algorithms.make(
    name, replicas.REPLICA_AXIS, num_replicas, elastic_alpha=0.1, block_momentum=-1.0, block_lr=1.0
  )
  meshes = replicas.make_meshes(num_replicas)
  driver = shadow_sync.ShadowSync(algorithm, name, meshes, groups, min_interval_s, first_round_after=first_round_after)
  driver._algorithm_for_tests = algorithm  # pylint: disable=protected-access  (`HeldRounds` replays its rounds)
  return driver


def _start(loop: Loop, **start_kwargs) -> threading.Thread:
  """Starts the driver; returns its background thread."""
  before = set(threading.enumerate())
  loop.driver.start(loop.state, loop.driver.initial_sync_state(loop.state), **start_kwargs)
  (thread,) = set(threading.enumerate()) - before
  return thread


def _within(timeout_s: float, fn: Callable[[], Any]) -> Any:
  """`fn()`, failing the test instead of hanging it when `fn` has not returned after `timeout_s`."""
  outcome = {}

  def target():
    try:
      outcome['value'] = fn()
    except BaseException as error:  # pylint: disable=broad-except  (re-raised below, in the test's thread)
      outcome['error'] = error

  runner = threading.Thread(target=target, daemon=True)
  runner.start()
  runner.join(timeout_s)
  assert not runner.is_alive(), f'did not return within {timeout_s} s'
  if 'error' in outcome:
    raise outcome['error']
  return outcome.get('value')


def _assert_tree_close(got, want, what):
  jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-5, err_msg=what), got, want)


@pytest.mark.parametrize('name,num_replicas,groups', [('ma', 8, ALL), ('ea', 4, ALL), ('ma', 4, ('mlp',))])
def test_merge_keeps_the_local_steps_made_during_the_round(monkeypatch, name, num_replicas, groups):
  """w <- w + (s' - s): the steps made between the snapshot and the merge survive the merge."""
  local_steps = 7
  loop = Loop(_driver(name, num_replicas, groups), num_replicas)
  done, agreements = loop.driver._rounds._done, []  # pylint: disable=protected-access

  def agree(_, interval_s, stopped):  # The round after the first is agreed once training is done: it moves nothing.
    agreements.append(interval_s)
    if len(agreements) > 1:
      done.wait()
    return done.is_set(), interval_s

  monkeypatch.setattr(loop.driver._rounds, '_agree', agree)
  with _holding_rounds(loop.driver, monkeypatch) as held:
    thread = _start(loop)
    loop.advance_until(held.entered.is_set, 'the first snapshot')
    loop.run(local_steps)
    assert loop.driver.stats()['sync_rounds'] == 0, 'merged a round that had not run'
  loop.wait_for_rounds(1)
  merge_step = loop.step

  snapshot, synced, _ = held.rounds[0]
  # The snapshot is the params of one step boundary, at least `local_steps` steps before the merge.
  snapshot_step = int(round(float(snapshot['mlp']['kernel'][0, 0, 0] - loop.initial['mlp']['kernel'][0, 0, 0])))
  assert 1 <= snapshot_step <= merge_step - local_steps, (snapshot_step, merge_step)
  _assert_tree_close(snapshot, {g: loop.unsynced(snapshot_step)[g] for g in groups}, 'snapshot')
  if name == 'ma':
    _assert_tree_close(synced, jax.tree.map(lambda s: np.broadcast_to(s.mean(axis=0), s.shape), snapshot), "s'")
  want = loop.unsynced(merge_step)
  for group in groups:
    want[group] = jax.tree.map(lambda w, s, s_new: w + (s_new - s), want[group], snapshot[group], synced[group])
  # Settled: a lead the next round landed at this boundary (EA's pull) taken back out; the merged round whole.
  _assert_tree_close(
    loop.driver.settled(loop.state)[0].params, want, f'params right after the merge at step {merge_step}'
  )
  assert loop.driver.stats()['sync_rounds'] == 1
  merged_at = merge_step - 1  # Before the first step of its block (of one step).
  assert loop.driver.stats()['max_sync_gap'] == merged_at
  assert loop.driver.stats()['mean_merge_lag_steps'] == merged_at - snapshot_step

  final = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert not thread.is_alive()
  if name == 'ea':  # The consensus is the center (docs/design.md §3) of the last round, which finish ran and merged.
    last_merged = held.rounds[-1]
    _assert_tree_close(
      loop.driver.consensus(final.params), jax.tree.map(lambda c: c[0], last_merged[2].center), 'ea consensus'
    )


def test_at_boundary_never_waits_for_a_round(monkeypatch):
  """200 steps go through while a round is held (`run`'s deadline fails the test if `at_boundary` waits for it)."""
  loop = Loop(_driver('ma', 8), 8)
  with _holding_rounds(loop.driver, monkeypatch) as held:
    _start(loop)
    loop.advance_until(held.entered.is_set, 'the first snapshot')
    first_held_step = loop.step
    loop.run(200)
    assert loop.driver.stats()['sync_rounds'] == 0
    assert not held.rounds
    _assert_tree_close(loop.state.params, loop.unsynced(first_held_step + 200), 'params while the round is held')
  loop.wait_for_rounds(2)
  _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))


class SyncFailed(RuntimeError):
  """A failure only this test raises, so catching it cannot mistake another error for it."""


def _failing_model_averaging() -> sync_algorithms.SyncAlgorithm:

  def finish(params, sync_state, mean):
    raise SyncFailed('round 1 of model averaging failed on purpose')

  ma = sync_algorithms.model_averaging(replicas.REPLICA_AXIS)
  return ma._replace(sync=lambda params, state: finish(params, state, params), finish=finish)


def test_a_round_that_cannot_compile_fails_start_in_the_training_thread():
  """The driver compiles its round when it starts: an algorithm that cannot be traced fails there, with its own
  error, before any thread runs."""
  loop = Loop(_driver('ma', 4, algorithm=_failing_model_averaging()), 4)
  before = set(threading.enumerate())
  with pytest.raises(SyncFailed, match='failed on purpose'):
    loop.driver.start(loop.state, loop.driver.initial_sync_state(loop.state))
  assert set(threading.enumerate()) == before


def test_thread_error_reaches_the_next_boundary_and_finish(monkeypatch):
  """The original exception, at the first step boundary after the thread died, then again from `finish`."""
  loop = Loop(_driver('ma', 4), 4)
  with _holding_rounds(
    loop.driver, monkeypatch, fail=SyncFailed('round 1 of model averaging failed on purpose')
  ) as held:
    held.release.set()  # The first round fails as soon as it is called, in the thread.
    thread = _start(loop)

    def steps_until_raised():
      deadline = time.monotonic() + TIMEOUT_S
      while time.monotonic() < deadline:
        thread_was_dead = not thread.is_alive()
        loop.advance()
        assert not thread_was_dead, 'at_boundary returned normally after the thread had died'
        thread.join(0.01)  # Lets the thread run; the test does not depend on how long it takes.

    with pytest.raises(SyncFailed) as raised:
      _within(TIMEOUT_S * 1.5, steps_until_raised)
    assert type(raised.value) is SyncFailed  # pylint: disable=unidiomatic-typecheck
    assert str(raised.value) == 'round 1 of model averaging failed on purpose'
    with pytest.raises(SyncFailed, match='failed on purpose'):
      _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
    assert not thread.is_alive()


def test_finish_raises_an_error_no_step_saw(monkeypatch):
  loop = Loop(_driver('ma', 4), 4)
  with _holding_rounds(loop.driver, monkeypatch, fail=SyncFailed('failed while no step ran')) as held:
    thread = _start(loop)
    loop.advance_until(held.entered.is_set, 'the first snapshot')
  with pytest.raises(SyncFailed, match='failed while no step ran'):
    _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert not thread.is_alive()


def test_finish_lands_no_round_after_the_last_step():
  """`finish` serves the peers' rounds from the final params until every process is done, and joins; those rounds
  land nowhere here: the model is the one trained (a BMUF round there would add a momentum step that no training
  follows)."""
  loop = Loop(_driver('ma', 4), 4)
  thread = _start(loop)
  loop.advance()  # The first round waits for training to be under way.
  assert loop.driver._rounds.snapshot_wanted.wait(TIMEOUT_S)  # pylint: disable=protected-access
  final = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert not thread.is_alive()
  _assert_tree_close(final.params, loop.unsynced(loop.step), 'params after finish')
  assert loop.driver.stats()['sync_rounds'] == 0 and loop.driver.stats()['mean_sync_gap'] is None


@pytest.mark.parametrize('peer_trains_on', [True, False])
def test_a_round_served_after_the_last_step_moves_the_sync_state_only_while_a_peer_trains(monkeypatch, peer_trains_on):
  """After its last step a process serves the peers' rounds from its final params and lands none in them. A round
  agreed while some process still trains moves the sync state (EA's center) here as on that peer, so that every
  process ends with one; a round agreed once every process is done moves nothing."""
  loop = Loop(_driver('ea', 4), 4)
  initial_sync_state = loop.driver.initial_sync_state(loop.state)
  if not peer_trains_on:  # The peer arrives at the agreement only once this process is done: all are done.
    monkeypatch.setattr(
      loop.driver._rounds, '_agree', lambda done, interval_s, stopped: (loop.driver._rounds._done.wait(), interval_s)
    )  # pylint: disable=protected-access
  thread = _start(loop)
  loop.advance()  # The first round waits for training to be under way.
  if peer_trains_on:  # This process agreed to a round while training (a peer trains on): its snapshot is wanted.
    assert loop.driver._rounds.snapshot_wanted.wait(TIMEOUT_S)  # pylint: disable=protected-access
  final = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert not thread.is_alive()
  _assert_tree_close(final.params, loop.unsynced(loop.step), 'params after finish')
  assert loop.driver.stats()['sync_rounds'] == 0
  want = initial_sync_state
  if peer_trains_on:  # One EA round from the final params.
    round_R = sync_algorithms.stacked(loop.driver._algorithm_for_tests, replicas.make_mesh(4))[1]  # pylint: disable=protected-access
    want = round_R(sync_rounds.copy(final.params), initial_sync_state)[1]
  _assert_tree_close(loop.driver.sync_state(), jax.tree.map(np.asarray, want), 'the center after finish')


def test_abandoning_stops_a_thread_that_waits_for_a_snapshot():
  loop = Loop(_driver('ma', 4), 4)
  thread = _start(loop)
  loop.advance()
  assert loop.driver._rounds.snapshot_wanted.wait(TIMEOUT_S)  # pylint: disable=protected-access
  started = time.monotonic()
  assert _within(10.0, lambda: loop.driver.finish(loop.state, abandon=True)) is loop.state
  assert not thread.is_alive()
  assert time.monotonic() - started < 10.0
  assert loop.driver.stats()['sync_rounds'] == 0


@pytest.mark.parametrize('name', ['ma', 'ea'])
def test_abandoning_drops_the_round_in_flight(monkeypatch, name):
  """A failing run abandons the round still running: neither its params nor its sync state are kept.

  Keeping the sync state of a round whose params were dropped (the EA center pulled toward replicas that were not
  pulled back) would make the checkpointed pair (train state, sync state) disagree.
  """
  loop = Loop(_driver(name, 4), 4)
  with _holding_rounds(loop.driver, monkeypatch) as held:
    thread = _start(loop)
    initial_sync_state = jax.tree.map(np.asarray, loop.driver.sync_state())
    loop.advance_until(held.entered.is_set, 'the first snapshot')
  final = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state, abandon=True))
  assert not thread.is_alive() and len(held.rounds) == 1
  _assert_tree_close(final.params, loop.unsynced(loop.step), 'params after finish')
  _assert_tree_close(loop.driver.sync_state(), initial_sync_state, 'sync state after finish')


def test_shadow_ea_conserves_replicas_plus_center(monkeypatch):
  """An EA round moves `sum_i d_i` from the replicas to the center: `sum_i w_i + c` changes only by local steps.

  Holds at every step boundary and after `finish`, with a round in flight when training ended. (A round served after
  the last step while a peer trains on moves the center and not these replicas: one process here, its rounds after
  the fourth are agreed once it is done, and move nothing.)
  """
  loop = Loop(_driver('ea', 4), 4)
  done, agreements = loop.driver._rounds._done, []  # pylint: disable=protected-access

  def agree(_, interval_s, stopped):
    agreements.append(interval_s)
    if len(agreements) > 4:
      done.wait()
    return done.is_set(), interval_s

  monkeypatch.setattr(loop.driver._rounds, '_agree', agree)
  _start(loop)
  center_0 = jax.tree.map(lambda x: x.mean(axis=0), loop.initial)

  def assert_conserved(what):
    state, sync_state = loop.driver.settled(loop.state)  # A round in flight has landed its pull, not its center.
    got = jax.tree.map(lambda w, c: np.asarray(w).sum(axis=0) + np.asarray(c)[0], state.params, sync_state.center)
    want = jax.tree.map(lambda w, c: w.sum(axis=0) + c, loop.unsynced(loop.step), center_0)
    _assert_tree_close(got, want, what)

  for rounds in (1, 2, 3):
    loop.wait_for_rounds(rounds)
    assert_conserved(f'after round {rounds}')
  loop.state = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert_conserved('after finish')


def test_shadow_sync_with_the_real_donating_train_step():
  """The real step in blocks that donate their state and the rounds' carry: no round reads a deleted array."""
  num_replicas, batch_size, cardinalities, num_steps = 8, 8, [10] * batch_lib.NUM_SPARSE_FEATURES, 300
  mesh = replicas.make_mesh(num_replicas)
  model = model_lib.DLRM(bottom_mlp=(8, 4), top_mlp=(8, 1))
  mlp_optimizer, embedding_optimizer = optax.adagrad(0.1), embedding.rowwise_adagrad(0.1)
  state = replicas.replicate(
    step_lib.init_train_state(jax.random.key(0), model, cardinalities, 4, mlp_optimizer, embedding_optimizer), mesh
  )
  driver = _driver('ma', num_replicas)
  train_block = replicas.make_replicated_block(
    step_lib.make_train_step(model, cardinalities, mlp_optimizer, embedding_optimizer), mesh, driver.between_steps()
  )
  rng = np.random.default_rng(0)
  batches = [
    replicas.shard(
      batch_lib.Batch(
        dense=rng.standard_normal((num_replicas, 1, batch_size, batch_lib.NUM_DENSE_FEATURES)).astype(np.float32),
        sparse=rng.integers(0, 10, (num_replicas, 1, batch_size, batch_lib.NUM_SPARSE_FEATURES)).astype(np.int32),
        label=rng.integers(0, 2, (num_replicas, 1, batch_size)).astype(np.float32),
      ),
      mesh,
    )
    for _ in range(4)
  ]
  one = replicas.shard(np.ones(num_replicas, np.int32), mesh)
  driver.start(state, driver.initial_sync_state(state))

  def train():
    state_R, pending_loss, losses = state, None, []
    for step in range(1, num_steps + 1):
      driver.before_block(hooks.Boundary(step - 1, state_R, driver, steps=1))
      carry = driver.block_carry(step - 1, 1)
      state_R, metrics, carry = train_block(state_R, batches[step % len(batches)], one, carry)
      driver.after_block(carry)
      driver.at_boundary(hooks.Boundary(step, state_R, driver, steps=1))
      if pending_loss is not None:  # As train.py: reading step N-1's loss keeps the dispatch queue one step deep.
        losses.append(float(np.mean(pending_loss)))
      pending_loss = metrics['loss']
    return state_R, losses

  state, losses = _within(TIMEOUT_S, train)
  state = _within(TIMEOUT_S, lambda: driver.finish(state))
  jax.block_until_ready(state)
  assert driver.stats()['sync_rounds'] > 0
  assert all(np.isfinite(losses))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))
  assert int(np.asarray(state.step)[0]) == num_steps


def test_eight_replicas_hundreds_of_steps_no_hang_no_leak():
  """800 steps of 8 replicas, rounds as fast as they go: ends, leaves no thread behind, and no array per round.

  The arrays alive at one boundary depend on where the round in flight is (its contributions with the thread, the
  job's mean queued, a fresh exchange: a copy of the synced params each), which the thread's timing decides (one
  boundary saw 134 arrays at step 1000 and another 166 at 3000, 1579 rounds later: no leak, a round caught at two
  phases); so the count at each checkpoint is the most seen over the boundaries just before it, a round's fullest
  phase among them, which only a leak raises."""
  slack = 24  # Arrays the fullest phase of a round may differ by between two windows, with margin.
  samples = 40  # Boundaries counted before each checkpoint.
  threads_before = threading.active_count()
  loop = Loop(_driver('ma', 8), 8)

  def run():
    loop.driver.start(loop.state, loop.driver.initial_sync_state(loop.state))
    counts = {}
    for checkpoint in (200, 800):  # Alone, ~340 rounds between the two (1116 between 1000 and 3000).
      while loop.step < checkpoint - samples:
        loop.advance()
      most = 0
      while loop.step < checkpoint:
        loop.advance()
        gc.collect()
        most = max(most, len(jax.live_arrays()))
      counts[checkpoint] = (most, loop.driver.stats()['sync_rounds'])
    loop.state = loop.driver.finish(loop.state)
    return counts

  # The objects alive before this test (the whole session's, in a worker of the suite) are left out of the
  # collections, which then scan only what the loop makes: each took ~0.2 s late in a suite, 20x the test alone.
  gc.freeze()
  try:
    counts = _within(120.0, run)
  finally:
    gc.unfreeze()
  (arrays_early, rounds_early), (arrays_late, rounds_late) = counts[200], counts[800]
  assert rounds_late - rounds_early > 2 * slack, f'too few rounds to see a leak of one array per round: {counts}'
  assert arrays_late <= arrays_early + slack, f'live arrays grow with rounds: {counts}'
  assert threading.active_count() == threads_before
  assert loop.driver.stats()['max_sync_gap'] >= 1
  _assert_tree_close(
    loop.driver.consensus(loop.state.params),
    jax.tree.map(lambda x: x.mean(axis=0), loop.unsynced(loop.step)),
    'consensus = replica mean',
  )


def test_min_interval_bounds_the_round_rate():
  """Round starts are at least `min_interval_s` apart, so over T seconds at most floor(T / interval) + 1 rounds."""
  interval_s = 0.2
  loop = Loop(_driver('ma', 4, min_interval_s=interval_s), 4)
  started = time.monotonic()
  _start(loop)
  loop.wait_for_rounds(2)
  loop.advance_until(lambda: time.monotonic() - started >= 1.0, 'one second')
  elapsed_s = time.monotonic() - started
  rounds = loop.driver.stats()['sync_rounds']
  _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert 2 <= rounds <= math.floor(elapsed_s / interval_s) + 1, (rounds, elapsed_s)


def test_the_thread_issues_no_collective():
  """docs/design.md §3: one thread a process issues the job's collectives. The shadow thread issues none (its rounds
  meet on the host), so the training thread keeps them: the consensus, a job-wide program, runs mid-run."""
  loop = Loop(_driver('ma', 4), 4)
  _start(loop)
  loop.wait_for_rounds(2)
  state, sync_state = loop.driver.settled(loop.state)
  consensus = replicas.fetch(loop.driver.consensus(state.params))
  _assert_tree_close(consensus, jax.tree.map(lambda w: np.asarray(w).mean(axis=0), state.params), 'consensus')
  assert sync_state == loop.driver.sync_state()
  loop.state = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))


def test_the_pace_is_the_timed_cost_of_a_round_over_the_budget():
  """`start` times a round's two programs (on copies of the params): under 'auto' rounds start no closer than that
  cost over `max_overhead`; a fixed interval is kept, and the cost still reported."""
  loop = Loop(_driver('ma', 4, min_interval_s='auto'), 4)
  _start(loop)
  stats = loop.driver.stats()
  assert 0 < stats['sync_round_cost_s'] < 1.0
  assert stats['sync_interval_s'] == pytest.approx(stats['sync_round_cost_s'] / 0.05)
  _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  fixed = Loop(_driver('ma', 4, min_interval_s=1000.0), 4)
  _start(fixed)
  assert fixed.driver.stats()['sync_interval_s'] == 1000.0 and fixed.driver.stats()['sync_round_cost_s'] > 0
  _within(TIMEOUT_S, lambda: fixed.driver.finish(fixed.state))


def test_the_pace_counts_the_training_threads_work_at_a_rounds_boundaries(monkeypatch):
  """A round's host cost holds what the training thread spends on it (its blocks' carries: at a hand-over a fresh
  exchange, here made to burn 50 ms of CPU), besides the thread's own work: a pace that left it out would spend
  more than its budget."""
  loop = Loop(_driver('ma', 4, min_interval_s=0.0), 4)
  _start(loop)
  zeros = loop.driver._zeros_L  # pylint: disable=protected-access

  def dear_zeros():
    started = time.thread_time()
    while time.thread_time() - started < 0.05:
      continue
    return zeros()

  monkeypatch.setattr(loop.driver, '_zeros_L', dear_zeros)
  loop.wait_for_rounds(3)
  loop.run(1)
  host_s = loop.driver.stats()['sync_round_host_s']
  _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert 0.05 <= host_s < 1.0, host_s


def test_finish_does_not_wait_out_the_pace():
  loop = Loop(_driver('ma', 4, min_interval_s=1000.0), 4)
  thread = _start(loop)
  loop.wait_for_rounds(1)
  started = time.monotonic()
  final = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert not thread.is_alive() and time.monotonic() - started < 10.0
  assert loop.driver.stats()['sync_rounds'] == 1  # The round served after the last step lands nowhere here.
  del final


def test_auto_paces_the_rounds_and_reports_the_pace():
  """'auto' (the default): the first round starts at once, later ones wait for the paced interval; the stats say
  what it settled on and what it came from."""
  loop = Loop(_driver('ma', 4, min_interval_s='auto'), 4)
  _start(loop)
  loop.wait_for_rounds(4)
  loop.advance_until(lambda: loop.driver.stats()['step_time_s'] is not None, 'steps timed between rounds')
  stats = loop.driver.stats()
  _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert stats['sync_interval_s'] > 0 and stats['step_time_s'] > 0, stats
  assert stats['sync_round_cost_s'] is not None and stats['sync_overhead_estimate'] is not None, stats


def test_the_first_round_waits_first_round_after_s_and_finish_does_not():
  """`start(..., first_round_after_s)` (the overhead benchmark's random phase): no snapshot is asked for before it;
  `finish` still ends at once (the round it serves lands nowhere: the model is the one trained)."""
  loop = Loop(_driver('ma', 4), 4)
  with pytest.raises(ValueError, match='first_round_after_s'):
    loop.driver.start(loop.state, loop.driver.initial_sync_state(loop.state), first_round_after_s=-1.0)
  thread = _start(loop, first_round_after_s=1000.0)
  loop.run(20)
  assert not loop.driver._rounds.snapshot_wanted.is_set() and loop.driver.stats()['sync_rounds'] == 0  # pylint: disable=protected-access
  started = time.monotonic()
  final = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert not thread.is_alive() and time.monotonic() - started < 10.0
  assert loop.driver.stats()['sync_rounds'] == 0
  _assert_tree_close(final.params, loop.unsynced(loop.step), 'end')


def test_no_snapshot_is_handed_over_before_first_round_after_steps_from_each_start():
  """Under 'auto' (`drivers.make`: `block_plan.steps_until_chosen`) the first snapshot waits for the probe's
  timed blocks, whose K a round's work would skew; counted from each start (a restarted run probes again). The
  thread asks for it once the loop has passed that step, and the loop's boundaries before it are not cut for rounds
  (`next_due`: the probe's blocks keep their sizes)."""
  loop = Loop(_driver('ma', 4, first_round_after=28), 4)
  for start in range(2):
    _start(loop)
    assert loop.driver.next_due(loop.step) >= loop.step + 28
    loop.run(27)
    time.sleep(0.2)  # Time enough for the thread to ask for a snapshot, were it to ask early.
    assert not loop.driver._rounds.snapshot_wanted.is_set(), f'a snapshot asked for before step 28 of start {start}'  # pylint: disable=protected-access
    assert not loop.driver._in_flight, f'a snapshot before step 28 of start {start}'  # pylint: disable=protected-access
    loop.run(1)
    _within(TIMEOUT_S, lambda: _wait_for(loop.driver._rounds.snapshot_wanted.is_set))  # pylint: disable=protected-access
    loop.run(1)
    assert loop.driver._in_flight, f'no snapshot at the boundary after step 28 of start {start}'  # pylint: disable=protected-access
    loop.state = _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))


def _wait_for(condition: Callable[[], bool]) -> None:
  while not condition():
    time.sleep(0.001)


def _steps_timed(driver) -> int:
  return driver._pacer._steps_seen  # pylint: disable=protected-access


def test_a_step_after_long_loop_work_is_left_out_of_the_pace(monkeypatch):
  """The loop's own work (a save, a metric write) longer than a mean step takes the next step out of the pace;
  bookkeeping does not, nor does anything before a step time is known (or none would ever be)."""
  loop = Loop(_driver('ma', 4, min_interval_s=1000.0), 4)  # One round, then only steps between rounds.
  with _holding_rounds(loop.driver, monkeypatch):  # No merge resets the counts meanwhile.
    _start(loop)
    loop.run(2)
    assert loop.driver._pacer.step_time_s() is None  # pylint: disable=protected-access
    timed = _steps_timed(loop.driver)
    loop.work(1000.0)
    loop.run(1)
    assert _steps_timed(loop.driver) == timed + 1
  loop.wait_for_rounds(1)
  loop.run(10)
  assert loop.driver._pacer.step_time_s() is not None  # pylint: disable=protected-access
  timed = _steps_timed(loop.driver)
  loop.work(0.0)
  loop.run(1)
  assert _steps_timed(loop.driver) == timed + 1
  loop.work(1000.0)
  loop.run(1)
  assert _steps_timed(loop.driver) == timed + 1  # Left out.
  loop.run(1)
  assert _steps_timed(loop.driver) == timed + 2
  _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))


class LatePeer:
  """Stands in for the driver's thread's `_agree` (across processes, through the coordination service): at its
  second call a peer is late, and the call waits until the test sets `arrive`."""

  def __init__(self):
    self.calls = 0
    self.waiting, self.arrive = threading.Event(), threading.Event()

  def __call__(self, done: bool, interval_s: float, stopped=None) -> tuple[bool, float]:
    self.calls += 1
    if self.calls == 2:
      self.waiting.set()
      if not self.arrive.wait(TIMEOUT_S):
        raise TimeoutError('the test never let the peer arrive')
    return done, interval_s


def test_a_process_waiting_for_a_late_peer_hands_nothing_over(monkeypatch):
  """Across processes a round begins with the processes agreeing. A process that waits there for a late peer has
  asked for no snapshot: its steps go on, and nothing of a round is on its devices, until the peer has arrived."""
  loop = Loop(_driver('ma', 4, min_interval_s=0.0), 4)
  late = LatePeer()
  monkeypatch.setattr(loop.driver._rounds, '_agree', late)
  try:
    _start(loop)
    loop.wait_for_rounds(1)
    loop.advance_until(late.waiting.is_set, 'the second round waiting for the late peer')
    loop.run(10)
    assert not loop.driver._rounds.snapshot_wanted.is_set()  # pylint: disable=protected-access
    assert loop.driver._handed_over is None  # pylint: disable=protected-access
  finally:
    late.arrive.set()
  loop.wait_for_rounds(2)
  _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))


def test_a_boundary_is_asked_for_only_at_the_first_step_that_may_hand_over():
  """No block is cut for a round (a round waits at most a block to be handed over, and one to land), but the first
  hand-over comes after 'auto''s probe, whose blocks it would stretch."""
  driver = _driver('ma', 2, min_interval_s='auto', first_round_after=30)
  assert driver.next_due(10) == 30
  assert driver.next_due(30) is None and driver.next_due(100) is None


@pytest.mark.parametrize('step_s, lands_a_block_after', [(10.0, True), (1e-6, False)])
def test_a_blocks_carry_waits_up_to_half_a_block_for_the_round_handed_over_two_blocks_before(
  monkeypatch, step_s, lands_a_block_after
):
  """A round handed over in a block reaches the thread once that block is done, which the loop sees just before it
  builds the carry of the block after next: that carry waits for the round up to half a block (the block between
  trains meanwhile), so the round lands a block after its snapshot (a lag of 1 step, blocks of 1 here) when the
  thread's meeting (made 50 ms long) takes less than that; when it takes longer the carry goes without it, and the
  round lands later."""
  loop = Loop(_driver('ma', 4, min_interval_s=0.0), 4)
  meet = loop.driver._rounds._meet  # pylint: disable=protected-access

  def slow_meet(vector, stopped):
    time.sleep(0.05)
    return meet(vector, stopped)

  monkeypatch.setattr(loop.driver._rounds, '_meet', slow_meet)
  _start(loop)
  monkeypatch.setattr(loop.driver._pacer, 'step_time_s', lambda: step_s)  # pylint: disable=protected-access
  loop.wait_for_rounds(3)
  lags = loop.driver._merge_lags  # pylint: disable=protected-access
  _within(TIMEOUT_S, lambda: loop.driver.finish(loop.state))
  assert (lags == [1] * len(lags)) == lands_a_block_after, lags
