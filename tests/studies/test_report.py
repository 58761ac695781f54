"""The study result file: title, command, table, and raw summaries that parse back, without the configs."""

import json
import re
import sys

from shadowsync_jax.studies import report as study_report


def test_written_file_has_title_command_table_and_raw_summaries_without_config(tmp_path):
  rows = [{'label': 'none', 'eval_ne': 0.91, 'config': {'lr': 1}}, {'label': 'gba', 'eval_ne': 0.92}]
  out = study_report.write(
    tmp_path / 'sub' / 'study.md',
    'A study',
    'python -m x --y=1',
    '| a |\n|---|',
    rows,
    note='8 replicas',
    root='/tmp/runs',
  )
  text = out.read_text()
  assert re.match(
    r'# A study\n\n`python -m x --y=1`\n\nWritten [^\n]+ UTC at commit [^\n]+\n\n8 replicas\n\n\| a \|\n\|---\|\n\n'
    r'Runs in /tmp/runs\.',
    text,
  ), text[:400]
  raw = json.loads(re.search(r'```json\n(.*)\n```', text, re.S).group(1))
  assert raw == [{'label': 'none', 'eval_ne': 0.91}, {'label': 'gba', 'eval_ne': 0.92}]


def test_rows_by_label_stay_a_mapping(tmp_path):
  out = study_report.write(tmp_path / 's.md', 'T', 'cmd', 'table', {'full': {'x': 1, 'config': {}}})
  raw = json.loads(re.search(r'```json\n(.*)\n```', out.read_text(), re.S).group(1))
  assert raw == {'full': {'x': 1}}
  assert 'Runs in' not in out.read_text()


def test_command_line_names_the_module_and_its_flags(monkeypatch):
  monkeypatch.setattr(sys, 'argv', ['/repo/benchmarks/recovery.py', '--modes=none,full'])
  assert study_report.command_line() == 'python -m benchmarks.recovery --modes=none,full'
  monkeypatch.setattr(sys, 'argv', ['/repo/benchmarks/sync_study.py'])
  assert study_report.command_line() == 'python -m benchmarks.sync_study'


def test_writing_a_result_refreshes_the_docs_blocks_that_embed_it_and_no_other(tmp_path):
  docs = tmp_path / 'docs'
  (docs / 'studies').mkdir(parents=True)
  page = docs / 'studies' / 'page.md'
  page.write_text(
    'Reading.\n\n<!-- results: results/a.md -->\nstale table\n<!-- /results -->\n\n'
    '<!-- results: results/b.md -->\nother\n<!-- /results -->\nEnd.\n'
  )
  study_report.write(
    tmp_path / 'results' / 'a.md', 'A', 'python -m a', '| x |\n|---|\n| 1 |', [], root='/r', docs_dir=docs
  )
  text = page.read_text()
  assert re.search(
    r'<!-- results: results/a.md -->\n`python -m a`\n\nWritten [^\n]+\n\n\| x \|\n\|---\|\n\| 1 \|\n<!-- /results -->',
    text,
  ), text
  assert '<!-- results: results/b.md -->\nother\n<!-- /results -->' in text  # Not written: left as it was.
  assert text.startswith('Reading.') and text.endswith('End.\n') and 'Runs in' not in text
