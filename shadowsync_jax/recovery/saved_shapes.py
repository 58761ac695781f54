"""A checkpoint's leaves by name: a leaf's tree path as a name (`leaf_name`: the files of the row-block item), and
every leaf's shape and dtype as a save writes them down (`leaf_shapes`, `shape_of`), compared at a restore
(`shape_difference`: orbax would restore into other shapes by cutting or padding).

  saved = saved_shapes.leaf_shapes(state)   # {name: [shape, dtype]}, written beside the checkpoint
  saved_shapes.shape_difference(saved, saved_shapes.leaf_shapes(abstract_state))   # None, or the first that differs
"""

from collections.abc import Mapping
import re
from typing import Any

import jax
import orbax.checkpoint as ocp

PyTree = Any
SKIPPED = ocp.PLACEHOLDER  # A leaf not read (`checkpointing.SKIPPED`, the same object): no shape of its own.


def leaf_name(path) -> str:
  """A leaf's tree path as a directory name: "['train'].params['embedding']" -> 'train_params_embedding'."""
  return re.sub(r'[^A-Za-z0-9]+', '_', jax.tree_util.keystr(path)).strip('_')


def leaf_shapes(tree: PyTree) -> dict[str, list]:
  """{leaf name: [shape, dtype]} of a tree of arrays or shapes (`SKIPPED` leaves left out)."""
  flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is SKIPPED)[0]
  return {leaf_name(path): shape_of(x) for path, x in flat if x is not SKIPPED}


def shape_of(x: Any) -> list:
  """[shape, dtype] of an array or shape, as the checkpoints write it down (`leaf_shapes`, `shape_difference`)."""
  return [list(x.shape), str(x.dtype)]


def shape_difference(saved: Mapping[str, list], wanted: Mapping[str, list]) -> str | None:
  """The first leaf whose shape and dtype as saved (`leaf_shapes`) differ from those wanted, said in words ('NAME
  is [SHAPE, DTYPE] there, [...] here'); None where all agree."""
  differ = [(name, saved.get(name), shape) for name, shape in wanted.items() if saved.get(name) != shape]
  if not differ and set(saved) == set(wanted):
    return None
  name, there, here = differ[0] if differ else (sorted(set(saved) ^ set(wanted))[0], None, None)
  return f'{name} is {there} there, {here} here'
