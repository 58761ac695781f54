"""Compiled programs kept across a job's starts: a restart loads what the first start compiled, bit for bit, and
nothing of another run, of other code or of JAX's own cache is ever loaded or kept."""

import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shadowsync_jax.parallel import program_store

_SHARDING = jax.sharding.NamedSharding(jax.make_mesh((jax.device_count(),), ('i',)), jax.sharding.PartitionSpec())


def _program(offset: float) -> program_store.StoredProgram:
  """A program no cache has seen (`offset` is in it), on a mesh, made anew as a restarted process makes its
  programs."""
  fn = lambda x, y: (x * y + offset, {'sum': x.sum()})
  return program_store.stored('scaled', jax.jit(fn, donate_argnums=0, out_shardings=_SHARDING))


def _copy(x: jax.Array) -> jax.Array:  # What a call donates.
  return jax.device_put(jnp.copy(x), _SHARDING)


def _arrays(n: int = 8, y: float = 3.0) -> tuple[jax.Array, jax.Array]:
  return jax.device_put((jnp.arange(n, dtype=jnp.float32), jnp.full(n, y, jnp.float32)), _SHARDING)


@pytest.fixture
def offset() -> float:
  return uuid.uuid4().int % 10_000 / 7.0


def test_a_restart_loads_what_the_first_start_compiled_and_gets_the_same_bits(tmp_path, offset):
  x, y = _arrays()
  with program_store.active(tmp_path, {'run': 'a'}) as first:
    before = jax.device_get(_program(offset)(_copy(x), y))
    assert first.kept == ['scaled'] and program_store.loaded() == []
  assert len(list((tmp_path / f'process_{jax.process_index()}').glob('scaled-*.bin'))) == 1
  with program_store.active(tmp_path, {'run': 'a'}) as restart:
    program = _program(offset)
    assert program_store.output_shapes(program, x, y)[0].shape == (8,)  # From the executable, not a trace.
    after = jax.device_get(program(_copy(x), y))
    assert restart.loaded == ['scaled'] and restart.kept == []
  np.testing.assert_array_equal(before[0], after[0])
  assert before[1]['sum'] == after[1]['sum']
  assert program_store.loaded() == []  # Outside a store.


def test_another_run_or_signature_compiles_again_and_keeps_nothing_jax_loaded_from_its_cache(tmp_path, offset):
  """Another identity (a setting, the code) is another digest; JAX's persistent cache (the suite's, conftest) then
  holds the program, and an executable it loaded is not kept (it serializes without its kernels)."""
  x, y = _arrays(y=1.0)
  with program_store.active(tmp_path, {'run': 'a'}):
    _program(offset)(_copy(x), y)
  with program_store.active(tmp_path, {'run': 'b'}) as other:
    _program(offset)(_copy(x), y)
    assert other.loaded == []
    cache_on = jax.config.jax_compilation_cache_dir is not None
    assert other.kept == ([] if cache_on else ['scaled'])
  with program_store.active(tmp_path, {'run': 'a'}) as same:
    _program(offset)(*_arrays(4))  # Another shape: compiled.
    assert same.loaded == []


def test_traced_inside_another_program_or_outside_a_store_it_is_its_jitted_function(tmp_path, offset):
  program = _program(offset)
  x, y = _arrays(y=1.0)
  expected = x * y + offset
  np.testing.assert_array_equal(program(_copy(x), y)[0], expected)  # No store active.
  with program_store.active(tmp_path, {'run': 'a'}) as store:
    shapes = jax.eval_shape(program, x, y)
    inside = jax.jit(lambda a, b: program(a, b)[0] * 2)(x, y)
    assert store.kept == [] and shapes[0].shape == (8,)
  np.testing.assert_array_equal(inside, 2 * expected)


def test_a_program_file_cut_short_is_compiled_again(tmp_path, offset):
  x, y = _arrays(y=1.0)
  with program_store.active(tmp_path, {'run': 'a'}):
    _program(offset)(_copy(x), y)
  (path,) = (tmp_path / f'process_{jax.process_index()}').glob('scaled-*.bin')
  path.write_bytes(path.read_bytes()[:100])
  with program_store.active(tmp_path, {'run': 'a'}) as restart:
    np.testing.assert_array_equal(_program(offset)(_copy(x), y)[0], x * y + offset)
    assert restart.loaded == []


def test_an_executable_this_process_had_compiled_before_is_not_kept(tmp_path, offset):
  """The jitted function called first (outside a store, as a study or an earlier instance might): the store's
  compile gets that executable back, with no sign of whether JAX's cache gave it (then it serializes without its
  kernels: "Function ... not found" when a restart ran it), so it is not kept."""
  program = _program(offset)
  x, y = _arrays()
  program.jitted(_copy(x), y)
  with program_store.active(tmp_path, {'run': 'a'}) as store:
    program(_copy(x), y)
    assert store.kept == [] and store.loaded == []
