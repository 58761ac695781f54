"""A study's training job, run as a user runs it and measured from outside: its summary, wall time and peak memory.

  job = jobs.run(['-m', 'experiments.train', '--workdir=W', ...], workdir)
  job = jobs.launch(workdir, ['--num_processes=2', '--pin_cpus'], ['--config.sync.algorithm=shadow_ma'])
  job.summary['eval_ne'], job.wall_s, job.peak_rss_bytes, job.error    # error: the job's `error:` line, or None

Every study that starts jobs starts them here: one process with `run`, a job of processes (`experiments.launch`:
local processes or emulated hosts, kills, restarts) with `launch`.

The peak resident memory comes from `/usr/bin/time -v` (GNU time), which waits for the command: for a launcher it
is the largest of the launcher and the training processes it started (each process's own is in the summary,
`peak_rss_bytes`). A job that refuses its config (exit status 2, one `error:` line) is a result, not a failure: its
`error` says why; any other failure raises, its whole output kept in a file of the system's temporary
directory that the error names (outside the study's own directories, which a study may delete as it fails).
"""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from shadowsync_jax.parallel import exit_codes

TIME = '/usr/bin/time'
_PEAK = re.compile(r'Maximum resident set size \(kbytes\): (\d+)')


@dataclasses.dataclass
class Job:
  summary: dict[str, Any] | None  # summary.json; None if the job refused its config.
  wall_s: float
  peak_rss_bytes: int | None  # Of the largest process, from outside.
  error: str | None  # The job's `error:` line when it refused its config.


def run(args: list[str], workdir: pathlib.Path, timeout_s: float | None = None) -> Job:
  """`python ARGS` under `/usr/bin/time -v`; `workdir` is where its summary.json appears."""
  if not os.access(TIME, os.X_OK):
    raise FileNotFoundError(f'{TIME} (GNU time) measures peak memory from outside: apt-get install time')
  started = time.perf_counter()
  result = subprocess.run(
    [TIME, '-v', sys.executable, *args], capture_output=True, text=True, check=False, timeout=timeout_s
  )
  wall_s = time.perf_counter() - started
  peak = _PEAK.search(result.stderr)
  peak_bytes = int(peak.group(1)) * 1024 if peak else None
  if result.returncode == exit_codes.USAGE:  # The binary's line on stderr; a launcher's, of a process, on stdout.
    output = (result.stderr + result.stdout).splitlines()
    lines = [line for line in output if exit_codes.ERROR_PREFIX in line]
    return Job(None, wall_s, peak_bytes, lines[0].split(exit_codes.ERROR_PREFIX, 1)[1] if lines else 'usage error')
  if result.returncode != 0:  # Its whole output kept: a job that restarted 30 times printed its first error early.
    log = _failed_output_file()
    log.write_text(f'$ python {" ".join(args)}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}')
    sys.stdout.write(result.stdout[-3000:] + result.stderr[-3000:])
    raise RuntimeError(f'python {" ".join(args)} failed with exit status {result.returncode}; its output: {log}')
  summary = json.loads((workdir / 'summary.json').read_text())
  return Job(summary, wall_s, peak_bytes, None)


def _failed_output_file() -> pathlib.Path:
  handle, path = tempfile.mkstemp(prefix='shadowsync_failed_job_', suffix='.txt')
  os.close(handle)
  return pathlib.Path(path)


def launch(
  workdir: pathlib.Path, launch_flags: list[str], train_flags: list[str], timeout_s: float | None = None
) -> Job:
  """`python -m experiments.launch LAUNCH_FLAGS -- --workdir=WORKDIR TRAIN_FLAGS`: a job of processes."""
  return run(
    ['-m', 'experiments.launch', *launch_flags, '--', f'--workdir={workdir}', *train_flags], workdir, timeout_s
  )


def fresh(workdir: pathlib.Path) -> pathlib.Path:
  """`workdir`, emptied."""
  shutil.rmtree(workdir, ignore_errors=True)
  workdir.mkdir(parents=True)
  return workdir
