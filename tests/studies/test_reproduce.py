"""`reproduce` finds each study's command in its result files, reruns the stale ones (or those named), and says how
long they take; on a scratch git repository, with the commands run by a stand-in."""

import os
import pathlib
import subprocess
import sys
import types

import pytest

from shadowsync_jax.studies import provenance
from shadowsync_jax.studies import reproduce

_GIT_ENV = {'GIT_AUTHOR_NAME': 't', 'GIT_AUTHOR_EMAIL': 't@t', 'GIT_COMMITTER_NAME': 't', 'GIT_COMMITTER_EMAIL': 't@t'}


def _git(repo: pathlib.Path, *args: str) -> None:
  subprocess.run(['git', *args], cwd=repo, env={**os.environ, **_GIT_ENV}, capture_output=True, check=True)


def _result(repo: pathlib.Path, name: str, command: str, measures: str, elapsed_s: float | None) -> None:
  modules = {'lib': types.SimpleNamespace(__file__=str(repo / 'lib' / measures))}
  record = provenance.collect(command, repo=repo, modules=modules)
  if elapsed_s is None:
    del record['elapsed_s']  # Written before times were recorded.
  else:
    record['elapsed_s'] = elapsed_s
  (repo / 'results' / name).write_text(f'# {name}\n\n`{command}`\n\n{provenance.comment(record)}\n')


@pytest.fixture(name='repo')
def _repo(tmp_path):
  repo = tmp_path / 'repo'
  (repo / 'lib').mkdir(parents=True)
  (repo / 'results').mkdir()
  for name in ('a.py', 'b.py'):
    (repo / 'lib' / name).write_text('X = 1\n')
  (repo / 'README.md').write_text('Studies: <!-- reproduce: time -->old<!-- /reproduce -->.\n')
  _git(repo, 'init', '-q')
  _git(repo, 'add', '-A')
  _git(repo, 'commit', '-q', '-m', 'code')
  _result(repo, 'alpha.md', 'python -m benchmarks.alpha', 'a.py', 1800.0)
  _result(repo, 'alpha.csv', 'python -m benchmarks.alpha', 'a.py', 1805.0)  # One command, two files.
  _result(repo, 'beta.md', "python -m benchmarks.beta --flag='x y'", 'b.py', None)
  (repo / 'results' / 'unrecorded.md').write_text('# Old\n\n`python -m benchmarks.old`\n')
  _git(repo, 'add', '-A')
  _git(repo, 'commit', '-q', '-m', 'results')
  return repo


def test_each_command_is_one_study_with_its_files_and_its_time_and_only_changed_code_makes_it_stale(repo):
  found = reproduce.studies('results', repo)
  assert [(s.name, s.paths, s.stale, s.elapsed_s) for s in found] == [
    ('alpha', ('results/alpha.csv', 'results/alpha.md'), False, 1805.0),
    ('beta', ('results/beta.md',), False, None),
  ]
  assert reproduce.selected(found) == []
  (repo / 'lib' / 'b.py').write_text('X = 2\n')
  found = reproduce.studies('results', repo)
  assert [s.name for s in reproduce.selected(found)] == ['beta']
  assert [s.name for s in reproduce.selected(found, every=True)] == ['alpha', 'beta']
  assert [s.name for s in reproduce.selected(found, only=['alpha'])] == ['alpha']
  with pytest.raises(ValueError, match='no study named gamma; there are: alpha, beta'):
    reproduce.selected(found, only=['gamma'])


def test_a_rerun_runs_each_recorded_command_with_this_python_and_goes_on_past_a_failure(repo):
  (repo / 'lib' / 'a.py').write_text('X = 2\n')
  (repo / 'lib' / 'b.py').write_text('X = 2\n')
  ran, said = [], []

  def runner(args, cwd):
    ran.append((args, cwd))
    return 3 if 'benchmarks.alpha' in args else 0

  failed = reproduce.run(reproduce.selected(reproduce.studies('results', repo)), repo, runner, said.append)
  assert ran == [
    ([sys.executable, '-m', 'benchmarks.alpha'], repo),
    ([sys.executable, '-m', 'benchmarks.beta', '--flag=x y'], repo),
  ]
  assert [s.name for s in failed] == ['alpha'] and 'failed with exit status 3' in said[1]
  assert 'last time: 30 min' in said[0] and 'last time: not recorded' in said[2]


def test_the_readme_says_how_long_the_studies_take_from_what_their_files_recorded(repo):
  assert reproduce.refresh_readme(repo, 'results')
  assert reproduce.readme_block(repo) == (
    '2 studies; 1 timed when they last ran, 0.5 h together, 1 not timed yet (written before times were recorded)'
  )
  assert not reproduce.refresh_readme(repo, 'results')  # Current.
  (repo / 'lib' / 'a.py').write_text('X = 2\n')
  assert not reproduce.refresh_readme(repo, 'results')  # Stale code changes no time.
  listing = reproduce.listing(reproduce.studies('results', repo))
  assert 'alpha' in listing and 'STALE' in listing and '1 stale: 0.5 h of what was timed.' in listing


def test_a_command_that_is_no_python_command_is_refused():
  with pytest.raises(ValueError, match='not a python command'):
    reproduce.argv('bash -c true')
