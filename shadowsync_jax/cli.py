"""The command line every binary shares: absl flags, a config file with dotted overrides, errors a person can read.

  cli.define_config_flag('experiments/configs/default.py')   # --config=FILE[:variant] and --config.KEY=VALUE
  ...
  if __name__ == '__main__':
    cli.run(main)        # app.run(main), with usage errors as one line

A usage error prints one line, `error: ...`, naming the flag, key or file and what to do, and exits with status 2
(`USAGE_EXIT_CODE`), without a traceback: an unknown flag or config key (with the nearest known key), a value of the
wrong type, a config file or variant that does not exist, and a `config.ConfigError` raised by `main` (a value the
schema refuses, a replica count that does not fit, a missing data file). Any other error keeps its traceback.
`parallel.launcher` prints such a line once for the whole job, however many processes print it.
"""

from collections.abc import Callable, Sequence
import difflib
import re
import sys
from typing import NoReturn

from absl import app
from absl import flags
from ml_collections import config_flags

from shadowsync_jax.parallel import exit_codes

USAGE_EXIT_CODE = exit_codes.USAGE
ERROR_PREFIX = exit_codes.ERROR_PREFIX
_OVERRIDE = re.compile(r'^--?config\.([^=\s]+)')


def run(main: Callable[[list[str]], None]) -> None:
  """`absl.app.run(main)`, with flag errors and a `ConfigError` from `main` printed as one line (exit status 2)."""

  def guarded(argv: list[str]) -> None:
    _check_the_config_loaded()
    try:
      main(argv)
    except Exception as error:  # pylint: disable=broad-except  (re-raised unless it is a ConfigError)
      # Only a binary that loaded the config schema can raise its errors; one that did not (the coordinator, the
      # launcher) never imports it, nor JAX and flax with it, and starts in a fraction of a second.
      config_lib = sys.modules.get('shadowsync_jax.config')
      if config_lib is None or not isinstance(error, config_lib.ConfigError):
        raise
      exit_with_usage_error(str(error))

  app.run(guarded, flags_parser=parse_flags)


def define_config_flag(default: str, help_text: str = 'Experiment config file, FILE[:variant].') -> None:
  """Defines `--config` (ml_collections, locked) and its dotted overrides, which ml_collections reads from the command
  line right here, at definition: an unknown key or a missing file ends the program as a usage error already."""
  unknown = unknown_config_keys(sys.argv[1:])
  if unknown:
    exit_with_usage_error(unknown[0])
  try:
    config_flags.DEFINE_config_file('config', default, help_text, lock_config=True)
  except flags.Error as error:
    exit_with_usage_error(_last_line_of_a_traceback(str(error)))
  except OSError as error:
    exit_with_usage_error(_config_file_message(str(error)))
  except (AttributeError, KeyError, TypeError, ValueError) as error:
    exit_with_usage_error(f'bad config override: {_last_line_of_a_traceback(str(error))}')


def exit_with_usage_error(message: str) -> NoReturn:
  """Prints `error: message` on stderr and exits with `USAGE_EXIT_CODE`."""
  sys.stdout.flush()
  print(f'{ERROR_PREFIX}{message}', file=sys.stderr, flush=True)
  sys.exit(USAGE_EXIT_CODE)


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing, with every failure turned into one line (`exit_with_usage_error`)."""
  try:
    return flags.FLAGS(list(argv))
  except flags.Error as error:
    exit_with_usage_error(_last_line_of_a_traceback(str(error)))
  except OSError as error:  # ml_collections: the config file could not be read.
    exit_with_usage_error(_config_file_message(str(error)))
  except (AttributeError, KeyError, TypeError, ValueError) as error:  # ml_collections: an override it refused.
    exit_with_usage_error(f'bad config override: {_last_line_of_a_traceback(str(error))}')


def unknown_config_keys(args: Sequence[str]) -> list[str]:
  """One message per `--config.KEY=VALUE` whose KEY the schema does not have, with the nearest known keys."""
  from shadowsync_jax import config as config_lib  # pylint: disable=g-import-not-at-top  (binaries with a config)

  known = config_lib.flat_keys(config_lib.base_config())
  groups = {key.rsplit('.', 1)[0] for key in known if '.' in key}
  messages = []
  for arg in args:
    if arg == '--':
      break
    match = _OVERRIDE.match(arg)
    if not match or match.group(1) in known:
      continue
    key = match.group(1)
    if key in groups:
      messages.append(
        f'--config.{key} is a group of keys, not a key: set one of them, e.g. '
        f'--config.{next(k for k in sorted(known) if k.startswith(key + "."))}=...'
      )
      continue
    nearest = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = (
      f'did you mean {" or ".join(f"--config.{k}" for k in nearest)}?'
      if nearest
      else 'every key, its default and its meaning: shadowsync_jax/config.py (base_config).'
    )
    messages.append(f'unknown config key {key!r} (in {arg.split("=", 1)[0]}); {hint}')
  return messages


def _check_the_config_loaded() -> None:
  """ml_collections defers a config file it could not load to the first use of `FLAGS.config`: use it now."""
  if 'config' not in flags.FLAGS:
    return
  try:
    flags.FLAGS.config.keys()
  except OSError as error:
    exit_with_usage_error(_config_file_message(str(error)))


def _last_line_of_a_traceback(text: str) -> str:
  """ml_collections wraps a config file's exception, traceback and all, into the flag error: keep its last line."""
  if 'Traceback (most recent call last)' in text:
    flag = text.split(':', 1)[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f'{flag}: {lines[-1]}'
  return ' '.join(line.strip() for line in text.splitlines() if line.strip())


def _config_file_message(text: str) -> str:
  missing = re.search(r"No such file or directory: '([^']+)'", text)
  if missing:
    return (
      f'config file {missing.group(1)!r} does not exist (--config=FILE[:variant], e.g. '
      '--config=experiments/configs/default.py:tiny).'
    )
  return f'cannot load the config file: {_last_line_of_a_traceback(text)}'
