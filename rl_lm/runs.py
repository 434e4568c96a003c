"""One run of `python -m rl_lm.main` in a subprocess: the runner that sweeps and experiments share.

  code, wall_s = run_main("configs/default.py:smoke", "DIR/run", ["--config.seed=1"])

The child inherits this process's working directory and environment, with the directory that holds rl_lm/
put first on PYTHONPATH. Its output is appended to <workdir>/log.txt after a header line with the command.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

LOG_HEADER = "# rl_lm.runs: "  # starts the line before each run's output in log.txt
ROOT = Path(__file__).resolve().parents[1]  # the directory that holds rl_lm/


def command(config: str, workdir: str | os.PathLike, overrides: Sequence[str] = ()) -> list[str]:
  """The command line: `config` is `path[:variant]`, `overrides` are `--config.key=value` flags."""
  return [sys.executable, "-m", "rl_lm.main", f"--config={config}", f"--workdir={workdir}", *overrides]


def run_main(config: str, workdir: str | os.PathLike, overrides: Sequence[str] = (),
             env: Mapping[str, str] | None = None) -> tuple[int, float]:
  """Runs `rl_lm.main` to its end, `env` added to the environment; returns its exit code and wall seconds."""
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  cmd = command(config, workdir, overrides)
  child_env = {**os.environ, **(env or {})}
  child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), child_env.get("PYTHONPATH", "")) if p)
  start = time.monotonic()
  with open(workdir / "log.txt", "a") as log:
    log.write(f"{LOG_HEADER}{time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(cmd)}\n")
    log.flush()
    code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, check=False).returncode
  return code, time.monotonic() - start
