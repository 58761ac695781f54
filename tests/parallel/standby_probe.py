"""A stand-in for `experiments.train` in the launcher's tests: takes its flags, writes down when it waits as a warm
standby and when it joins (with the environment and the priority it joined with), and exits 0."""

import json
import os
import pathlib
import sys

from absl import app
from absl import flags

for name in ('coordinator_address', 'workdir'):
  flags.DEFINE_string(name, None, '')
for name in ('num_processes', 'process_id', 'cpu_devices'):
  flags.DEFINE_integer(name, 0, '')
flags.DEFINE_float('peer_timeout_s', 0.0, '')
flags.DEFINE_bool('start_coordinator', True, '')
flags.DEFINE_bool('standby', False, '')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  workdir = pathlib.Path(FLAGS.workdir)
  (workdir / f'nice_waiting_{FLAGS.process_id}').write_text(f'{os.nice(0)} {_autogroup_nice()}')
  (workdir / f'waiting_{FLAGS.process_id}').write_text(FLAGS.coordinator_address)
  if FLAGS.standby:
    line = sys.stdin.readline()
    if not line:
      return
    os.environ.update(json.loads(line)['environment'])
  joined = {
    'environment': dict(os.environ),
    'coordinator_address': FLAGS.coordinator_address,
    'nice': [os.nice(0), _autogroup_nice()],
  }
  (workdir / f'joined_{FLAGS.process_id}').write_text(json.dumps(joined))


def _autogroup_nice() -> int:
  """Its session's priority ('/autogroup-123 nice 0'; 0 without autogroups)."""
  try:
    return int(pathlib.Path('/proc/self/autogroup').read_text().split()[-1])
  except (OSError, ValueError, IndexError):
    return 0


if __name__ == '__main__':
  app.run(main)
