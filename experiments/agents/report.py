"""The calculator demo over seeds, fault-free and with injected faults: a table and the curves.

  python -m experiments.agents.report --out=experiments/agents /tmp/rl_lm/calculator_sweep [more sweep folders]

Each argument is the workdir of a sweep of `configs/calculator.py` (`python -m rl_lm.sweep`, see the config's
docstring): one folder per point, named by its overrides. Per run: held-out pass@1, pass@8, greedy accuracy and
tool-call rate before and after RL (rl_summary.json), the share of training episodes lost to the environment and
the classifier's precision and recall on injected faults (metrics.jsonl, over all steps), workers replaced, and
wall time; then the means of each arm. `curves.png`: training success, tool-call rate and environment-failure
share against the step, one line per run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rl_lm import plots


def _rows(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_figures(workdir: Path) -> dict:
  summary = json.loads((workdir / "rl_summary.json").read_text())
  steps = [r for r in _rows(workdir / "metrics.jsonl") if "episodes/success_rate" in r]
  point = json.loads((workdir / "sweep_point.json").read_text()) if (workdir / "sweep_point.json").exists() else {}
  out = {"run": workdir.name, "faults": "faults" in workdir.name, "steps": steps,
         "wall_min": point.get("wall_s", 0.0) / 60}
  for when in ("before", "after"):
    ev = summary[when]
    out[f"{when}_pass@1"] = ev["pass_at_k"]["1"]
    out[f"{when}_pass@8"] = ev["pass_at_k"].get("8")
    out[f"{when}_greedy"] = ev["greedy_accuracy"]
    out[f"{when}_tool_calls"] = ev.get("extra", {}).get("tool_call_rate")
  out["env_failure"] = float(np.mean([r["episodes/failure_env"] for r in steps]))
  if out["faults"]:
    out["precision_min"] = min(r["faults/precision"] for r in steps)
    out["recall_min"] = min(r["faults/recall"] for r in steps)
    out["injected"] = float(np.mean([r["faults/injected_frac"] for r in steps]))
  out["replaced"] = steps[-1].get("episodes/workers_replaced", 0.0)
  return out


def plot(runs: list[dict], path: Path) -> Path:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), dpi=100)
  for i, r in enumerate(runs):
    step = [s["step"] for s in r["steps"]]
    style = dict(color=f"C{i % 3}", ls="--" if r["faults"] else "-", lw=1.2,
                 label=("faults, " if r["faults"] else "fault-free, ") + r["run"].split(",")[0])
    for ax, key in zip(axes, ("episodes/success_rate", "episodes/tool_call_rate", "episodes/failure_env"),
                       strict=True):
      ax.plot(step, [s[key] for s in r["steps"]], **style)
  for ax, title in zip(axes, ("training episodes solved", "episodes that call the calculator",
                              "episodes lost to the environment (masked)"), strict=True):
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("RL step")
    ax.set_ylim(0, 1.02 if "lost" not in title else None)
  axes[0].legend(fontsize=7)
  return plots.save(fig, path)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("sweep_dirs", nargs="+")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  runs = sorted((run_figures(d) for top in args.sweep_dirs for d in Path(top).iterdir()
                 if (d / "rl_summary.json").exists()), key=lambda r: (r["faults"], r["run"]))
  cols = ("before_pass@1", "after_pass@1", "before_pass@8", "after_pass@8", "before_greedy", "after_greedy",
          "before_tool_calls", "after_tool_calls", "env_failure", "replaced", "wall_min")
  print("| arm | run | " + " | ".join(cols) + " | precision (min) | recall (min) |")
  print("|" + " --- |" * (len(cols) + 4))
  for r in runs:
    pr = f"{r['precision_min']:.3f} | {r['recall_min']:.3f}" if r["faults"] else " | "
    print(f"| {'faults' if r['faults'] else 'fault-free'} | {r['run'].split(',')[0]} | "
          + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + f" | {pr} |")
  for arm in (False, True):
    sel = [r for r in runs if r["faults"] == arm]
    if sel:
      gain = np.mean([r["after_pass@1"] - r["before_pass@1"] for r in sel])
      print(f"{'faults' if arm else 'fault-free'}: mean pass@1 after {np.mean([r['after_pass@1'] for r in sel]):.3f}, "
            f"mean gain {100 * gain:+.1f} points over {len(sel)} seeds")
  if args.out:
    print(plot(runs, Path(args.out) / "curves.png"))


if __name__ == "__main__":
  main()
