"""The manifest of a prepared dataset (`criteo_manifest.json` beside TFDS's `dataset_info.json`): what is in it,
where it came from, and how it was transformed; and where prepared datasets live. No tensorflow-datasets or grain.

  manifest.default_dir('kaggle')          # ~/tensorflow_datasets/criteo_click_blocks/kaggle ($TFDS_DATA_DIR first)
  manifest.location('/data/tfds/criteo_click_blocks/kaggle')     # ('/data/tfds', 'kaggle'): TFDS data_dir, config
  version_dir = manifest.find('/data/tfds')            # the one prepared dataset under a directory, or an error
  info = manifest.read(version_dir)
  manifest.split_rows(info, 'train')                   # rows of a split
  manifest.input_rows(info, 'train')                   # rows of each input (day) of the split, in order
  manifest.check_cardinalities(info, config.data.cardinalities, version_dir)   # ids are hashed into them

TFDS counts records (blocks) per shard; the manifest adds the rows of every record, so that a row of the stream can
be found without reading, and per input file: the lines read, the rows kept, malformed lines by kind with the first
file:line of each, and a sha256 over the TSV bytes (the digest of the sha256s of its parts, in order).
"""

from collections.abc import Sequence
import hashlib
import json
import os
from typing import Any

from shadowsync_jax.data.criteo import files

DATASET = 'criteo_click_blocks'  # The TFDS name: DATA_DIR/criteo_click_blocks/CONFIG/VERSION holds a dataset.
FILENAME = 'criteo_manifest.json'
FORMAT = 'criteo_click_blocks/1'
_SEARCH_DEPTH = 4  # data_dir / dataset / config / version


def default_dir(name: str) -> str:
  """Where TFDS looks for config `name` of the dataset by default: $TFDS_DATA_DIR or ~/tensorflow_datasets."""
  data_dir = os.environ.get('TFDS_DATA_DIR') or os.path.expanduser(os.path.join('~', 'tensorflow_datasets'))
  return os.path.join(data_dir, DATASET, name)


def location(prepared_dir: str) -> tuple[str, str]:
  """(TFDS data_dir, config name) of a dataset directory DATA_DIR/criteo_click_blocks/NAME: where a preparation
  writes so that `data.prepared_dir` finds it."""
  parts = os.path.normpath(os.path.expanduser(prepared_dir)).split(os.sep)
  if len(parts) < 3 or parts[-2] != DATASET or not parts[-1]:
    raise ValueError(
      f'{prepared_dir!r} is not of the form DATA_DIR/{DATASET}/NAME, where a preparation writes its dataset.'
    )
  return os.sep.join(parts[:-2]) or os.sep, parts[-1]


def build(
  pieces: dict[str, Sequence[files.Piece]],
  parts: Sequence[dict[str, Any]],
  shard_names: dict[str, list[str]],
  cardinalities: Sequence[int],
  block_rows: int,
  writer_options: str,
  true_probability_files: dict[str, str | None],
) -> dict[str, Any]:
  """The manifest of finished `parts` (in stream order), their shards named `shard_names[split]` (the parts that
  hold records, in order); `true_probability_files[split]`: the file of the split's true click probabilities, if
  its inputs were generated (`criteo.generate`)."""
  splits = {}
  for split, split_pieces in pieces.items():
    mine = [p for p in parts if p['split'] == split]
    stored = [p for p in mine if p['file'] is not None]
    inputs = []
    for index, piece in enumerate(split_pieces):
      of_piece = [p for p in mine if p['piece'] == index]
      inputs.append(
        {
          'path': piece.path,
          'first_line': piece.first_line,
          'lines': sum(p['end_line'] - p['start_line'] for p in of_piece),
          'rows': sum(p['rows'] for p in of_piece),
          'tsv_sha256_of_parts': hashlib.sha256(''.join(p['tsv_sha256'] for p in of_piece).encode()).hexdigest(),
          'malformed': {kind: sum(p['malformed'][kind] for p in of_piece) for kind in of_piece[0]['malformed']},
          'first_malformed': {k: v for p in reversed(of_piece) for k, v in p['first_malformed'].items()},
        }
      )
    splits[split] = {
      'rows': sum(p['rows'] for p in mine),
      'shards': [
        {'file': name, 'rows_per_record': p['rows_per_record']} for name, p in zip(shard_names[split], stored)
      ],
      'inputs': inputs,
      'true_probability': true_probability_files.get(split),
    }
  return {
    'format': FORMAT,
    'block_rows': block_rows,
    'cardinalities': [int(c) for c in cardinalities],
    'label': 'uint8: the first column, 0 or 1',
    'dense': 'float32 [13]: log(1 + max(I_f, 0)) of the integer columns I1..I13; empty = 0',
    'hashing': 'int32 [26]: int(C_t, 16) % cardinalities[t] of the hex columns C1..C26; empty = 0',
    'writer_options': writer_options,
    'splits': splits,
  }


def write(version_dir: str, manifest: dict[str, Any]) -> None:
  with open(os.path.join(version_dir, FILENAME), 'w') as f:
    json.dump(manifest, f, indent=1)


def read(version_dir: str) -> dict[str, Any]:
  path = os.path.join(version_dir, FILENAME)
  if not os.path.exists(path):
    raise FileNotFoundError(f'{version_dir} is not a prepared Criteo dataset: it has no {FILENAME}.')
  with open(path) as f:
    manifest = json.load(f)
  if manifest.get('format') != FORMAT:
    raise ValueError(f'{path} is of format {manifest.get("format")!r}; this version reads {FORMAT!r}.')
  return manifest


def find(prepared_dir: str) -> str:
  """The directory of the one prepared dataset at or below `prepared_dir` (the TFDS data_dir a preparation wrote to,
  or the dataset's own directory). Raises FileNotFoundError when there is none, ValueError when there are several."""
  prepared_dir = os.path.expanduser(prepared_dir)
  if not os.path.isdir(prepared_dir):
    raise FileNotFoundError(
      f'{prepared_dir!r} is not a directory (prepare the data first: experiments.prepare_criteo).'
    )
  found = []
  for root, dirs, names in os.walk(prepared_dir):
    relative = os.path.relpath(root, prepared_dir)
    depth = 0 if relative == '.' else relative.count(os.sep) + 1
    keep = [d for d in dirs if d != 'downloads' and not d.startswith('incomplete.')]  # TFDS's unfinished dirs.
    dirs[:] = [] if depth >= _SEARCH_DEPTH else sorted(keep)
    if FILENAME in names:
      found.append(root)
  if not found:
    raise FileNotFoundError(f'no prepared dataset ({FILENAME}) at or below {prepared_dir!r}.')
  if len(found) > 1:
    raise ValueError(f'{prepared_dir!r} holds several prepared datasets, name one: {", ".join(found)}.')
  return found[0]


def true_probability_file(manifest: dict[str, Any], split: str) -> str | None:
  """The file (in the dataset's directory) of the split's true click probabilities, or None."""
  return _split(manifest, split)['true_probability']


def shards(manifest: dict[str, Any], split: str) -> list[dict[str, Any]]:
  """[{'file': shard file name, 'rows_per_record': [...]}] of a split, in stream order."""
  return _split(manifest, split)['shards']


def split_rows(manifest: dict[str, Any], split: str) -> int:
  return _split(manifest, split)['rows']


def input_rows(manifest: dict[str, Any], split: str) -> list[int]:
  return [entry['rows'] for entry in _split(manifest, split)['inputs']]


def check_cardinalities(manifest: dict[str, Any], cardinalities: Sequence[int], version_dir: str) -> None:
  """The ids were hashed into the table sizes at preparation: training needs the same ones."""
  if list(manifest['cardinalities']) != [int(c) for c in cardinalities]:
    raise ValueError(
      f'data.cardinalities differ from those {version_dir} was prepared with ({manifest["cardinalities"]}): its ids '
      'are hashed into those tables. Train with them, or prepare again with these.'
    )


def _split(manifest: dict[str, Any], split: str) -> dict[str, Any]:
  if split not in manifest['splits']:
    raise ValueError(f'no split {split!r} in the prepared dataset; it has {", ".join(manifest["splits"])}.')
  return manifest['splits'][split]
