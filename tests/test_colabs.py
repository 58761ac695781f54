"""Every notebook in colabs/ runs top to bottom, so none of them rots; each opens in Colab and installs itself.

A notebook runs in a fresh Python process (it sets the JAX device count itself, which a process can do only
before JAX is first used), with the repository on PYTHONPATH and matplotlib's Agg backend: its code cells are
executed in order in one namespace, as a kernel would, and the first failing cell fails the test with its traceback.
No Jupyter is needed. A notebook line that only IPython understands (`%magic`, `!shell`) fails as a syntax error.
"""

import json
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO_ROOT / 'colabs').glob('*.ipynb'))
REPOSITORY_URL = tomllib.loads((REPO_ROOT / 'pyproject.toml').read_text())['project']['urls']['Repository']

_RUN_CELLS = """
import json
import sys

notebook_path = sys.argv[1]
code_cells = [cell for cell in json.load(open(notebook_path))['cells'] if cell['cell_type'] == 'code']
namespace = {'__name__': '__main__'}
for number, cell in enumerate(code_cells, 1):
  print(f'--- code cell {number}/{len(code_cells)}', flush=True)
  exec(compile(''.join(cell['source']), f'{notebook_path} (code cell {number})', 'exec'), namespace)
"""


def _cells(notebook: pathlib.Path) -> list[dict]:
  return json.loads(notebook.read_text())['cells']


def test_the_expected_notebooks_exist():
  assert {n.name for n in NOTEBOOKS} >= {'quickstart.ipynb', 'sync_strategies.ipynb'}, NOTEBOOKS


@pytest.mark.parametrize('notebook', NOTEBOOKS, ids=lambda n: n.name)
def test_notebook_opens_in_colab_and_installs_from_the_repository(notebook):
  cells = _cells(notebook)
  badge = f'https://colab.research.google.com/github/{REPOSITORY_URL.removeprefix("https://github.com/")}' \
          f'/blob/main/colabs/{notebook.name}'
  assert cells[0]['cell_type'] == 'markdown' and badge in ''.join(cells[0]['source']), \
      f'the first cell of {notebook.name} must be the Colab badge linking to {badge}'
  install = ''.join(next(c for c in cells if c['cell_type'] == 'code')['source'])
  guard = "if importlib.util.find_spec('shadowsync_jax') is None:\n"
  assert guard in install and f"'git+{REPOSITORY_URL}'" in install.split(guard, 1)[1], \
      f'the first code cell of {notebook.name} must pip-install git+{REPOSITORY_URL} only when the import fails'
  assert all(not c.get('outputs') for c in cells if c['cell_type'] == 'code'), \
      f'{notebook.name} is stored with outputs; clear them (the test executes it; outputs would go stale)'


@pytest.mark.slow  # 15-40 s each on 2 cores: a tiny training run or two and a fresh JAX.
@pytest.mark.parametrize('notebook', NOTEBOOKS, ids=lambda n: n.name)
def test_notebook_runs(notebook):
  env = {**os.environ, 'PYTHONPATH': str(REPO_ROOT), 'MPLBACKEND': 'Agg'}
  result = subprocess.run([sys.executable, '-c', _RUN_CELLS, str(notebook)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, f'{notebook.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}'
  code_cells = sum(c['cell_type'] == 'code' for c in _cells(notebook))
  assert f'--- code cell {code_cells}/{code_cells}' in result.stdout
