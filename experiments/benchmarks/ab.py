"""A/B timing against an earlier commit: the same benchmark, run alternately on both trees.

  python -m experiments.benchmarks.ab --base=7998a39 --rounds=3 -- experiments.benchmarks.rl_step --steps=5

The base commit is checked out in a temporary git worktree. Each round runs the benchmark module once in
the base tree and once in this tree (the order alternates between rounds), each in a fresh process that
writes its figures with `--json`. Alternating runs see the same machine load on average, so the ratio of
medians is what to read on a shared machine; absolute seconds drift from run to run.

Prints every run's figures for the keys in `--keys`, then per key: the median over rounds of each side
and the ratio this / base (below 1 means this tree is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_once(tree: str, module: str, args: list[str]) -> dict:
  """One benchmark process in `tree`; its --json figures."""
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    env = {**os.environ, "PYTHONPATH": tree}
    subprocess.run([sys.executable, "-m", module, *args, f"--json={out.name}"], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    with open(out.name) as f:
      return json.load(f)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--base", required=True, help="git revision to compare against")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--keys", default="step_s,sampling_s,prepare_s,update_s", help="figures to compare")
  parser.add_argument("module", help="benchmark module, e.g. experiments.benchmarks.rl_step")
  parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
  a = parser.parse_args()
  keys = a.keys.split(",")
  here = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                        check=True).stdout.strip()
  with tempfile.TemporaryDirectory() as tmp:
    base = os.path.join(tmp, "base")
    subprocess.run(["git", "worktree", "add", "--detach", base, a.base], cwd=here, check=True,
                   capture_output=True)
    try:
      runs: dict[str, list[dict]] = {"base": [], "this": []}
      for r in range(a.rounds):
        order = [("base", base), ("this", here)] if r % 2 == 0 else [("this", here), ("base", base)]
        for name, tree in order:
          fig = run_once(tree, a.module, a.args)
          runs[name].append(fig)
          print(f"round {r + 1} {name:4s} " + " ".join(f"{k}={fig[k]:.4g}" for k in keys), flush=True)
    finally:
      subprocess.run(["git", "worktree", "remove", "--force", base], cwd=here, check=False)
  print(f"\nmedian of {a.rounds} alternating rounds; base = {a.base}")
  print("figure | base | this | this / base")
  for k in keys:
    b, t = (statistics.median(f[k] for f in runs[n]) for n in ("base", "this"))
    print(f"{k} | {b:.4g} | {t:.4g} | {t / b:.3f}")


if __name__ == "__main__":
  main()
