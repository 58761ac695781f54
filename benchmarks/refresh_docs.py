r"""Rewrites the docs from the result files: every page's embedded result blocks and every headline (README and
pages), as the study commands do for the file they write (`studies.report`, `studies.headlines`).

  python -m benchmarks.refresh_docs

For a result written without a study binary (a sweep's CSV copied under benchmarks/results/) or after a headline's
wording changed.
"""

from shadowsync_jax import cli
from shadowsync_jax.studies import headlines
from shadowsync_jax.studies import report


def main(argv):
  del argv
  changed = report.refresh_docs() + headlines.refresh()
  print('\n'.join(f'refreshed {page}' for page in sorted(set(changed))) or 'every page is current')


if __name__ == '__main__':
  cli.run(main)
