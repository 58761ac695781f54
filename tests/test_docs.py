"""The README and docs stay true: the quick start is short and gives the two commands, every relative link
resolves, and every table embedded from a study's result file is the one the study wrote."""

import pathlib
import re

from shadowsync_jax.studies import report

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [REPO_ROOT / 'README.md', REPO_ROOT / 'BUILD.md', *sorted((REPO_ROOT / 'docs').rglob('*.md'))]
_LINK = re.compile(r'\]\(([^)\s]+)\)')


def test_the_readme_is_a_quick_start_that_opens_with_the_two_commands():
  readme = (REPO_ROOT / 'README.md').read_text()
  assert len(readme.splitlines()) <= 150, 'the README is the first ten minutes; details go to docs/'
  first_block = readme.split('```', 2)[1].strip().splitlines()
  assert len(first_block) == 2, first_block
  install_and_train, test = first_block
  assert 'pip install -r requirements.txt' in install_and_train and '-m experiments.train' in install_and_train
  assert test == '.venv/bin/python -m pytest -q'
  assert test in (REPO_ROOT / '.ci' / 'run').read_text(), "CI runs the README's test command"


def test_every_relative_link_resolves():
  broken = []
  for page in PAGES:
    for target in _LINK.findall(page.read_text()):
      if re.match(r'[a-z]+://', target) or target.startswith('#'):
        continue
      path = (page.parent / target.split('#', 1)[0]).resolve()
      if not path.exists():
        broken.append(f'{page.relative_to(REPO_ROOT)} -> {target}')
  assert not broken, broken


def test_every_embedded_result_table_is_the_one_its_study_wrote():
  blocks = [(page, path, body) for page in PAGES for path, body in report.embedded_blocks(page.read_text())]
  assert blocks, 'the study pages embed their result files'
  for page, path, body in blocks:
    result = REPO_ROOT / path
    assert result.exists(), f'{page.relative_to(REPO_ROOT)} embeds {path}, which no study has written'
    assert body == report.shown_in_docs(result.read_text()), (
      f'{page.relative_to(REPO_ROOT)}: the block of {path} differs from the file; rerun the study, or refresh the '
      "docs from the files: python -c 'from shadowsync_jax.studies import report; report.refresh_docs()'"
    )
