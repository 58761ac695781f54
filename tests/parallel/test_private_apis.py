"""The private symbols of jax, jaxlib and orbax that `private_apis` uses are still there, with the parameters it
passes: an upgrade that renames or reshapes one fails here, not silently in a job."""

import importlib
import importlib.metadata
import inspect
import pathlib
import re

import pytest

from shadowsync_jax.parallel import private_apis

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _parameters(function) -> list[str]:
  """Parameter names from the signature, or from a nanobind function's docstring `name(a: ..., b: ...)`."""
  try:
    return list(inspect.signature(function).parameters)
  except (TypeError, ValueError):
    head = function.__doc__.split('->', 1)[0]
    return re.findall(r'[(,]\s*(\w+)\s*:', head)


def test_the_jax_distributed_internals_it_uses():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top

  for attribute in ('client', 'coordinator_address', 'process_id', 'num_processes'):
    assert hasattr(distributed.global_state, attribute), attribute
  client = _parameters(_jax.get_distributed_runtime_client)
  assert client[:2] == ['address', 'node_id'] and {'init_timeout', 'use_compression', 'heartbeat_timeout'} <= set(
    client
  ), client
  for method in ('connect', 'key_value_set', 'key_value_try_get', 'blocking_key_value_get'):
    assert hasattr(_jax.DistributedRuntimeClient, method), method
  assert 'hostname' in _parameters(_jax.make_gloo_tcp_collectives)
  service = _parameters(_jax.get_distributed_runtime_service)
  assert service[:2] == ['address', 'num_nodes'] and {'heartbeat_timeout', 'shutdown_timeout', 'recoverable'} <= set(
    service
  ), service


def test_the_compilation_cache_internals_it_uses():
  from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
  from jax._src import compiler  # pylint: disable=g-import-not-at-top

  assert tuple(_parameters(compiler._cache_write)) == private_apis.CACHE_WRITE_PARAMETERS  # pylint: disable=protected-access
  assert _parameters(compilation_cache.put_executable_and_time) == [
    'cache_key',
    'module_name',
    'executable',
    'backend',
    'compile_time',
  ]


def test_a_cache_writer_of_other_parameters_is_left_as_jax_has_it(monkeypatch):
  """jax 0.11 calls its writer with other arguments than 0.10: replacing it would break every compilation."""
  from jax._src import compiler  # pylint: disable=g-import-not-at-top

  def writer_of_another_version(cache_key, compile_time_secs, module_name, backend, executable):
    del cache_key, compile_time_secs, module_name, backend, executable

  monkeypatch.setattr(compiler, '_cache_write', writer_of_another_version)
  with pytest.warns(UserWarning, match='only process 0 writes the compilation cache'):
    private_apis.cache_writes_from_any_process()
  assert compiler._cache_write is writer_of_another_version  # pylint: disable=protected-access


def test_the_orbax_internals_it_uses():
  signaling_client = importlib.import_module('orbax.checkpoint._src.futures.signaling_client')
  assert callable(signaling_client.get_signaling_client)
  replacement = signaling_client.ThreadSafeKeyValueSignalingClient
  assert signaling_client.SignalingClient in replacement.__mro__
  assert _parameters(signaling_client.get_signaling_client) == [] and _parameters(replacement) == []  # Drop-in.
  checkpoint_manager = importlib.import_module('orbax.checkpoint.checkpoint_manager')
  assert _parameters(checkpoint_manager.CheckpointManager._maybe_await_cleanup_tmp_directory) == ['self']  # pylint: disable=protected-access


def test_the_pinned_versions_are_those_it_was_written_for():
  pins = dict(
    line.split('==', 1)
    for line in (REPO_ROOT / 'requirements.txt').read_text().splitlines()
    if '==' in line and not line.startswith('#')
  )
  for package, version in private_apis.WRITTEN_FOR.items():
    if package in pins:
      assert pins[package].strip() == version, (package, pins[package], version)
  assert private_apis.check_versions() == []  # The installed ones too (CI installs the pins).


def test_other_versions_are_named(monkeypatch):
  for package in private_apis.WRITTEN_FOR:  # As if written for what is installed, but jax.
    monkeypatch.setitem(private_apis.WRITTEN_FOR, package, importlib.metadata.version(package))
  monkeypatch.setitem(private_apis.WRITTEN_FOR, 'jax', '0.0.1')
  (line,) = private_apis.check_versions()
  assert line.startswith('jax ') and 'written for 0.0.1' in line


def test_no_other_module_of_the_library_imports_a_private_module():
  offenders = []
  for path in sorted((REPO_ROOT / 'shadowsync_jax').rglob('*.py')):
    if path.name == 'private_apis.py':
      continue
    text = path.read_text()
    if re.search(r'^\s*(from|import)\s+(jax\._src|jaxlib|orbax\.checkpoint\._src)', text, re.M):
      offenders.append(str(path.relative_to(REPO_ROOT)))
  assert not offenders, offenders
