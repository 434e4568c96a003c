"""Entry point: `python -m rl_lm.main --config=configs/<x>.py[:variant] --workdir=DIR [--config.key=value ...]`.

Parses the config (locked: unknown keys are errors), joins the other processes of a multi-process
run (`rl_lm.distributed`: flags below, RL_LM_* variables, or a Slurm / TPU cluster), validates the
config before anything compiles, and runs `config.stages` in order. The work lives in rl_lm/train/.
In a multi-process run only process 0 prints progress and writes the run's shared files, and a
process that fails exits at once (its peers, stuck waiting for it, are stopped by the launcher).

A failure ends the run with one line on stderr, and any traceback goes to <workdir>/error.log
(error.<process>.log in the other processes of a multi-process run), so nothing is lost:

  exit 2    rl_lm: invalid configuration: <config.key>: <why>     a ConfigError, at validation or later
  exit 2    rl_lm: invalid configuration: <file>:<line>: <why>    the config file raised, exited or did not parse
            (traceback in <workdir>/error.log), or its get_config() returned no ConfigDict
  exit 1    rl_lm: error: <message naming the thing>             the user's input: a missing file, an unsupported
            or unreadable checkpoint, bad multi-process settings, and any exception whose class has
            `user_facing = True` (so a new such error, e.g. training stopped after NaN steps, needs no edit here)
  exit 1    rl_lm: error: <Type>: <message> (traceback in <workdir>/error.log)   anything else: a bug
  exit 130  rl_lm: interrupted (traceback in <workdir>/error.log)

Ctrl-C (SIGINT) raises KeyboardInterrupt, which is never lost (`rl_lm.interrupts`); the process then
leaves within `interrupts.EXIT_GRACE_S` whatever it waits for, and a second Ctrl-C leaves at once.
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from rl_lm import errors, interrupts

_CONFIG = config_flags.DEFINE_config_file("config", None, "A config file, optionally with :variant.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and samples.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "Multi-process run: host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process run: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process run: this process, 0 .. num_processes-1.")
_MULTIHOST = flags.DEFINE_bool("multihost", None, "Join the cluster JAX detects (TPU pod); --nomultihost: never.")
_LOCAL_DEVICES = flags.DEFINE_integer("local_device_count", None, "Fake CPU devices in this process (testing).")


def _fail(message: str) -> None:
  print(f"rl_lm: invalid configuration: {message}", file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
  from rl_lm.config import explain_flag_error

  absl_logger = logging.getLogger("absl")
  absl_logger.addFilter(errors.no_none_config_warning)  # the line below says it (config_flags logs it, then goes on)
  try:
    rest = flags.FLAGS(argv)
  except BaseException as e:  # noqa: BLE001 -- the config file runs here and may raise anything, SystemExit too
    problem = errors.config_file_problem(argv, e)
    if problem is None and not isinstance(e, Exception):
      raise  # --help's exit, Ctrl-C
    _fail(problem or explain_flag_error(argv, e))
  finally:
    absl_logger.removeFilter(errors.no_none_config_warning)
  problem = errors.config_file_problem(argv, None)
  if problem is not None:
    _fail(problem)
  return rest


def _run(config: object, workdir: str) -> None:
  from rl_lm import config as config_lib
  from rl_lm import distributed

  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _LOCAL_DEVICES.value,
                         _MULTIHOST.value)  # before anything starts a JAX backend
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    _fail(str(e))
  from rl_lm import metrics
  from rl_lm.train import stages
  from rl_lm.train.context import make_context

  main_process = distributed.is_main_process()
  os.makedirs(workdir, exist_ok=True)
  if main_process:
    metrics.write_run_info(workdir, config)
  ctx = make_context(config, workdir)
  for name in config.stages:
    if main_process:
      print(f"rl_lm: stage {name}", flush=True)
    stages.STAGES[name](ctx)
  if config.export_dir and main_process:  # transformers loads it: weights, config.json, the checkpoint's tokenizer
    from rl_lm.models import hf

    hf.export(config.export_dir, ctx.model_cfg, ctx.policy, config.model.hf_checkpoint or None)
    print(f"rl_lm: exported the policy to {config.export_dir}", flush=True)
  if main_process:
    metrics.write_done(workdir, list(config.stages))


def main(argv: list[str]) -> None:
  del argv
  interrupts.Interrupts().install()
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU found" is not news on a CPU
  if not flags.FLAGS["verbosity"].present:  # libraries' INFO lines (orbax, tfds) stay out of the console
    absl_logging.set_verbosity(absl_logging.WARNING)
  config, workdir = _CONFIG.value, _WORKDIR.value
  if config is None:
    _fail("--config is required, e.g. --config=configs/default.py")
  if not workdir:
    _fail("--workdir is required")
  try:
    _run(config, workdir)
  except SystemExit:
    raise
  except BaseException as e:  # noqa: BLE001 -- every failure ends in one line; the traceback goes to error.log
    code = errors.report(e, workdir)
    import jax

    if jax.distributed.is_initialized():  # the orderly shutdown waits for peers that may wait for us: leave now
      sys.stdout.flush()
      os._exit(code)
    interrupts.exit_with(code)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
