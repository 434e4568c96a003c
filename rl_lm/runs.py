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


def arm_args(name: str, description: str, arms: Sequence[str], seeds: str) -> tuple[Path, list[int], list[str], bool]:
  """The command line of an experiment over seeds and arms (--workdir, --seeds, --arms, --smoke): (workdir, seeds,
  the chosen arms, smoke). An unknown arm exits with one line naming the known ones."""
  import argparse

  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--seeds", default=seeds)
  parser.add_argument("--arms", default=",".join(arms), help=f"a subset of {', '.join(arms)}")
  parser.add_argument("--smoke", action="store_true", help="seconds-long runs of the smoke variants, for tests")
  args = parser.parse_args()
  chosen = args.arms.split(",")
  unknown = sorted(set(chosen) - set(arms))
  if unknown:
    raise SystemExit(f"{name}: unknown arms {unknown}; known: {', '.join(arms)}")
  return Path(args.workdir), [int(s) for s in args.seeds.split(",")], chosen, args.smoke


def run_config(name: str, config: str, workdir: Path, overrides: Sequence[str]) -> None:
  """`configs/<config>` run to its end in `workdir` (wandb off); a failure exits naming its log."""
  code, _ = run_main(str(ROOT / "configs" / config), workdir, ["--config.logging.wandb_mode=disabled", *overrides])
  if code:
    raise SystemExit(f"{name}: rl_lm.main failed with status {code}; see {workdir}/log.txt")


def smoke_variant(config: str) -> str:
  """"x.py" -> "x.py:smoke", "x.py:v" -> "x.py:v_smoke": a config's seconds-long variant."""
  stem, _, variant = config.partition(":")
  return f"{stem}:{variant}_smoke" if variant else f"{stem}:smoke"
