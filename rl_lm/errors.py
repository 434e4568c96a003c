"""How a run that fails says so: one line on stderr, the traceback in <workdir>/error.log.

`report` turns any exception into that line and an exit status (see rl_lm.main for the table);
`config_file_problem` says what is wrong with a --config file itself (it raised, exited, did not parse,
or gave no ConfigDict), naming the file and line.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import traceback

from absl import flags

# Errors that are the user's input whatever their class (besides classes with `user_facing = True`).
USER_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, NotADirectoryError, PermissionError)


def no_none_config_warning(record: logging.LogRecord) -> bool:
  return "get_config() returned None" not in record.getMessage()


def argv_value(argv: list[str], name: str) -> str | None:
  """The value of --name in `argv` ("--name=v" or "--name v"), read before (or without) flag parsing."""
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _same_file(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)


def config_file_problem(argv: list[str], error: BaseException | None) -> str | None:
  """The line that says what is wrong with the --config file itself, or None when nothing is.

  `error` (raised while parsing flags) is the file's when the file raised it, exited with it (sys.exit,
  any status) or failed to compile: the line names the file and line, and the traceback goes to the
  error log. Otherwise the file must have given an ml_collections.ConfigDict.
  """
  from ml_collections import ConfigDict
  from ml_collections.config_flags import config_flags

  spec = argv_value(argv, "config")
  if not spec:
    return None
  path = spec.split(":", 1)[0]
  if error is not None and (line := _raised_in(path, error, argv)):
    return line
  config, loaded = flags.FLAGS["config"].value, flags.FLAGS["config"].present
  if error is not None and not loaded:  # the flag failed after running the file (on an override): run it again
    try:
      config, loaded = config_flags.ConfigFileFlagParser("config", lock_config=False).parse(spec), True
    except BaseException:  # noqa: BLE001 -- the file fails as it did the first time: the error explains itself
      return None
  if isinstance(config, config_flags._ErrorConfig):  # an OSError from loading the file, deferred to first use
    if not os.path.isfile(path):
      return f"{path}: no such config file"
    deferred = object.__getattribute__(config, "_error")
    return _raised_in(path, deferred, argv) or f"{path}: {one_line(deferred)}{_traceback_note(deferred, argv)}"
  if loaded and not isinstance(config, ConfigDict):
    return f"{path}: get_config() must return an ml_collections.ConfigDict, got {type(config).__name__}"
  return None


def _raised_in(path: str, error: BaseException, argv: list[str]) -> str | None:
  """"<path>:<line>: <what>" when `error`, or one it wraps, came from the file at `path`; else None."""
  seen: set[int] = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, SyntaxError) and error.filename and _same_file(error.filename, path):
      return f"{path}:{error.lineno}: {type(error).__name__}: {error.msg}{_traceback_note(error, argv)}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if _same_file(f.filename, path)]
    if frames:
      line, where = frames[-1].lineno, frames[-1].name
      if isinstance(error, SystemExit):
        when = "at import" if where == "<module>" else f"in {where}()"
        what = f"the config file exited {when} with status {error.code}"
      else:
        what = f"{type(error).__name__}: {one_line(error)}"
      return f"{path}:{line}: {what}{_traceback_note(error, argv)}"
    error = error.__cause__ or error.__context__
  return None


def _traceback_note(error: BaseException, argv: list[str]) -> str:
  return f" (traceback in {save_traceback(error, argv_value(argv, 'workdir') or '')})"


def one_line(e: BaseException) -> str:
  lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
  return (lines[0] + (" ..." if len(lines) > 1 else "")) if lines else "(no message)"


def is_user_error(e: BaseException) -> bool:
  from rl_lm.checkpoint import CheckpointError

  return getattr(e, "user_facing", False) is True or isinstance(e, (*USER_ERRORS, CheckpointError))


def _process_index() -> int:
  from rl_lm.distributed import ENV_PROCESS_ID

  try:
    jax = sys.modules.get("jax")  # not imported yet (a config error): no process but this one has started
    if jax is not None and jax.distributed.is_initialized():
      return jax.process_index()
    flag = flags.FLAGS["process_id"].value if "process_id" in flags.FLAGS else None
    return int(flag or os.environ.get(ENV_PROCESS_ID) or 0)  # initialize itself failed
  except Exception:  # noqa: BLE001 -- a backend that failed to start, flags not parsed, a malformed variable
    return 0


def save_traceback(e: BaseException, workdir: str) -> str:
  """Writes the traceback to <workdir>/error.log (a temporary file if that fails); returns the path."""
  index = _process_index()
  text = (f"{time.strftime('%Y-%m-%d %H:%M:%S')} rl_lm.main {' '.join(sys.argv[1:])}\n"
          + "".join(traceback.format_exception(e)))
  name = "error.log" if index == 0 else f"error.{index}.log"
  for folder in (workdir, tempfile.gettempdir()):
    try:
      os.makedirs(folder, exist_ok=True)
      path = os.path.join(folder, name if folder == workdir else f"rl_lm-{os.getpid()}-{name}")
      with open(path, "w") as f:
        f.write(text)
      return path
    except OSError:
      continue
  return "(nowhere: no writable folder)"


def report(e: BaseException, workdir: str) -> int:
  """Prints the one-line summary of `e`, saves its traceback, and returns the exit status."""
  from rl_lm.config import ConfigError

  where = f" (traceback in {save_traceback(e, workdir)})"
  if isinstance(e, KeyboardInterrupt):
    code, line = 130, f"rl_lm: interrupted{where}"
  elif isinstance(e, ConfigError):
    code, line = 2, f"rl_lm: invalid configuration: {one_line(e)}"
  elif is_user_error(e):
    code, line = 1, f"rl_lm: error: {one_line(e)}"
  else:
    code, line = 1, f"rl_lm: error: {type(e).__name__}: {one_line(e)}{where}"
  print(line, file=sys.stderr, flush=True)
  return code
