"""The README and docs stay true: the quick start is short and gives the two commands, every relative link
resolves (to a heading, where it names one), every design reference names a section of docs/design.md, and every
table embedded from a study's result file is the one the study wrote."""

import pathlib
import re

from shadowsync_jax.studies import headlines
from shadowsync_jax.studies import report
from shadowsync_jax.studies import reproduce

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


def _anchors(page: pathlib.Path) -> set[str]:
  """The anchors GitHub gives a page's headings: lowercased, punctuation dropped, spaces as hyphens."""
  text = re.sub(r'```.*?```', '', page.read_text(), flags=re.S)
  headings = re.findall(r'^#{1,6} (.*)$', text, re.M)
  return {re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-') for heading in headings}


def test_every_link_to_a_heading_finds_it():
  broken = []
  for page in PAGES:
    for target in _LINK.findall(page.read_text()):
      path, _, anchor = target.partition('#')
      if re.match(r'[a-z]+://', target) or not anchor:
        continue
      destination = (page.parent / path).resolve() if path else page
      if destination.suffix == '.md' and anchor not in _anchors(destination):
        broken.append(f'{page.relative_to(REPO_ROOT)} -> {target}')
  assert not broken, broken


def test_every_design_reference_names_a_section_of_the_design_page():
  """Code and pages cite the design page by section (`docs/design.md §n`, `[design §n](design.md#...)`); the page
  is in the repository, and nothing points outside it (the workspace's `../shared`)."""
  sections = set(re.findall(r'^## (\d+)\. ', (REPO_ROOT / 'docs' / 'design.md').read_text(), re.M))
  assert sections == {str(n) for n in range(1, 14)}, sorted(sections, key=int)
  problems = []
  files = [*PAGES, *REPO_ROOT.glob('colabs/*.ipynb')]
  files += [f for d in ('shadowsync_jax', 'experiments', 'benchmarks', 'tests') for f in (REPO_ROOT / d).rglob('*.py')]
  for path in files:
    text = path.read_text()
    name = path.relative_to(REPO_ROOT)
    problems += [f'{name}: §{n}' for n in re.findall(r'design(?:\.md)? §(\d+)', text) if n not in sections]
    outside = 'DESIGN' in text or '../shared' in text
    if outside and path.name not in ('test_criteo_source.py', 'test_docs.py'):  # An optional sample; this check.
      problems.append(f'{name}: points outside the repository')
  assert not problems, problems


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


_NUMBER = re.compile(r'(?<![\w.])\d[\d,]*(?:\.\d+)?')


def _headline_figures(text: str) -> list[str]:
  """The figures of a headline: decimals, and integers above 20 (smaller ones count things: seeds, processes)."""
  return [f for f in _NUMBER.findall(text) if '.' in f or int(f.replace(',', '')) > 20]


def _numbers(result_text: str) -> list[str]:
  """The numbers of a result file: its markdown (thousands written 1,234), or a CSV's fields."""
  if '|' not in result_text and result_text.count(',') > result_text.count(' '):  # A CSV: commas part the fields.
    return [field for field in re.split(r'[,\n]', result_text) if re.fullmatch(r'-?\d+(?:\.\d+)?', field)]
  return _NUMBER.findall(result_text)


def _holds(result_text: str, figure: str) -> bool:
  """Whether some number of the result file reads `figure` when rounded as the figure shows it."""
  decimals = len(figure.split('.')[1]) if '.' in figure else 0
  wanted = figure.replace(',', '')
  for number in _numbers(result_text):
    if f'{float(number.replace(",", "")):.{decimals}f}' == wanted:
      return True
  return False


def _studies_rows() -> list[list[str]]:
  readme = (REPO_ROOT / 'README.md').read_text()
  section = readme.split('## Studies', 1)[1].split('\n## ', 1)[0]
  rows = [line.strip().strip('|').split(' | ') for line in section.splitlines() if line.startswith('| ')]
  return [[cell.strip() for cell in row] for row in rows[2:]]  # Past the header and its rule.


def test_every_readme_headline_is_written_from_its_result_file_and_shown_on_its_page():
  rows = _studies_rows()
  assert rows, 'the README lists the studies'
  for name, _, headline_cell, page_cell in rows:
    quoted = headlines.blocks(headline_cell)
    assert len(quoted) == 1, f'README, {name}: the headline is a block written from a result file, not typed'
    path, text = quoted[0]
    assert text == headlines.sentence(path), (
      f'README, {name}: the headline differs from what {path} says; refresh: python -m benchmarks.refresh_docs'
    )
    page = REPO_ROOT / re.search(r'\]\(([^)#]+)', page_cell).group(1)
    assert (path, text) in headlines.blocks(page.read_text()), f'{name}: {page.name} does not show the headline'


def test_the_readmes_time_for_all_the_studies_is_what_their_result_files_recorded():
  recorded = reproduce.total_line(reproduce.studies(reproduce.RESULTS_DIR, REPO_ROOT, stale=False))
  assert reproduce.readme_block(REPO_ROOT) == recorded, 'out of date; python -m benchmarks.refresh_docs'


def test_every_headline_figure_is_a_figure_of_its_result_file_or_a_target():
  blocks = [block for page in headlines.pages(REPO_ROOT) for block in headlines.blocks(page.read_text())]
  assert blocks
  for path, text in blocks:
    assert text == headlines.sentence(path), (
      f'{path}: a headline block is out of date; python -m benchmarks.refresh_docs'
    )
    result = (REPO_ROOT / path).read_text()
    targets = headlines.TARGETS.get(path, ())
    targets = {f'{t:g}' for t in (targets.values() if isinstance(targets, dict) else [targets] if targets else [])}
    for figure in _headline_figures(text):
      assert figure in targets or _holds(result, figure), f'{path}: {figure!r} of its headline is not in the file'


_DECIMAL = re.compile(r'(?<![\w.])\d[\d,]*\.\d+(?!\d)')
# Integers written with thousands separators: how the pages write measured counts (examples/s, rows/s, bytes).
_THOUSANDS = re.compile(r'(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\d.])')
_NOT_MEASURED = re.compile(r'<!-- not measured: (?P<figures>.*?) -->', re.S)


def _figures(text: str) -> list[str]:
  """The figures a page's text quotes: decimals, and integers with thousands separators."""
  return _DECIMAL.findall(text) + _THOUSANDS.findall(text)


def test_a_study_pages_prose_quotes_no_measurement():
  """A page's measured figures are generated: its results blocks and headlines, written from the result files
  (checked above). Its prose quotes figures (decimals, and integers with thousands separators) only where they are
  no measurement: settings, targets, data sizes and the papers' figures, listed in the page's `<!-- not measured:
  ... -->` comment with what each is. A reading that copied a measurement would go stale at the study's next run."""
  problems = []
  for page in sorted((REPO_ROOT / 'docs' / 'studies').glob('*.md')):
    text = page.read_text()
    prose = _NOT_MEASURED.sub('', text)
    for _, body in report.embedded_blocks(text) + headlines.blocks(text):
      prose = prose.replace(body, '')
    prose = re.sub(r'arXiv:\S+|\d+\.\d+\.\d+\.\d+', '', prose)  # Paper ids and addresses.
    declared = {f for m in _NOT_MEASURED.finditer(text) for f in _figures(m.group('figures'))}
    problems += [f'{page.name}: {figure}' for figure in _figures(prose) if figure not in declared]
  assert not problems, f'figures in prose that are not declared no measurement: {problems}'
