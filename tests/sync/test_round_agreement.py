"""The agreement at the start of every shadow round, across 2 real processes (jax.distributed, gloo, 127.0.0.1).

Each process offers whether its stream is done and its own pace; both must leave with the same answer: done only
when every process is, and the longest pace (so that they come to the next round together).
"""

import os
import pathlib
import subprocess
import sys

from shadowsync_jax.parallel import launcher

REPO = pathlib.Path(__file__).resolve().parents[2]

_PROCESS = """
import sys
import jax
jax.config.update('jax_num_cpu_devices', 2)
from shadowsync_jax.parallel import distributed, replicas
from shadowsync_jax.sync import shadow
port, process = int(sys.argv[1]), int(sys.argv[2])
distributed.initialize(f'127.0.0.1:{port}', num_processes=2, process_id=process, peer_timeout_s=20)
agree = shadow._round_agreement(replicas.make_meshes(2))  # One replica per process.
offers = [((False, 0.2), (True, 0.7)), ((True, 0.1), (True, 0.3))]
for offer in offers:
  print('agreed', *agree(*offer[process]), flush=True)
"""


def test_the_processes_agree_on_done_and_on_the_longest_pace():
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
    assert [(done, round(float(pace), 4)) for done, pace in agreed] == [('False', 0.7), ('True', 0.3)], output
