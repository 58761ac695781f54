"""A study's job runner: a failed job's whole output is kept, named in the error."""

import pathlib
import re

import pytest

from shadowsync_jax.studies import jobs


def test_a_failed_job_keeps_all_it_printed_in_the_file_its_error_names(tmp_path):
  script = "import sys\nprint('first error, early')\nprint('x' * 10000)\nsys.exit(1)"
  with pytest.raises(RuntimeError, match='exit status 1') as raised:
    jobs.run(['-c', script], tmp_path)
  path = pathlib.Path(re.search(r'its output: (\S+)', str(raised.value)).group(1))
  try:
    text = path.read_text()
    assert 'first error, early' in text and 'x' * 10000 in text  # The head a 3,000-character tail cut off.
  finally:
    path.unlink()


def test_a_job_that_refuses_its_config_is_a_result_not_a_failure(tmp_path):
  script = "import sys\nsys.stderr.write('error: batch_size=0 must be positive.\\n')\nsys.exit(2)"
  job = jobs.run(['-c', script], tmp_path)
  assert job.summary is None and job.error == 'batch_size=0 must be positive.'
