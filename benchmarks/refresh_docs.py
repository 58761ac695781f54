r"""Rewrites the docs from the result files: every page's embedded result blocks, every headline (README and
pages) and the README's time for all the studies, as the study commands do for the file they write
(`studies.report`, `studies.headlines`, `studies.reproduce`).

  python -m benchmarks.refresh_docs

For a result written without a study binary (a sweep's CSV copied under benchmarks/results/) or after a headline's
wording changed.
"""

from shadowsync_jax import cli
from shadowsync_jax.studies import headlines
from shadowsync_jax.studies import report
from shadowsync_jax.studies import reproduce


def main(argv):
  del argv
  changed = report.refresh_docs() + headlines.refresh()
  if reproduce.refresh_readme():
    changed.append(reproduce.README)
  print('\n'.join(f'refreshed {page}' for page in sorted(set(map(str, changed)))) or 'every page is current')


if __name__ == '__main__':
  cli.run(main)
