"""The KL leash: the reward-KL frontier of PPO on the synthetic preference task, in one command:

  python -m experiments.kl_frontier.run --workdir=/tmp/rl_lm/kl_frontier [--parallel=2] [--rl_steps=60]
      [--seed=0] [--window=10] [--only=NAME,...] [--smoke]

1. base: `configs/rlhf_ppo.py` stages sft and reward_model, once (skipped when already complete).
2. PPO (`configs/rlhf_ppo.py` stage rl, from the base SFT policy against the base reward model), once per point
   of `points()`: no KL; KL in the reward (k1) at fixed coefficients over two orders of magnitude; the adaptive
   controller (Ziegler et al. 2019) at several targets; k2 and k3 in the reward; k1, k2 and k3 in the loss.
   Points already done (done.json in their folder) are skipped, so a rerun finishes what is missing.
3. Each run is one point: KL from the SFT policy (sequence-level k1, `policy/kl_ref_seq`, nats per completion),
   proxy (the reward model, centred on SFT samples) and gold (the task's programmatic score), means over the
   last `window` steps' rollouts; and the held-out gold after RL (rl_summary.json).
4. `kl_frontier.png` (proxy and gold against KL, one curve per family), `kl_frontier.json` and `kl_frontier.md`
   (the table, the frontiers compared at equal KL, the exact expected gradients of gradients.py) in the workdir.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.kl_frontier import gradients
from rl_lm import sweep
from rl_lm.metrics import format_duration
from rl_lm.runs import ROOT, run_main

CONFIG = str(ROOT / "configs" / "rlhf_ppo.py")
FIXED_COEFS = (0.01, 0.03, 0.1, 0.3, 1.0)  # KL in the reward, k1: two orders of magnitude around the config's 0.2
ADAPTIVE_TARGETS = (0.03, 0.1, 0.3)  # per-token k1 the adaptive controller aims at
ADAPTIVE_HORIZON = 640  # episodes: 10 steps of 64, so the coefficient can move 2% a step (the paper's 10000 would
#                         move it 8% in a whole 60-step run)
REWARD_COEFS = (0.1, 0.3)  # k2 and k3 in the reward
LOSS_COEFS = (0.03, 0.3, 3.0)  # k1, k2 and k3 in the loss
COMPARE_AT = (1.0, 2.0, 4.0, 8.0)  # nats per completion: where the frontiers are compared


def points(smoke: bool = False) -> list[dict[str, Any]]:
  """The runs: each {"name", "family", "coef" or "target", "overrides"}."""
  out: list[dict[str, Any]] = [{"name": "none", "family": "no KL", "coef": 0.0,
                                "overrides": {"rl.kl.placement": "none"}}]
  for c in FIXED_COEFS:
    out.append({"name": f"reward_k1_c{c:g}", "family": "reward k1, fixed", "coef": c,
                "overrides": {"rl.kl.placement": "reward", "rl.kl.estimator": "k1", "rl.kl.coef": c}})
  for t in ADAPTIVE_TARGETS:
    out.append({"name": f"reward_k1_adaptive_t{t:g}", "family": "reward k1, adaptive", "target": t,
                "overrides": {"rl.kl.placement": "reward", "rl.kl.estimator": "k1", "rl.kl.adaptive": True,
                              "rl.kl.target": t, "rl.kl.horizon": ADAPTIVE_HORIZON}})
  for est in ("k2", "k3"):
    for c in REWARD_COEFS:
      out.append({"name": f"reward_{est}_c{c:g}", "family": f"reward {est}, fixed", "coef": c,
                  "overrides": {"rl.kl.placement": "reward", "rl.kl.estimator": est, "rl.kl.coef": c}})
  for est in ("k1", "k2", "k3"):
    for c in LOSS_COEFS:
      out.append({"name": f"loss_{est}_c{c:g}", "family": f"loss {est}, fixed", "coef": c,
                  "overrides": {"rl.kl.placement": "loss", "rl.kl.estimator": est, "rl.kl.coef": c}})
  if smoke:  # one point of three kinds: the reward, the controller, the loss
    keep = {"reward_k1_c0.1", f"reward_k1_adaptive_t{ADAPTIVE_TARGETS[1]:g}", f"loss_k3_c{LOSS_COEFS[1]:g}"}
    out = [p for p in out if p["name"] in keep]
  return out


def read_point(run: Path, window: int) -> dict[str, float]:
  """KL, proxy and gold of one run: means over its last `window` logged steps; held-out gold after RL."""
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if "rollout/proxy_mean" in r][-window:]
  mean = {k: float(np.mean([float(r[k]) for r in rows]))
          for k in ("policy/kl_ref_seq", "policy/kl_ref_k1", "rollout/proxy_mean", "rollout/gold_mean",
                    "policy/kl_coef")}
  summary = json.loads((run / "rl_summary.json").read_text())
  return {"kl": max(mean["policy/kl_ref_seq"], 0.0), "kl_token": mean["policy/kl_ref_k1"],
          "proxy": mean["rollout/proxy_mean"], "gold": mean["rollout/gold_mean"], "final_coef": mean["policy/kl_coef"],
          "heldout_gold": float(summary["after"]["extra"]["gold_mean"]),
          "heldout_gold_before": float(summary["before"]["extra"]["gold_mean"])}


def frontier_at(pts: list[dict[str, Any]], key: str, kl: float) -> float | None:
  """`key` of a family's curve at `kl` nats: linear in log KL between its two nearest points; None outside."""
  pts = sorted((p for p in pts if p["kl"] > 0), key=lambda p: p["kl"])
  for a, b in zip(pts, pts[1:], strict=False):
    if a["kl"] <= kl <= b["kl"]:
      w = (math.log(kl) - math.log(a["kl"])) / max(math.log(b["kl"]) - math.log(a["kl"]), 1e-12)
      return a[key] + w * (b[key] - a[key])
  return None


def plot(results: list[dict[str, Any]], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  families: dict[str, list[dict[str, Any]]] = {}
  for r in results:
    families.setdefault(r["family"], []).append(r)
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharex=True)
  for i, (family, pts) in enumerate(families.items()):
    pts = sorted(pts, key=lambda p: p["kl"])
    style = "--" if family.startswith("loss") else "-"
    marker = "s" if "adaptive" in family else ("*" if family == "no KL" else "o")
    for ax, key in zip(axes, ("proxy", "gold"), strict=True):
      ax.plot([max(p["kl"], 1e-2) for p in pts], [p[key] for p in pts], style, marker=marker, ms=5,
              color=f"C{i % 10}", label=family)
  axes[0].set_title("proxy reward (the optimised reward model) vs KL")
  axes[1].set_title("gold reward (never trained on) vs KL")
  for ax in axes:
    ax.set_xscale("log")
    ax.set_xlabel("KL from the SFT policy, nats per completion (k1, last steps' rollouts)")
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=7, ncol=2)
  fig.suptitle("PPO's reward-KL frontier: where the KL goes (reward / loss) and which estimator (k1 / k2 / k3)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def report(results: list[dict[str, Any]], grads: list[dict[str, Any]], minutes: float) -> str:
  """The markdown table of every run, the frontiers at equal KL and the gradient table."""
  lines = ["| run | family | coef / target | KL (nats/completion) | KL per token | proxy | gold | held-out gold | "
           "final coef |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in results:
    knob = f"target {r['target']:g}" if "target" in r else f"{r['coef']:g}"
    lines.append(f"| {r['name']} | {r['family']} | {knob} | {r['kl']:.2f} | {r['kl_token']:.3f} | {r['proxy']:.3f} | "
                 f"{r['gold']:.3f} | {r['heldout_gold']:.3f} | {r['final_coef']:.3g} |")
  families = sorted({r["family"] for r in results})
  lines += ["", "Frontiers at equal KL (interpolated in log KL between a family's two nearest runs; blank: outside "
            "its range), proxy / gold:", "",
            "| family | " + " | ".join(f"KL {k:g}" for k in COMPARE_AT) + " |",
            "| --- | " + " | ".join("---" for _ in COMPARE_AT) + " |"]
  for fam in families:
    pts = [r for r in results if r["family"] == fam]
    cells = []
    for k in COMPARE_AT:
      p, g = frontier_at(pts, "proxy", k), frontier_at(pts, "gold", k)
      cells.append("" if p is None else f"{p:.3f} / {g:.3f}")
    lines.append(f"| {fam} | " + " | ".join(cells) + " |")
  lines += ["", "Expected gradients of each placement and estimator, exact on a 16-token categorical "
            "(experiments/kl_frontier/gradients.py, reference logits = policy logits + N(0, 1)):", "",
            gradients.format_table(grads), "", f"{len(results)} PPO runs; the whole command took {minutes:.1f} min."]
  return "\n".join(lines)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workdir", required=True, type=Path)
  ap.add_argument("--parallel", type=int, default=2)
  ap.add_argument("--rl_steps", type=int, default=60)
  ap.add_argument("--window", type=int, default=10, help="last logged steps averaged into a run's point")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--only", default="", help="comma-separated point names (points()): run and report only these")
  ap.add_argument("--smoke", action="store_true", help="the smoke variant, 3 steps, 3 points: seconds")
  args = ap.parse_args()
  start = time.monotonic()
  variant = ":smoke" if args.smoke else ""
  rl_steps, window = (3, 2) if args.smoke else (args.rl_steps, args.window)
  base = args.workdir / "base"
  common = {"logging.wandb_mode": "disabled", "seed": args.seed}
  if not (base / "checkpoints" / "reward_model").exists():
    print(f"kl_frontier: SFT and reward model in {base}", flush=True)
    code, wall = run_main(CONFIG + variant, base, [*sweep.override_flags(common),
                                                   "--config.stages=('sft','reward_model')"])
    if code:
      raise SystemExit(f"kl_frontier: the base run failed (exit {code}); see {base}/log.txt")
    print(f"kl_frontier: base done in {format_duration(wall)}", flush=True)
  pts = points(args.smoke)
  if args.only:
    wanted = set(args.only.split(","))
    if unknown := wanted - {p["name"] for p in pts}:
      raise SystemExit(f"kl_frontier: --only names no point: {', '.join(sorted(unknown))}; known: "
                       f"{', '.join(p['name'] for p in pts)}")
    pts = [p for p in pts if p["name"] in wanted]
  common.update({"stages": ("rl",), "rl.steps": rl_steps, "eval.every": 0,
                 "rl.init_from": str(base / "checkpoints" / "sft"),
                 "reward.model_checkpoint": str(base / "checkpoints" / "reward_model")})
  runs = sweep.run_points(CONFIG + variant, args.workdir, [p["overrides"] for p in pts], [p["name"] for p in pts],
                          common, args.parallel)
  failed = [r.name for r in runs if r.status != "done"]
  results = [{**{k: v for k, v in p.items() if k != "overrides"}, **read_point(args.workdir / p["name"], window)}
             for p in pts if p["name"] not in failed]
  for r in results:
    if r["family"] == "no KL":
      r["final_coef"] = 0.0  # the config's coefficient is logged, but no KL term is applied
  grads = gradients.table(draws=100, scale=1.0)
  minutes = (time.monotonic() - start) / 60
  (args.workdir / "kl_frontier.json").write_text(json.dumps({"runs": results, "gradients": grads,
                                                             "config": {**vars(args), "workdir": str(args.workdir)},
                                                             "minutes": minutes}, indent=1))
  plot(results, args.workdir / "kl_frontier.png")
  text = report(results, grads, minutes)
  (args.workdir / "kl_frontier.md").write_text(text + "\n")
  print(text)
  if failed:
    raise SystemExit(f"kl_frontier: runs that did not finish: {', '.join(failed)} (left out of the table)")
  print(f"kl_frontier: wrote {args.workdir / 'kl_frontier.png'}, kl_frontier.md and kl_frontier.json", flush=True)


if __name__ == "__main__":
  main()
