"""The SmolLM2 RL result over seeds: a table of held-out accuracy before and after, and the curves.

  python -m experiments.smollm2.report --out=experiments/smollm2 /tmp/rl_lm/smollm2/seed0 /tmp/rl_lm/smollm2/seed1 ...

Each argument is the workdir of one `configs/smollm2_arithmetic.py` run. Reads its held-out evaluations
(`eval/step_*.json`: greedy accuracy and pass@k on the test split) and its training metrics
(`metrics.jsonl`), prints one row per seed and their mean, and writes `curves.png`: held-out greedy
accuracy, pass@1 and pass@8 against the step (one line per seed), and the training reward, entropy and
KL to the reference (a moving average over 5 steps).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rl_lm import plots


def evaluations(workdir: str | Path) -> list[dict]:
  """The held-out evaluations of a run, in step order."""
  files = sorted(Path(workdir, "eval").glob("step_*.json"))
  if not files:
    raise FileNotFoundError(f"{workdir}: no eval/step_*.json (is it the workdir of an RL run?)")
  return [json.loads(f.read_text()) for f in files]


def training(workdir: str | Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
  """Per-step values of `keys` from metrics.jsonl (NaN where a step lacks one), and "step"."""
  rows = [json.loads(line) for line in Path(workdir, "metrics.jsonl").read_text().splitlines() if line.strip()]
  rows = [r for r in rows if "rollout/reward_mean" in r]
  return {k: np.array([r.get(k, np.nan) for r in rows], float) for k in ("step", *keys)}


def _smooth(x: np.ndarray, width: int = 5) -> np.ndarray:
  if len(x) < width:
    return x
  return np.convolve(x, np.ones(width) / width, mode="valid")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--out", default="", help="folder for curves.png (none: no plot)")
  args = parser.parse_args()

  print("run | greedy before | greedy after | gain (pts) | pass@1 before | pass@1 after | "
        "pass@8 before | pass@8 after")
  gains = []
  for workdir in args.workdirs:
    evals = evaluations(workdir)
    b, a = evals[0], evals[-1]
    gains.append(100 * (a["greedy_accuracy"] - b["greedy_accuracy"]))
    print(f"{Path(workdir).name} (step {b['step']} -> {a['step']}) | {b['greedy_accuracy']:.3f} | "
          f"{a['greedy_accuracy']:.3f} | {gains[-1]:+.1f} | {b['pass_at_k']['1']:.3f} | {a['pass_at_k']['1']:.3f} | "
          f"{b['pass_at_k']['8']:.3f} | {a['pass_at_k']['8']:.3f}")
  print(f"mean gain over {len(gains)} runs: {np.mean(gains):+.1f} points of held-out greedy accuracy "
        f"(min {min(gains):+.1f})")
  if not args.out:
    return

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(2, 3, figsize=(13, 7))
  held_out = (("greedy_accuracy", "held-out greedy accuracy"), ("1", "held-out pass@1"), ("8", "held-out pass@8"))
  train_keys = (("rollout/reward_mean", "training reward (5-step mean)"),
                ("policy/entropy", "entropy (nats/token, 5-step mean)"),
                ("policy/kl_ref_k3", "KL to the reference, k3 (5-step mean)"))
  for workdir in args.workdirs:
    name = Path(workdir).name
    evals = evaluations(workdir)
    steps = [e["step"] for e in evals]
    for ax, (key, title) in zip(axes[0], held_out, strict=True):
      values = [e["greedy_accuracy"] if key == "greedy_accuracy" else e["pass_at_k"][key] for e in evals]
      ax.plot(steps, values, marker="o", label=name)
      ax.set_title(title)
    series = training(workdir, tuple(k for k, _ in train_keys))
    for ax, (key, title) in zip(axes[1], train_keys, strict=True):
      y = _smooth(series[key])
      ax.plot(series["step"][len(series["step"]) - len(y):], y, label=name)
      ax.set_title(title)
  for ax in axes.flat:
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
  axes[0, 0].legend()
  print(f"wrote {plots.save(fig, Path(args.out) / 'curves.png')}")


if __name__ == "__main__":
  main()
