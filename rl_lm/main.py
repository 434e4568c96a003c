"""Entry point: `python -m rl_lm.main --config=configs/<x>.py[:variant] --workdir=DIR [--config.key=value ...]`.

Parses the config (locked: unknown keys are errors), validates it before anything compiles, and
runs `config.stages` in order. The work lives in rl_lm/train/.
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "A config file, optionally with :variant.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and samples.")


def _fail(message: str) -> None:
  print(f"rl_lm: invalid configuration: {message}", file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
  from rl_lm.config import explain_flag_error

  try:
    return flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001 -- config_flags raises several types; all mean a bad command line
    _fail(explain_flag_error(argv, e))


def main(argv: list[str]) -> None:
  del argv
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU found" is not news on a CPU
  from rl_lm import config as config_lib
  from rl_lm.train import stages
  from rl_lm.train.context import make_context

  config = _CONFIG.value
  if config is None:
    _fail("--config is required, e.g. --config=configs/default.py")
  if not _WORKDIR.value:
    _fail("--workdir is required")
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    _fail(str(e))
  os.makedirs(_WORKDIR.value, exist_ok=True)
  from rl_lm import metrics

  metrics.write_run_info(_WORKDIR.value, config)
  ctx = make_context(config, _WORKDIR.value)
  for name in config.stages:
    print(f"rl_lm: stage {name}", flush=True)
    stages.STAGES[name](ctx)
  metrics.write_done(_WORKDIR.value, list(config.stages))


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
