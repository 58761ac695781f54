"""Every notebook in colabs/ runs top to bottom, so none of them rots; each finds the checkout it sits in.

A notebook runs in a fresh Python process started in colabs/ with nothing on PYTHONPATH, as Jupyter started there
would run it (it sets the JAX device count itself, which a process can do only before JAX is first used), with
matplotlib's Agg backend: its code cells are executed in order in one namespace, as a kernel would, and the first
failing cell fails the test with its traceback.
No Jupyter is needed. A notebook line that only IPython understands (`%magic`, `!shell`) fails as a syntax error.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO_ROOT / 'colabs').glob('*.ipynb'))

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
def test_notebook_names_no_repository_address_and_is_stored_without_outputs(notebook):
  cells = _cells(notebook)
  text = ''.join(''.join(c['source']) for c in cells)
  addresses = [line for line in text.splitlines() if 'github.com' in line and '<you>' not in line]
  assert not addresses, f'{notebook.name} names a repository address; the notebooks find the checkout: {addresses}'
  setup = ''.join(next(c for c in cells if c['cell_type'] == 'code')['source'])
  assert "REPOSITORY = ''" in setup and "find_spec('shadowsync_jax')" in setup, (
    f'the first code cell of {notebook.name} must be the setup cell (find the checkout, or clone REPOSITORY)'
  )
  assert all(not c.get('outputs') for c in cells if c['cell_type'] == 'code'), (
    f'{notebook.name} is stored with outputs; clear them (the test executes it; outputs would go stale)'
  )


@pytest.mark.slow  # 15-40 s each on 2 cores: a tiny training run or two and a fresh JAX.
@pytest.mark.parametrize('notebook', NOTEBOOKS, ids=lambda n: n.name)
def test_notebook_runs(notebook):
  # As a user runs it: Jupyter started in colabs/ of a checkout, nothing on PYTHONPATH.
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'} | {'MPLBACKEND': 'Agg'}
  result = subprocess.run(
    [sys.executable, '-c', _RUN_CELLS, str(notebook)],
    cwd=REPO_ROOT / 'colabs',
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, f'{notebook.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}'
  code_cells = sum(c['cell_type'] == 'code' for c in _cells(notebook))
  assert f'--- code cell {code_cells}/{code_cells}' in result.stdout
