"""Compiled programs kept across a job's starts, so that a restart neither traces nor lowers them again.

  with program_store.active(workdir / 'programs', identity={'config': config.to_json()}):
    block = program_store.stored('train_block', jax.jit(fn, donate_argnums=0))   # called like the jitted fn
    state, metrics = block(state, batches)     # the first call of a signature: loaded, or compiled and kept
    program_store.compile(block, state, batches)   # the same, ahead of a first call, nothing run
    program_store.output_shapes(block, state, batches)   # its outputs' shapes, from the executable if stored

JAX's persistent compilation cache (`compilation_cache`) spares a restart the compiling, not the tracing and
lowering that find a program's cache key: at Criteo Kaggle's size each start spent ~0.7 s of its core tracing and
lowering its two block programs, and ~0.45 s lowering and loading the program that builds the initial tables, before
it trained again. A stored program is the compiled executable itself
(`jax.experimental.serialize_executable`), under `DIRECTORY/process_{p}/NAME-DIGEST.bin`, where the digest is of
everything the program can depend on beyond its arguments: `identity` (the run's settings), the package's source,
the versions of JAX and jaxlib, JAX's flags, `XLA_FLAGS`, the devices and this process's place among them; and of
the arguments' shapes, dtypes and shardings and tree. Anything else that differs (the code edited, another
setting) is another digest: compiled again, never a program of other code. Outside `active`, or for arguments
that are not arrays, `stored` programs are their jitted function, untouched.

Only a program the backend compiled here, on a mesh (its devices, in their order, go with it), is kept: an
executable JAX loaded from its own cache serializes without its compiled kernels (on CPU, jaxlib 0.10: "Function ...
not found" when a restart ran it), and one this process had compiled before comes back with no sign of where it
came from; a start that found its programs so keeps none, and the next start finds them in JAX's cache again.
"""

from collections.abc import Callable, Iterator, Mapping
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import pathlib
import pickle
import threading
from typing import Any

import jax
from jax.experimental import serialize_executable

_PACKAGE = pathlib.Path(__file__).resolve().parents[1]
_CACHE_HIT = '/jax/compilation_cache/cache_hits'
_BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'


class _Store:
  def __init__(self, directory: pathlib.Path, identity: Mapping[str, Any]):
    self.directory = directory / f'process_{jax.process_index()}'
    self.directory.mkdir(parents=True, exist_ok=True)
    self.digest = _digest({'identity': dict(identity), **_environment()})
    self.loaded: list[str] = []  # Names of the programs loaded from the store this start; `kept`: compiled here.
    self.kept: list[str] = []


_active: _Store | None = None


@contextlib.contextmanager
def active(directory: str | pathlib.Path, identity: Mapping[str, Any]) -> Iterator[_Store]:
  """Within it, `stored` programs are loaded from `directory` or kept there (module docstring)."""
  global _active
  previous, _active = _active, _Store(pathlib.Path(directory), identity)
  try:
    yield _active
  finally:
    _active = previous


class StoredProgram:
  """A jitted function whose executables, one per signature of its arguments, come from the active store."""

  def __init__(self, name: str, jitted: Callable[..., Any]):
    self.name, self.jitted = name, jitted
    self._executables: dict[tuple, Any] = {}  # By store and signature: this process's loaded or compiled ones.
    functools.update_wrapper(self, jitted)

  def __call__(self, *args: Any) -> Any:
    executable = self.executable(*args)
    return self.jitted(*args) if executable is None else executable(*args)

  def lower(self, *args: Any) -> Any:
    return self.jitted.lower(*args)

  def executable(self, *args: Any) -> Any:
    """The compiled program for `args`' signature: loaded from the active store, or compiled (and kept there);
    None outside a store, or for arguments it does not key."""
    store = _active
    signature = None if store is None else _signature(args)
    if signature is None:
      return None
    key = (store.directory, store.digest, signature)  # (A store's id may be another's once it is gone.)
    if key not in self._executables:
      self._executables[key] = _load_or_compile(store, self.name, self.jitted, args, signature)
    return self._executables[key]


def stored(name: str, jitted: Callable[..., Any]) -> StoredProgram:
  """`jitted` (a `jax.jit` function of positional array arguments), kept in the active store under `name`. Called
  with tracers (inside another program, or for its shapes) it is traced as `jitted` is; called with arrays inside
  a trace (a closure's), it runs."""
  return StoredProgram(name, jitted)


def loaded() -> list[str]:
  """The names of the programs this start loaded from the active store, in order ([] outside one)."""
  return list(_active.loaded) if _active is not None else []


def output_shapes(program: Callable[..., Any], *args: Any) -> Any:
  """`jax.eval_shape(program, *args)`, or where `program` is stored, its executable's outputs (shapes, dtypes and
  shardings): loaded, not traced (a restart's first trace of the state builder took ~0.2 s at Criteo Kaggle's size)."""
  executable = program.executable(*args) if isinstance(program, StoredProgram) else None
  return jax.eval_shape(program, *args) if executable is None else executable.out_info


def compile(program: Callable[..., Any], *args: Any) -> None:  # pylint: disable=redefined-builtin
  """Compiles (or loads) `program` for `args`' signature now, ahead of its first call; nothing runs."""
  if isinstance(program, StoredProgram) and program.executable(*args) is not None:
    return
  jitted = program.jitted if isinstance(program, StoredProgram) else program
  jitted.lower(*args).compile()


def _load_or_compile(store: _Store, name: str, jitted, args: tuple, signature: tuple) -> Any:
  tree, *leaves = signature
  described = [str(tree), *((a.str_short(), getattr(a, 'weak_type', False), repr(s)) for a, s in leaves)]
  path = store.directory / f'{name}-{_digest({"program": store.digest, "signature": described})}.bin'
  in_tree = jax.tree.structure((args, {}))
  if path.exists():
    try:
      payload, out_skeleton, device_ids = pickle.loads(path.read_bytes())
      devices = {d.id: d for d in jax.devices()}
      executable = serialize_executable.deserialize_and_load(
        payload, in_tree, jax.tree.structure(out_skeleton), execution_devices=[devices[i] for i in device_ids]
      )
      store.loaded.append(name)
      return executable
    except Exception:  # pylint: disable=broad-except  (cut short, or of another jaxlib: compiled again)
      path.unlink(missing_ok=True)
  events = []  # This thread's: JAX's cache found the program, or the backend compiled it.
  thread = threading.get_ident()
  seen = lambda event, *_, **__: events.append(event) if threading.get_ident() == thread else None
  jax.monitoring.register_event_listener(seen)
  jax.monitoring.register_event_duration_secs_listener(seen)
  try:
    executable = jitted.lower(*args).compile()
  finally:
    jax.monitoring.unregister_event_listener(seen)
    jax.monitoring.unregister_event_duration_listener(seen)
  # Compiled here: by the backend, and not found in JAX's persistent cache nor in this process's (an executable
  # compiled before, maybe loaded from JAX's cache, comes with no event at all).
  fresh = _BACKEND_COMPILE in events and _CACHE_HIT not in events
  device_ids = _device_ids(jax.tree.leaves(executable.output_shardings))
  if fresh and device_ids is not None:
    try:
      payload, _, out_tree = serialize_executable.serialize(executable)
    except (ValueError, NotImplementedError):  # (Constants closed over: compiled at every start.)
      return executable
    skeleton = jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves)
    temporary = path.with_suffix(f'.{os.getpid()}.{threading.get_ident()}.tmp')
    temporary.write_bytes(pickle.dumps((payload, skeleton, device_ids)))
    temporary.rename(path)  # Complete or absent: a start killed mid-write leaves only a temporary file.
    store.kept.append(name)
  return executable


def _device_ids(shardings: list[Any]) -> list[int] | None:
  """The devices a program runs on, in its order (this process's alone, or the job's), from its outputs' mesh (a
  program without one is not kept)."""
  meshes = {id(s.mesh): s.mesh for s in shardings if isinstance(s, jax.sharding.NamedSharding)}
  if len(meshes) != 1:
    return None
  return [d.id for d in next(iter(meshes.values())).devices.flat]


def _signature(args: tuple) -> tuple | None:
  """The tree, and each leaf's abstract value (shape, dtype, weak type) and sharding: None if a leaf is not a JAX
  array. (Read at every call: ~1 us a leaf, where attributes read one by one took ~4.)"""
  leaves, tree = jax.tree.flatten(args)
  if not all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in leaves):
    return None  # (A tracer: the program traced inside another, or for its shapes alone.)
  return (tree, *((x.aval, x.sharding) for x in leaves))


@functools.cache
def _source_digest() -> str:
  """Of every Python file of the package: programs of edited code are never another's."""
  digest = hashlib.sha256()
  for path in sorted(_PACKAGE.rglob('*.py')):
    digest.update(str(path.relative_to(_PACKAGE)).encode() + b'\0' + path.read_bytes() + b'\0')
  return digest.hexdigest()


def _environment() -> dict[str, Any]:
  return {
    'source': _source_digest(),
    'jax': jax.__version__,
    'jaxlib': importlib.metadata.version('jaxlib'),
    'flags': {k: repr(v) for k, v in sorted(jax.config.values.items()) if 'cache' not in k},
    'xla_flags': os.environ.get('XLA_FLAGS', ''),
    'devices': [(d.id, d.platform, d.device_kind, d.process_index) for d in jax.devices()],
    'process': (jax.process_index(), jax.process_count()),
  }


def _digest(value: Any) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:24]
