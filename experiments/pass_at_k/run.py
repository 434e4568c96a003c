"""Sharpening vs new capability (Yue et al. 2025): held-out pass@k, k = 1 ... 256, before and after RL, in one command:

  python -m experiments.pass_at_k.run --workdir=/tmp/rl_lm/pass_at_k [--seeds=0,1,2] [--samples=256] [--parallel=2]
      [--tasks=default,worked] [--smoke]

1. Two tasks, each SFT then GRPO, once per seed, with `eval.num_samples` = 256 held-out samples per problem before
   and after RL: `configs/default.py` (one-digit arithmetic, imperfect demonstrations) and `configs/worked.py`
   (multi-step arithmetic written out line by line). Runs already done (done.json) are skipped.
2. From each run's rl_summary.json, the per-problem correct counts before and after RL give the unbiased pass@k
   for every k = 1 ... 256, the k where the after-RL curve falls to the before-RL one (the crossing), and the
   coverage: problems solved by at least one of 256 samples before, after, and lost or gained by RL.
3. `pass_at_k.png` (one panel per task: before and after, each seed thin, the seed mean thick; crossings marked),
   `pass_at_k.json` and `pass_at_k.md` in the workdir.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rl_lm import evaluation, sweep
from rl_lm.metrics import format_duration
from rl_lm.runs import ROOT

TASKS = {  # name -> config file
  "one-digit arithmetic (configs/default.py)": "default.py",
  "worked multi-step arithmetic (configs/worked.py)": "worked.py",
}
TABLE_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def curves(summary: dict[str, Any], samples: int) -> dict[str, Any]:
  """pass@k for every k = 1 ... samples, before and after RL, and the per-problem coverage of one run."""
  out: dict[str, Any] = {}
  for when in ("before", "after"):
    r = summary[when]
    c, n = np.asarray(r["correct_counts"]), np.asarray(r["valid_counts"])
    curve = evaluation.pass_at_k_curve(n, c, range(1, samples + 1))
    out[when] = [curve[k] for k in sorted(curve)]
    out[f"{when}_solved"] = (c > 0).tolist()
  b, a = np.array(out["before_solved"]), np.array(out["after_solved"])
  out.update(problems=len(b), solved_before=int(b.sum()), solved_after=int(a.sum()), lost=int((b & ~a).sum()),
             gained=int((a & ~b).sum()))
  out["crossing"] = crossing(out["before"], out["after"])
  return out


def crossing(before: list[float], after: list[float]) -> float | None:
  """The k (interpolated in log k) where after-RL pass@k first falls to the before-RL one, when after starts above;
  None when the curves do not cross inside 1 ... len(before), or when after starts at or below before."""
  d = np.asarray(after) - np.asarray(before)
  if d[0] <= 0:
    return None
  for i in range(1, len(d)):
    if d[i] <= 0:
      w = d[i - 1] / (d[i - 1] - d[i])  # k = i and i + 1 (1-based), linear in log k between them
      return float(math.exp(math.log(i) + w * (math.log(i + 1) - math.log(i))))
  return None


def plot(results: dict[str, dict[int, dict[str, Any]]], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.6), squeeze=False)
  for ax, (task, seeds) in zip(axes[0], results.items(), strict=True):
    for j, when in enumerate(("before", "after")):
      stack = np.stack([r[when] for r in seeds.values()])
      ks = np.arange(1, stack.shape[1] + 1)
      for row in stack:
        ax.plot(ks, row, color=f"C{j}", alpha=0.3, lw=0.8)
      ax.plot(ks, stack.mean(0), color=f"C{j}", lw=2.2, label=f"{when} RL (mean of {len(seeds)} seeds)")
    mean_before = np.mean([r["before"] for r in seeds.values()], 0)
    mean_after = np.mean([r["after"] for r in seeds.values()], 0)
    k = crossing(mean_before.tolist(), mean_after.tolist())
    if k is not None:
      ax.axvline(k, color="grey", ls=":", label=f"crossing of the means, k = {k:.1f}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("held-out pass@k")
    ax.set_title(task, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
  fig.suptitle("Does RL sharpen or add capability? held-out pass@k before and after GRPO")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def report(results: dict[str, dict[int, dict[str, Any]]], minutes: float) -> str:
  lines = ["| task | seed | when | " + " | ".join(f"pass@{k}" for k in TABLE_KS) + " | solved (of) | crossing k |",
           "| --- | --- | --- | " + " | ".join("---" for _ in TABLE_KS) + " | --- | --- |"]
  for task, seeds in results.items():
    short = task.split(" (")[0]
    for s, r in seeds.items():
      for when in ("before", "after"):
        cells = " | ".join(f"{r[when][k - 1]:.3f}" if k <= len(r[when]) else "" for k in TABLE_KS)
        solved = f"{r[f'solved_{when}']} ({r['problems']})"
        cross = "" if when == "before" else ("none" if r["crossing"] is None else f"{r['crossing']:.1f}")
        lines.append(f"| {short} | {s} | {when} | {cells} | {solved} | {cross} |")
  lines += ["", "Coverage at 256 samples: problems solved before but not after RL (lost) and after but not before "
            "(gained):", "", "| task | seed | lost | gained |", "| --- | --- | --- | --- |"]
  for task, seeds in results.items():
    for s, r in seeds.items():
      lines.append(f"| {task.split(' (')[0]} | {s} | {r['lost']} | {r['gained']} |")
  runs = sum(len(v) for v in results.values())
  lines += ["", f"{runs} runs; the whole command took {minutes:.1f} min."]
  return "\n".join(lines)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workdir", required=True, type=Path)
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--samples", type=int, default=256, help="held-out samples per problem (eval.num_samples)")
  ap.add_argument("--parallel", type=int, default=2)
  ap.add_argument("--tasks", default="default,worked", help="which of the tasks (config names) to run")
  ap.add_argument("--smoke", action="store_true", help="the configs' smoke variants: seconds")
  args = ap.parse_args()
  tasks = {name: config for name, config in TASKS.items() if config.removesuffix(".py") in args.tasks.split(",")}
  if not tasks:
    raise SystemExit(f"pass_at_k: --tasks={args.tasks} names no task; known: default, worked")
  start = time.monotonic()
  seeds = [int(s) for s in args.seeds.split(",")]
  common = {"logging.wandb_mode": "disabled", "eval.num_samples": args.samples}

  def run_task(config: str) -> list[sweep.Result]:  # the tasks side by side, each with its share of `parallel`
    spec = str(ROOT / "configs" / config) + (":smoke" if args.smoke else "")
    names = [f"{config.removesuffix('.py')}_seed{s}" for s in seeds]
    return sweep.run_points(spec, args.workdir, [{"seed": s} for s in seeds], names, common,
                            max(1, args.parallel // len(tasks)))

  with ThreadPoolExecutor(min(len(tasks), args.parallel)) as pool:
    done = dict(zip(tasks, pool.map(run_task, tasks.values()), strict=True))
  results: dict[str, dict[int, dict[str, Any]]] = {}
  failed = []
  for task, runs in done.items():
    for s, r in zip(seeds, runs, strict=True):
      if r.status != "done":
        failed.append(r.name)
        continue
      summary = json.loads((args.workdir / r.name / "rl_summary.json").read_text())
      results.setdefault(task, {})[s] = curves(summary, args.samples)
  minutes = (time.monotonic() - start) / 60
  (args.workdir / "pass_at_k.json").write_text(json.dumps({"results": results, "minutes": minutes,
                                                           "config": {**vars(args), "workdir": str(args.workdir)}}))
  if results:
    plot(results, args.workdir / "pass_at_k.png")
  text = report(results, minutes)
  (args.workdir / "pass_at_k.md").write_text(text + "\n")
  print(text)
  if failed:
    raise SystemExit(f"pass_at_k: runs that did not finish: {', '.join(failed)} (left out of the table)")
  print(f"pass_at_k: wrote {args.workdir / 'pass_at_k.png'}, pass_at_k.md and pass_at_k.json in "
        f"{format_duration(time.monotonic() - start)}", flush=True)


if __name__ == "__main__":
  main()
