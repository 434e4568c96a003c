"""On-policy distillation's sample efficiency against RL and off-policy distillation, in one command:

  python -m experiments.distill.run --workdir=/tmp/rl_lm/distill [--seeds=0,1,2] [--arms=rl,onpolicy,...] [--smoke]

Per seed s (every run in <workdir>/seed<s>/<arm>, its output in its log.txt):
1. teacher: `configs/default.py` (SFT, then 80 steps of GRPO on the verifier's reward), seed s. Its RL checkpoint is
   the teacher of the arms below.
2. the arms, each from that run's own SFT checkpoint (copied: the student is the SFT-only model the teacher
   started from, trained once):
   - `rl`: the default's RL stage again, held-out evaluations every 10 steps (the teacher's own curve);
   - `onpolicy`: `configs/distill.py`, the per-token reverse-KL reward alone, evaluations every 10 steps;
   - `mixed`: `configs/distill.py:mixed`, the distillation reward beside the verifier's advantage;
   - `gkd`: `configs/distill.py:gkd`, the generalised JSD (beta 0.5) as a loss, half the steps on the teacher's
     samples (lambda 0.5);
   - `offpolicy`: `configs/distill.py:offpolicy`, SFT on 4 teacher samples of each training problem
     (`sft.steps` of it), evaluated before and after.
3. `distill.json` (every curve) and `distill.png` (held-out pass@1 against steps and against the student's sampled
   tokens) in the workdir; the table is printed: per arm the first evaluated step at which pass@1 reaches 90% of the
   teacher's, and the best pass@1 and its step.

Every evaluation uses the same held-out problems and draws (`rl_lm.train.held_out`), so the curves compare.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from rl_lm.runs import arm_args, run_config, smoke_variant

ARMS = {  # name -> (config, extra overrides)
  "rl": ("default.py", ("--config.eval.every=10",)),
  "onpolicy": ("distill.py", ("--config.eval.every=10",)),
  "mixed": ("distill.py:mixed", ("--config.eval.every=10",)),
  "gkd": ("distill.py:gkd", ("--config.eval.every=10",)),
  "offpolicy": ("distill.py:offpolicy", ()),
}
SHARE = 0.9  # of the teacher's held-out pass@1


def _run(config: str, workdir: Path, overrides: list[str]) -> None:
  run_config("distill", config, workdir, overrides)


def curve(run: Path) -> list[dict[str, float]]:
  """(step, pass@1, student tokens so far) at each held-out evaluation of a run."""
  out, tokens = [], 0.0
  for name in ("metrics.jsonl", "teacher_sft_metrics.jsonl"):
    if not (run / name).exists():
      continue
    for line in open(run / name):
      m = json.loads(line)
      tokens += m.get("rollout/completion_tokens", 0.0) if m.get("step", 0) else 0.0
      if "eval/pass@1" in m:
        out.append({"step": m["step"], "pass@1": m["eval/pass@1"], "tokens": tokens})
  summary = run / "teacher_sft_summary.json"
  if summary.exists():  # off-policy: before and after its SFT
    s = json.loads(summary.read_text())
    out = [{"step": 0, "pass@1": s["before"]["pass_at_k"]["1"], "tokens": 0.0},
           {"step": s["steps"], "pass@1": s["after"]["pass_at_k"]["1"], "tokens": 0.0}]  # it samples nothing
  return out


def reached(points: list[dict[str, float]], target: float) -> float | None:
  return next((p["step"] for p in points if p["pass@1"] >= target), None)


def plot(results: dict[str, Any], path: Path) -> None:
  """Per arm the mean over seeds of held-out pass@1 (the band: lowest to highest seed) against RL steps and against
  the student's sampled tokens; off-policy distillation, which samples nothing and trains 400 SFT steps, as its
  mean after them (dashed); the teachers' mean and 90% of it (grey)."""
  import matplotlib
  import numpy as np

  from rl_lm import plots

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
  colours = dict(zip(ARMS, ("C0", "C1", "C2", "C4", "C3"), strict=True))
  runs = list(results["seeds"].values())
  teacher = statistics.mean(r["teacher"] for r in runs)
  for arm in ARMS:
    curves = [r["arms"][arm] for r in runs if arm in r["arms"]]
    if not curves:
      continue
    if arm == "offpolicy":
      after = statistics.mean(c[-1]["pass@1"] for c in curves)
      for ax in axes:
        ax.axhline(after, color=colours[arm], ls="--", lw=1.2, label=f"{arm} (after {curves[0][-1]['step']} SFT steps)")
      continue
    n = min(len(c) for c in curves)
    y = np.asarray([[p["pass@1"] for p in c[:n]] for c in curves])  # [seeds, evaluations]
    for ax, x in zip(axes, ("step", "tokens"), strict=True):
      xs = np.mean([[p[x] for p in c[:n]] for c in curves], axis=0)
      ax.plot(xs, y.mean(0), "o-", color=colours[arm], ms=3, label=arm)
      ax.fill_between(xs, y.min(0), y.max(0), color=colours[arm], alpha=0.12)
  for ax in axes:
    ax.axhline(teacher, color="k", lw=0.8, alpha=0.5)
    ax.axhline(SHARE * teacher, color="k", lw=0.8, alpha=0.3, ls=":")
    ax.grid(alpha=0.3)
  axes[0].set_xlabel("RL steps")
  axes[1].set_xlabel("student tokens sampled (mean over seeds)")
  axes[0].set_ylabel("held-out pass@1, mean over seeds (band: range)")
  axes[0].legend(fontsize=8, loc="lower right")
  fig.suptitle(f"on-policy distillation vs RL vs off-policy distillation, {len(runs)} seeds "
               f"(grey: the teachers' mean pass@1, dotted: {SHARE:.0%} of it)")
  plots.save(fig, path)


def main() -> None:
  workdir, seeds, chosen, smoke = arm_args("distill", __doc__.splitlines()[0], list(ARMS), "0,1,2")
  results: dict[str, Any] = {"share": SHARE, "seeds": {}}
  for seed in seeds:
    base = workdir / f"seed{seed}"
    teacher = base / "teacher"
    _run("default.py:smoke" if smoke else "default.py", teacher, [f"--config.seed={seed}"])
    arms = {}
    for arm in chosen:
      config, extra = ARMS[arm]
      run = base / arm
      if not (run / "checkpoints" / "sft").exists():
        shutil.copytree(teacher / "checkpoints" / "sft", run / "checkpoints" / "sft")
      _run(smoke_variant(config) if smoke else config, run,
           [f"--config.seed={seed}", f"--config.teacher.init_from={teacher / 'checkpoints' / 'rl'}", *extra]
           if arm != "rl" else [f"--config.seed={seed}", *extra])
      arms[arm] = curve(run)
    target = json.loads((teacher / "rl_summary.json").read_text())["after"]["pass_at_k"]["1"]
    results["seeds"][seed] = {"teacher": target, "arms": arms}
  (workdir / "distill.json").write_text(json.dumps(results, indent=1))
  plot(results, workdir / "distill.png")
  print(f"arm | steps to {SHARE:.0%} of the teacher's pass@1 (per seed) | best pass@1 (step), mean over seeds")
  for arm in chosen:
    steps = [reached(r["arms"][arm], SHARE * r["teacher"]) for r in results["seeds"].values()]
    best = [max(r["arms"][arm], key=lambda p: p["pass@1"]) for r in results["seeds"].values()]
    print(f"{arm} | {', '.join('never' if s is None else str(s) for s in steps)} | "
          f"{statistics.mean(b['pass@1'] for b in best):.3f} ({', '.join(str(b['step']) for b in best)})")
  teachers = ", ".join(f"{r['teacher']:.3f}" for r in results["seeds"].values())
  print(f"teacher pass@1: {teachers}")


if __name__ == "__main__":
  main()
