"""What a survivor keeps when it cannot save its last step: its newest host copy, once its checkpoint being written
is on disk (a writer stuck behind the dead peer is left behind)."""

import threading
import time

from shadowsync_jax.recovery import peer_loss


class _Live:
  def __init__(self, newest):
    self.newest = newest

  def save_latest(self):
    return self.newest


def _loss(live, finish_writing):
  return peer_loss.PeerLoss(None, live, lambda: True, dict, finish_writing)


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
