"""Length bias (Liu et al. 2025, "Understanding R1-Zero-like training"): GRPO vs Dr. GRPO, in one command:

  python -m experiments.length_bias.run --workdir=/tmp/rl_lm/length_bias [--seeds=0,1,2] [--parallel=2] [--smoke]

1. base, once per seed: `configs/worked.py` stage sft (worked multi-step arithmetic, a 48-token budget).
2. RL from that seed's SFT policy, twice: GRPO as published (advantages over the group std, each response's
   token losses averaged over its own length) and Dr. GRPO (`configs/worked.py:dr_grpo`: no std, a constant
   normaliser). Runs already done (done.json) are skipped, so a rerun finishes what is missing.
3. From each run's metrics.jsonl: the mean length of the correct and of the incorrect completions of every
   step's rollouts (a step with no correct, or no incorrect, completion has no point for that kind).
4. `length_bias.png` (lengths over training, each seed thin, the seed mean thick), `length_bias.json` and
   `length_bias.md` (the change from the first to the last steps per run, the verdict) in the workdir.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from rl_lm import sweep
from rl_lm.metrics import format_duration
from rl_lm.runs import ROOT

CONFIG = str(ROOT / "configs" / "worked.py")
ALGORITHMS = {  # name -> overrides on configs/worked.py (its default is GRPO as published)
  "GRPO": {},
  "Dr. GRPO": {"rl.algorithm": "dr_grpo", "rl.loss_mode": "seq-mean-token-sum-norm"},
}
KINDS = ("correct", "incorrect")


def read_run(run: Path) -> dict[str, Any]:
  """Per-step lengths of correct / incorrect completions (NaN where a step had none), pass rate, and the held-out
  pass@1 before and after RL."""
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if "rollout/response_length_correct" in r]
  rate = np.array([float(r["rollout/pass_rate"]) for r in rows])
  out: dict[str, Any] = {"steps": [int(r["step"]) for r in rows], "pass_rate": rate.tolist(),
                         "length_mean": [float(r["rollout/response_length_mean"]) for r in rows]}
  for kind, has in (("correct", rate > 0), ("incorrect", rate < 1)):
    lengths = np.array([float(r[f"rollout/response_length_{kind}"]) for r in rows])
    out[kind] = np.where(has, lengths, np.nan).tolist()
  summary = json.loads((run / "rl_summary.json").read_text())
  out["pass1_before"] = float(summary["before"]["pass_at_k"]["1"])
  out["pass1_after"] = float(summary["after"]["pass_at_k"]["1"])
  return out


def change(values: list[float], window: int) -> tuple[float, float]:
  """Means of the first and of the last `window` defined values."""
  v = np.array(values, dtype=np.float64)
  v = v[~np.isnan(v)]
  if not len(v):
    return float("nan"), float("nan")
  return float(np.mean(v[:window])), float(np.mean(v[-window:]))


def smooth(values: list[float], width: int) -> np.ndarray:
  """Trailing moving average over the defined values (NaN stays where nothing is defined)."""
  v = np.array(values, dtype=np.float64)
  out = np.full_like(v, np.nan)
  for i in range(len(v)):
    window = v[max(0, i - width + 1): i + 1]
    if np.any(~np.isnan(window)):
      out[i] = np.nanmean(window)
  return out


def plot(runs: dict[str, dict[int, dict[str, Any]]], path: Path, width: int) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = (*KINDS, "pass_rate")
  fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.2))
  for i, (algo, seeds) in enumerate(runs.items()):
    for ax, key in zip(axes, panels, strict=True):
      curves = []
      for r in seeds.values():
        y = smooth(r[key], width)
        curves.append(y)
        ax.plot(r["steps"], y, color=f"C{i}", alpha=0.3, lw=0.8)
      n = min(len(c) for c in curves)
      with np.errstate(all="ignore"):
        mean = np.nanmean(np.stack([c[:n] for c in curves]), axis=0)
      ax.plot(next(iter(seeds.values()))["steps"][:n], mean, color=f"C{i}", lw=2.2,
              label=f"{algo} (mean of {len(seeds)} seeds)")
  titles = {"correct": "length of correct completions", "incorrect": "length of incorrect completions",
            "pass_rate": "training pass rate"}
  for ax, key in zip(axes, panels, strict=True):
    ax.set_title(titles[key])
    ax.set_xlabel("RL step")
    ax.set_ylabel("tokens" if key in KINDS else "fraction correct")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(f"Length bias: GRPO (per-response length normalisation, std scaling) vs Dr. GRPO "
               f"(rollout means, {width}-step moving average)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def verdict(table: list[dict[str, Any]]) -> str:
  """Reproduced when, on every seed, GRPO's incorrect completions lengthen more than Dr. GRPO's do."""
  by_seed: dict[int, dict[str, float]] = {}
  for row in table:
    by_seed.setdefault(row["seed"], {})[row["algorithm"]] = row["incorrect_last"] - row["incorrect_first"]
  pairs = {s: d for s, d in by_seed.items() if len(d) == len(ALGORITHMS)}
  wins = [s for s, d in pairs.items() if d["GRPO"] > d["Dr. GRPO"] and d["GRPO"] > 0]
  detail = "; ".join(f"seed {s}: GRPO {d['GRPO']:+.1f}, Dr. GRPO {d['Dr. GRPO']:+.1f} tokens"
                     for s, d in sorted(pairs.items()))
  if pairs and len(wins) == len(pairs):
    return f"Reproduced on {len(pairs)}/{len(pairs)} seeds: incorrect completions lengthen more under GRPO ({detail})."
  return (f"Not reproduced: GRPO lengthened incorrect completions more than Dr. GRPO on {len(wins)}/{len(pairs)} "
          f"seeds ({detail}).")


def report(table: list[dict[str, Any]], window: int, minutes: float) -> str:
  lines = [f"Mean completion length (tokens, eos included) over the first and the last {window} steps with such "
           "completions; held-out pass@1 before -> after RL:", "",
           "| algorithm | seed | correct: first -> last | incorrect: first -> last | incorrect change | "
           "held-out pass@1 |", "| --- | --- | --- | --- | --- | --- |"]
  for r in table:
    lines.append(f"| {r['algorithm']} | {r['seed']} | {r['correct_first']:.1f} -> {r['correct_last']:.1f} | "
                 f"{r['incorrect_first']:.1f} -> {r['incorrect_last']:.1f} | "
                 f"{r['incorrect_last'] - r['incorrect_first']:+.1f} | "
                 f"{r['pass1_before']:.3f} -> {r['pass1_after']:.3f} |")
  lines += ["", verdict(table), "", f"{len(table)} RL runs; the whole command took {minutes:.1f} min."]
  return "\n".join(lines)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workdir", required=True, type=Path)
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--parallel", type=int, default=2)
  ap.add_argument("--window", type=int, default=10, help="steps averaged at the start and at the end")
  ap.add_argument("--smooth", type=int, default=5, help="moving-average width of the plot")
  ap.add_argument("--smoke", action="store_true", help="configs/worked.py:smoke, 3 steps: seconds")
  args = ap.parse_args()
  start = time.monotonic()
  seeds = [int(s) for s in args.seeds.split(",")]
  spec = CONFIG + (":smoke" if args.smoke else "")
  window = 1 if args.smoke else args.window
  common = {"logging.wandb_mode": "disabled"}
  bases = sweep.run_points(spec, args.workdir, [{"seed": s, "stages": ("sft",)} for s in seeds],
                           [f"sft_seed{s}" for s in seeds], common, args.parallel)
  if failed := [b.name for b in bases if b.status != "done"]:
    raise SystemExit(f"length_bias: SFT runs failed: {', '.join(failed)}; see their log.txt")
  points, names, keys = [], [], []
  for s in seeds:
    for algo, overrides in ALGORITHMS.items():
      points.append({"seed": s, "stages": ("rl",), "rl.init_from": str(args.workdir / f"sft_seed{s}" / "checkpoints"
                                                                        / "sft"), **overrides})
      names.append(f"{'dr_grpo' if overrides else 'grpo'}_seed{s}")
      keys.append((algo, s))
  runs_done = sweep.run_points(spec, args.workdir, points, names, common, args.parallel)
  runs: dict[str, dict[int, dict[str, Any]]] = {algo: {} for algo in ALGORITHMS}
  table = []
  for (algo, s), name, r in zip(keys, names, runs_done, strict=True):
    if r.status != "done":
      continue
    data = read_run(args.workdir / name)
    runs[algo][s] = data
    row: dict[str, Any] = {"algorithm": algo, "seed": s, "pass1_before": data["pass1_before"],
                           "pass1_after": data["pass1_after"]}
    for kind in KINDS:
      row[f"{kind}_first"], row[f"{kind}_last"] = change(data[kind], window)
    table.append(row)
  runs = {a: v for a, v in runs.items() if v}
  minutes = (time.monotonic() - start) / 60
  (args.workdir / "length_bias.json").write_text(json.dumps({"table": table, "runs": runs, "minutes": minutes,
                                                             "config": {**vars(args), "workdir": str(args.workdir)}},
                                                            indent=1))
  if runs:
    plot(runs, args.workdir / "length_bias.png", args.smooth)
  text = report(table, window, minutes)
  (args.workdir / "length_bias.md").write_text(text + "\n")
  print(text)
  if failed := [r.name for r in runs_done if r.status != "done"]:
    raise SystemExit(f"length_bias: runs that did not finish: {', '.join(failed)} (left out of the table)")
  print(f"length_bias: wrote {args.workdir / 'length_bias.png'}, length_bias.md and length_bias.json "
        f"in {format_duration(time.monotonic() - start)}", flush=True)


if __name__ == "__main__":
  main()
