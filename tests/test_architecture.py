"""The layers docs/architecture.md draws hold in the code: each imports only from layers below it, no module imports
another that imports it back (through any chain), and nothing in the library imports the binaries."""

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = REPO / 'shadowsync_jax'


def _layers() -> dict[str, int]:
  """Package or top-level module -> its layer, from the table in docs/architecture.md."""
  layers = {}
  for number, names in re.findall(r'^\| (\d) \| (.+?) \|', (REPO / 'docs' / 'architecture.md').read_text(), re.M):
    for name in re.findall(r'`([\w/]+)`', names):
      layers[name.rstrip('/')] = int(number)
  return layers


def _imports() -> dict[str, set[str]]:
  """Every library module (dotted) -> the library modules it imports, anywhere in it (a lazy import too)."""
  modules = {'.'.join(p.relative_to(REPO).with_suffix('').parts): p for p in LIBRARY.rglob('*.py')}
  modules = {name.removesuffix('.__init__'): path for name, path in modules.items()}
  graph = {}
  for name, path in modules.items():
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module:
        candidates = [f'{node.module}.{alias.name}' for alias in node.names] + [node.module]
      elif isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
      else:
        continue
      found |= {c for c in candidates if c in modules and c != name}
    graph[name] = found
  return graph


def _layer(module: str, layers: dict[str, int]) -> int:
  return layers[module.split('.')[1]]


def test_every_import_goes_down_the_layers():
  layers, graph = _layers(), _imports()
  assert layers['data'] == 0 and layers['studies'] == 8, layers
  upward = sorted(
    f'{module} (layer {_layer(module, layers)}) imports {imported} (layer {_layer(imported, layers)})'
    for module, imported_modules in graph.items()
    if module.count('.') >= 1
    for imported in imported_modules
    if imported.count('.') >= 1 and _layer(imported, layers) > _layer(module, layers)
  )
  assert not upward, '\n'.join(upward)


def test_no_module_imports_one_that_imports_it_back():
  graph = _imports()
  state: dict[str, str] = {}
  stack: list[str] = []
  cycles = []

  def visit(module: str) -> None:
    state[module] = 'open'
    stack.append(module)
    for imported in sorted(graph[module]):
      if state.get(imported) == 'open':
        cycles.append(' -> '.join([*stack[stack.index(imported) :], imported]))
      elif imported not in state:
        visit(imported)
    stack.pop()
    state[module] = 'done'

  for module in sorted(graph):
    if module not in state:
      visit(module)
  assert not cycles, '\n'.join(cycles)


def test_the_library_imports_no_binary():
  binaries = [
    f'{module} imports {imported}'
    for module, imported_modules in _imports_of_anything().items()
    for imported in imported_modules
    if imported.split('.')[0] in ('experiments', 'benchmarks')
  ]
  assert not binaries, binaries


def _imports_of_anything() -> dict[str, set[str]]:
  """Every library module -> the top-level names of everything it imports."""
  result = {}
  for path in LIBRARY.rglob('*.py'):
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names.add(node.module)
      elif isinstance(node, ast.Import):
        names |= {alias.name for alias in node.names}
    result[str(path.relative_to(REPO))] = names
  return result
