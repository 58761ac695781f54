"""Every result file says where it came from (`provenance`), and `staleness` finds those whose measured code has
changed since, on a scratch git repository."""

import os
import pathlib
import subprocess
import types

from shadowsync_jax.studies import bracketed  # noqa: F401  (a module of the study process, for the record)
from shadowsync_jax.studies import jobs
from shadowsync_jax.studies import provenance
from shadowsync_jax.studies import report
from shadowsync_jax.studies import result_files
from shadowsync_jax.studies import staleness
from shadowsync_jax.studies import stragglers

_GIT_ENV = {
  'GIT_AUTHOR_NAME': 't',
  'GIT_AUTHOR_EMAIL': 't@t',
  'GIT_COMMITTER_NAME': 't',
  'GIT_COMMITTER_EMAIL': 't@t',
}


def _git(repo: pathlib.Path, *args: str) -> str:
  env = {**os.environ, **_GIT_ENV}
  return subprocess.run(['git', *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout


def _commit(repo: pathlib.Path, message: str) -> None:
  _git(repo, 'add', '-A')
  _git(repo, 'commit', '-q', '-m', message)


def test_a_result_file_records_its_command_commit_machine_and_measured_code(tmp_path):
  out = report.write(
    tmp_path / 'r.md',
    'A study',
    'python -m benchmarks.x --flag',
    '| a |\n|---|',
    [{'a': 1}],
    docs_dir=tmp_path / 'no_docs',
  )
  text = out.read_text()
  record = provenance.read(text)
  head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=provenance.REPO_ROOT, capture_output=True, text=True)
  assert record['commit'] == head.stdout.strip() and record['command'] == 'python -m benchmarks.x --flag'
  assert record['cores'] == os.cpu_count() and len(record['load_at_start']) == 3 and record['date_utc']
  # The code the writing process ran, with its content then; not the modules that only write the file.
  measured = 'shadowsync_jax/studies/bracketed.py'  # Imported above: a module of the study's process.
  assert record['measures'][measured] == provenance.blob_hashes([measured])[measured]
  assert not set(provenance.WRITERS) & set(record['measures'])
  shown = report.shown_in_docs(text)
  assert provenance.line(record) in shown and '<!-- provenance' not in shown  # Docs show the sentence only.
  assert result_files.read_rows(out) == [{'a': 1}]


def test_a_study_that_runs_jobs_measures_the_library_the_jobs_run_but_not_the_studies():
  modules = {'shadowsync_jax.studies.jobs': jobs, 'shadowsync_jax.studies.stragglers': stragglers}
  files = provenance.measured_files(modules=modules)
  assert 'shadowsync_jax/train.py' in files and 'experiments/train.py' in files  # What the jobs import.
  assert 'shadowsync_jax/studies/stragglers.py' in files and 'shadowsync_jax/studies/jobs.py' in files  # Its own.
  assert 'shadowsync_jax/studies/sweep.py' not in files  # Another study: no job imports it.
  assert 'shadowsync_jax/studies/report.py' not in files


def test_a_module_that_answers_every_attribute_is_not_taken_for_measured_code():
  """torch's `torch._classes` (imported on a GPU image) names a relative '__file__' and answers any attribute."""

  class AnswersEverything(types.ModuleType):
    __file__ = '_classes.py'

    def __getattr__(self, name):
      return object()

  files = provenance.measured_files(modules={'torch._classes': AnswersEverything('torch._classes'), 'jobs': jobs})
  assert 'shadowsync_jax/studies/jobs.py' in files and '_classes.py' not in files


def test_a_result_goes_stale_when_code_it_measures_changes_and_says_which_commits(tmp_path):
  repo = tmp_path / 'repo'
  (repo / 'lib').mkdir(parents=True)
  (repo / 'lib' / 'measured.py').write_text('X = 1\n')
  (repo / 'lib' / 'other.py').write_text('Y = 1\n')
  _git(repo, 'init', '-q')
  _commit(repo, 'first')
  modules = {'lib.measured': types.SimpleNamespace(__file__=str(repo / 'lib' / 'measured.py'))}
  record = provenance.collect('python -m study', repo=repo, modules=modules)
  assert record['tree_clean'] and list(record['measures']) == ['lib/measured.py']
  (repo / 'results').mkdir()
  (repo / 'results' / 'r.md').write_text(f'# R\n\n`python -m study`\n\n{provenance.comment(record)}\n')
  (repo / 'results' / 'r.csv').write_text(f'# {provenance.comment(record)}\na,b\n1,2\n')  # A sweep's CSV.
  _commit(repo, 'the result')
  (repo / 'lib' / 'other.py').write_text('Y = 2\n')
  _commit(repo, 'an unmeasured change')
  assert not staleness.entry(repo / 'results' / 'r.md', repo).stale
  (repo / 'lib' / 'measured.py').write_text('"""Its docstring."""\n\nX = 1  # A comment.\n')
  _commit(repo, 'a docstring and a comment')
  assert not staleness.entry(repo / 'results' / 'r.md', repo).stale  # The same code.
  (repo / 'lib' / 'measured.py').write_text('X = 2\n')
  e = staleness.entry(repo / 'results' / 'r.md', repo)
  assert e.stale and e.changed_files == ('lib/measured.py',)  # Not committed yet: the commits are the file's since.
  _commit(repo, 'a measured change')
  e = staleness.entry(repo / 'results' / 'r.md', repo)
  assert e.recorded and e.changed_files == ('lib/measured.py',)
  assert staleness.entry(repo / 'results' / 'r.csv', repo) == e._replace(path='results/r.csv')
  assert [c.split(' ', 2)[2] for c in e.commits] == ['a measured change', 'a docstring and a comment'], e.commits
  assert 'STALE' in staleness.describe(e) and 'a measured change' in staleness.describe(e)


def test_a_result_without_a_record_is_read_against_the_whole_library(tmp_path):
  repo = tmp_path / 'repo'
  (repo / 'shadowsync_jax').mkdir(parents=True)
  (repo / 'shadowsync_jax' / 'a.py').write_text('A = 1\n')
  (repo / 'results').mkdir()
  (repo / 'results' / 'old.md').write_text('# Old\n\n`python -m study`\n')
  _git(repo, 'init', '-q')
  _commit(repo, 'old result')
  assert not staleness.entry(repo / 'results' / 'old.md', repo).stale
  (repo / 'shadowsync_jax' / 'a.py').write_text('A = 2\n')
  _commit(repo, 'library change')
  (e,) = staleness.check('results', repo)
  assert e.stale and not e.recorded and e.changed_files == ('shadowsync_jax/a.py',) and len(e.commits) == 1


def test_other_work_beside_a_study_is_the_cpu_of_processes_outside_its_tree(monkeypatch):
  """A study's own descendants, short-lived ones included, are not other work; a process outside its tree is, from
  the reading it was first seen at (all of its CPU when it was born since the last one)."""
  me = os.getpid()

  def snapshot(*rows):  # (pid, ppid, born at, CPU seconds)
    return lambda attrs: [
      types.SimpleNamespace(pid=pid, info={'ppid': ppid, 'create_time': born, 'cpu_times': (cpu_s, 0.0)})
      for pid, ppid, born, cpu_s in rows
    ]

  beside = provenance._Beside.__new__(provenance._Beside)  # pylint: disable=protected-access  (no thread)
  beside._seen = {}  # pylint: disable=protected-access
  mine, child, outsider = (me, 1, 0.0), (me + 1, me, 5.0), (me + 2, 1, 5.0)
  monkeypatch.setattr(provenance.psutil, 'process_iter', snapshot((*mine, 1.0), (*child, 1.0), (*outsider, 1.0)))
  assert beside._other_cpu_since(None) == 0.0  # pylint: disable=protected-access  (the first reading records)
  grandchild, newcomer = (me + 3, me + 1, 15.0), (me + 4, 1, 15.0)
  monkeypatch.setattr(
    provenance.psutil,
    'process_iter',
    snapshot((*mine, 9.0), (*child, 9.0), (*outsider, 3.0), (*grandchild, 4.0), (*newcomer, 0.5)),
  )
  assert beside._other_cpu_since(10.0) == 2.0 + 0.5  # pylint: disable=protected-access
