"""Calibrating the run-health alarms, in one command:

  python -m experiments.alarms.run --workdir=/tmp/rl_lm/alarms [--parallel=2] [--out=experiments/alarms]

1. Runs the labelled set (experiments/alarms/runs.py: 9 healthy runs, 6 induced failures), skipping runs
   whose folder already holds done.json (about 70 minutes on 2 CPU cores, two runs at a time).
2. Replays the run-health monitor (rl_lm.health, the thresholds of rl.alarms) over every run's metrics.jsonl
   and writes the table (experiments/alarms/calibration.py) to <out>/calibration.md and .json and the console.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from experiments.alarms import calibration
from experiments.alarms import runs as run_defs
from rl_lm.metrics import format_duration
from rl_lm.runs import run_main


def execute(workdir: Path, parallel: int, smoke: bool = False, only: tuple[str, ...] = ()) -> list[str]:
  """Runs what is missing of the set; returns the names of the runs that failed to finish."""
  todo = [r for r in run_defs.run_set()
          if (not only or r.name in only) and not (workdir / r.name / "done.json").exists()]
  start, failed = time.monotonic(), []

  def one(r: run_defs.Run) -> tuple[run_defs.Run, int, float]:
    spec = f"{r.config}:smoke" if smoke else r.config
    code, wall = run_main(spec, workdir / r.name, r.flags(smoke))
    return r, code, wall

  with ThreadPoolExecutor(parallel) as pool:
    for i, fut in enumerate(as_completed([pool.submit(one, r) for r in todo]), 1):
      r, code, wall = fut.result()
      status = "done" if code == 0 else f"FAILED (exit {code}; see {workdir / r.name / 'log.txt'})"
      if code:
        failed.append(r.name)
      elapsed = time.monotonic() - start
      print(f"alarms: [{i}/{len(todo)}] {r.name} {status} in {format_duration(wall)} | elapsed "
            f"{format_duration(elapsed)} | ETA {format_duration(elapsed / i * (len(todo) - i))}", flush=True)
  return failed


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--workdir", required=True, type=Path)
  ap.add_argument("--parallel", type=int, default=2)
  ap.add_argument("--only", default="", help="comma-separated run names (default: all)")
  ap.add_argument("--smoke", action="store_true", help="every run on its config's smoke variant (seconds)")
  ap.add_argument("--skip_runs", action="store_true", help="only replay the monitor over the runs there")
  ap.add_argument("--out", type=Path, default=None, help="where calibration.md/.json go (default: the workdir)")
  args = ap.parse_args()
  if not args.skip_runs:
    failed = execute(args.workdir, args.parallel, args.smoke, tuple(n for n in args.only.split(",") if n))
    if failed:
      print(f"alarms: runs that did not finish: {', '.join(failed)} (left out of the table)")
  print(calibration.write(calibration.calibrate(args.workdir), args.out or args.workdir))


if __name__ == "__main__":
  main()
