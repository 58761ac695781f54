"""CPU time by thread, read from outside a process: names handed to the OS, groups, and samples that outlive a
thread."""

import os
import threading
import time

import pytest

from shadowsync_jax.parallel import cpu_time

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self/task'), reason='reads /proc (Linux)')


@pytest.mark.parametrize(
  'name, group',
  [
    ('block-reader_0', 'block-reader'),
    ('Thread-12 (run)', 'Thread'),
    ('llvm-worker-3', 'llvm-worker'),
    ('tf_XLAEigen', 'tf_XLAEigen'),
    ('differential-writer_0', 'differential-writer'),
  ],
)
def test_a_group_is_the_name_without_its_number(name, group):
  assert cpu_time.group(name) == group
  assert cpu_time.os_name(name) == group[:15]


def test_a_named_thread_counts_under_its_name_and_still_counts_once_it_ended():
  sampler, pid = cpu_time.Sampler(), os.getpid()
  go, spun, end = threading.Event(), threading.Event(), threading.Event()

  def spin():
    go.wait()
    until = time.thread_time() + 0.3
    while time.thread_time() < until:
      pass
    spun.set()
    end.wait()

  thread = threading.Thread(target=spin, name='spinner_7')
  thread.start()
  cpu_time.name_os_threads()
  sampler.sample([pid])
  mark = sampler.mark(pid)  # Before it spins.
  go.set()
  spun.wait()
  sampler.sample([pid])
  end.set()
  thread.join()
  sampler.sample([pid])  # It ended: its last reading stands.
  spent = sampler.totals(pid, since=mark)
  assert 0.25 <= spent['spinner'] <= 0.5  # Its 0.3 s (clock ticks of 10 ms), under its name, once.
  assert cpu_time.MAIN in cpu_time.of_threads(pid)
  assert cpu_time.of_process(pid) >= spent['spinner']
