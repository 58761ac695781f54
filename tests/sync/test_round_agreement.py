"""The agreement at the start of every shadow round, across 2 real processes (jax.distributed, gloo, 127.0.0.1).

Each process offers whether its stream is done and its own pace; both must leave with the same answer: done only
when every process is, and the longest pace (so that they come to the next round together). The agreement goes
over direct connections between the processes (`parallel.peer_links`), no collective: a process that waits there
for a late peer keeps its devices (as a collective it held them, and the training steps queued behind it waited as
long), and a stopped thread leaves it.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from shadowsync_jax.parallel import launcher

REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group('jobs')  # Jobs of real processes run one at a time (pytest.ini).

_PROCESS = """
import sys, threading, time
import jax
jax.config.update('jax_num_cpu_devices', 4)
import jax.numpy as jnp
from shadowsync_jax.parallel import distributed, replicas
from shadowsync_jax.sync import host_meeting
port, process = int(sys.argv[1]), int(sys.argv[2])
distributed.initialize(f'127.0.0.1:{port}', num_processes=2, process_id=process, peer_timeout_s=20)
meshes = replicas.make_meshes(8)  # 4 replicas a process, as the loop benchmark's job.
agree = host_meeting.round_agreement(meshes)
offers = [((False, 0.2), (True, 0.7)), ((True, 0.1), (True, 0.3)), ((False, 0.5), (False, 0.5))]
work = jax.jit(lambda x: jnp.einsum('rij,rjk->rik', x, x).sum(axis=(1, 2)))  # A step on this process's devices.
x = jax.device_put(jnp.ones((4, 256, 256)), replicas.replica_sharding(meshes.local))
work(x).block_until_ready()
for call, offer in enumerate(offers):
  if call == 2 and process == 1:
    time.sleep(3.0)  # Late: process 0 waits in the agreement meanwhile, and its device must stay free.
  result = []
  agreeing = threading.Thread(target=lambda: result.append(agree(*offer[process])))
  agreeing.start()
  time.sleep(0.5)  # The agreement is under way (waiting for process 1 at the third).
  started = time.monotonic()
  work(x).block_until_ready()
  print('device', round(time.monotonic() - started, 3), flush=True)
  agreeing.join()
  print('agreed', *result[0], flush=True)
stop = threading.Event()
threading.Timer(0.5, stop.set).start()
print('stopped', agree(False, 0.5, stop.is_set) if process == 0 else None, flush=True)  # Process 1 never comes.
"""


def test_the_processes_agree_on_done_and_on_the_longest_pace_and_a_wait_holds_no_device():
  port = launcher.free_port()
  env = {**os.environ, 'PYTHONPATH': str(REPO)}
  processes = [
    subprocess.Popen(
      [sys.executable, '-c', _PROCESS, str(port), str(i)],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = [p.communicate(timeout=120)[0] for p in processes]
  assert all(p.returncode == 0 for p in processes), outputs
  for output in outputs:
    agreed = [line.split()[1:] for line in output.splitlines() if line.startswith('agreed')]
    assert [(done, round(float(pace), 4)) for done, pace in agreed] == [
      ('False', 0.7),
      ('True', 0.3),
      ('False', 0.5),
    ], output
  # Process 0 waited ~3 s for its late peer at the third agreement; its devices ran its program meanwhile (the
  # collective this agreement was held them: 2.5 s).
  device_s = [float(line.split()[1]) for line in outputs[0].splitlines() if line.startswith('device')]
  assert len(device_s) == 3 and device_s[2] < 1.5, outputs[0]
  assert 'stopped None' in outputs[0], outputs[0]
