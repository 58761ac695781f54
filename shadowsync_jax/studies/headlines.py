"""Headlines: each study's one-sentence reading, written from its result file, never typed.

  headlines.sentence('benchmarks/results/stragglers.md')   # 'a 2x slower process holds sync_sgd to 0.50 ...'
  headlines.refresh()                                       # README.md and docs/ from the result files

The README's studies table and each study's page quote a result file's headline between two markers, and
`refresh` (run by `report.write` for the file it wrote, or by hand for all) rewrites them from the file:

  <!-- headline: benchmarks/results/stragglers.md -->...<!-- /headline -->

A study writes its own headline: its module's `headline(path)` (`HEADLINES`: which writes which result file's), built
of `result_files`' rows and verdicts. Each figure of a headline is a figure of its result file (a table cell, or a
raw figure rounded as the headline shows it), or a target the study is read against (its module's `TARGET`:
`TARGETS`); `tests/test_docs.py` checks both, and that every README headline is on the page its row links. A target
reads "met" only where the interval clears it.
"""

from collections.abc import Callable
import inspect
import pathlib
import re
from typing import Any

from shadowsync_jax.studies import across_hosts
from shadowsync_jax.studies import cpr
from shadowsync_jax.studies import criteo_pipeline
from shadowsync_jax.studies import default_quality
from shadowsync_jax.studies import gba
from shadowsync_jax.studies import loop
from shadowsync_jax.studies import real_failures
from shadowsync_jax.studies import result_files
from shadowsync_jax.studies import shadow_overhead
from shadowsync_jax.studies import stragglers
from shadowsync_jax.studies import sweep
from shadowsync_jax.studies import sync_study
from shadowsync_jax.studies import table_size
from shadowsync_jax.studies import throughput

REPO_ROOT = result_files.REPO_ROOT
_BLOCK = re.compile(r'<!-- headline: (?P<path>\S+) -->(?P<body>.*?)<!-- /headline -->', re.S)

# Which study writes which result file's headline.
HEADLINES: dict[str, Callable[[str], str]] = {
  'benchmarks/results/default_quality.md': default_quality.headline,
  'benchmarks/results/throughput.md': throughput.headline,
  'benchmarks/results/loop.md': loop.headline,
  'benchmarks/results/sync_study.md': sync_study.headline,
  'benchmarks/results/shadow_overhead.md': shadow_overhead.headline,
  'benchmarks/results/across_hosts.md': across_hosts.headline,
  'benchmarks/results/sweep/sweep.csv': sweep.headline,
  'benchmarks/results/stragglers.md': stragglers.headline,
  'benchmarks/results/gba_study.md': gba.headline,
  'benchmarks/results/recovery.md': cpr.headline,
  'benchmarks/results/real_failures.md': real_failures.headline,
  'benchmarks/results/real_failures_kaggle.md': real_failures.kaggle_headline,
  'benchmarks/results/table_size.md': table_size.headline,
  'benchmarks/results/criteo_pipeline.md': criteo_pipeline.headline,
}
# Figures a headline may quote that are no measurement: the targets it is read against (its study's `TARGET`).
TARGETS: dict[str, Any] = {
  path: inspect.getmodule(write).TARGET
  for path, write in HEADLINES.items()
  if hasattr(inspect.getmodule(write), 'TARGET')
}


def sentence(path: str) -> str:
  """The headline of the result file at `path` (relative to the repository)."""
  return HEADLINES[path](path)


def blocks(text: str) -> list[tuple[str, str]]:
  """(result file path, the quoted headline) for every headline block of a page."""
  return [(m.group('path'), m.group('body')) for m in _BLOCK.finditer(text)]


def pages(root: pathlib.Path = REPO_ROOT) -> list[pathlib.Path]:
  """The pages that may quote headlines: the README and every page under docs/."""
  return [root / 'README.md', *sorted((root / 'docs').rglob('*.md'))]


def refresh(only: str | pathlib.Path | None = None, root: pathlib.Path = REPO_ROOT) -> list[pathlib.Path]:
  """Rewrites the headline blocks (of `only`'s file, if given) from their result files; returns the pages changed."""
  only_path = None if only is None else pathlib.Path(only).resolve()
  changed, sentences = [], {}  # A file's headline, read once for every page that quotes it.
  for page in pages(root):
    text = page.read_text()

    def block(match: re.Match) -> str:
      path = match.group('path')
      if (only_path is not None and (root / path).resolve() != only_path) or path not in HEADLINES:
        return match.group(0)
      if path not in sentences:
        sentences[path] = sentence(path)
      return f'<!-- headline: {path} -->{sentences[path]}<!-- /headline -->'

    new = _BLOCK.sub(block, text)
    if new != text:
      page.write_text(new)
      changed.append(page)
  return changed
