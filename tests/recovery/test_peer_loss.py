"""What a survivor keeps when it cannot save its last step: its newest host copy, once its checkpoint being written
is on disk (a writer stuck behind the dead peer is left behind); and where it had trained its whole stream and
waits for its peers, the state of its last step."""

import threading
import time
import types

import jax.numpy as jnp
import pytest

from shadowsync_jax.recovery import peer_loss


class _Live:
  def __init__(self, newest, fails=False):
    self.newest, self.fails, self.saved = newest, fails, []

  def save_latest(self):
    return self.newest

  def save(self, step, tree):
    if self.fails:
      raise RuntimeError('Array has been deleted.')  # Donated to a round at the end.
    self.saved.append((step, tree))
    return step


def _loss(live, finish_writing):
  return peer_loss.PeerLoss(types.SimpleNamespace(index=1), live, lambda: True, dict, finish_writing)


def test_a_survivor_writes_its_newest_copy_after_the_checkpoint_being_written():
  written = threading.Event()

  def finish_writing():
    time.sleep(0.2)  # The differential being written.
    written.set()

  assert _loss(_Live(40), finish_writing)._newest_copy() == 40  # pylint: disable=protected-access
  assert written.is_set()
  assert _loss(_Live(None), lambda: None)._newest_copy() is None  # pylint: disable=protected-access  (no copy)


def test_a_writer_that_never_finishes_holds_the_exit_at_most_write_wait_s(monkeypatch):
  monkeypatch.setattr(peer_loss, 'WRITE_WAIT_S', 0.1)
  never = threading.Event()
  started = time.monotonic()
  assert _loss(_Live(7), never.wait)._newest_copy() == 7  # pylint: disable=protected-access
  assert time.monotonic() - started < 5


@pytest.mark.parametrize('donated', [False, True])
def test_a_survivor_waiting_at_its_streams_end_saves_the_state_of_its_last_step(monkeypatch, donated):
  """Its training thread never reaches another boundary, and the checkpoints' interval may hold no host copy (CI:
  such a survivor exited with none and went back to its checkpoint); once the final save is under way, the newest
  copy again."""
  exits = []
  monkeypatch.setattr(peer_loss.PeerLoss, '_write_down_and_exit', lambda self, *args, **kw: exits.append(args))
  live = _Live(None, fails=donated)
  loss = _loss(live, lambda: None)
  state, sync_state = {'w': jnp.ones(3)}, {'center': jnp.zeros(3)}
  loss.trained(128, lambda: (state, sync_state))
  loss.stop_stuck('told to stop (SIGTERM)')
  ((step, reason, saved),) = [args[:3] for args in exits]
  assert reason.endswith('the training thread was stuck')
  if donated:  # Its arrays went to the rounds: the newest host copy (none here).
    assert saved is None and live.saved == []
  else:
    assert saved == 128 and [s for s, _ in live.saved] == [128]
    assert live.saved[0][1] == {'train': state, 'sync': sync_state}
  loss.forget()
  live.newest = 96
  loss.stop_stuck('told to stop (SIGTERM)')
  assert exits[-1][2] == 96
