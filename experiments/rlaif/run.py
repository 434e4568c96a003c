"""RLAIF against RLHF on the synthetic preference task (its gold reward known), in one command:

  python -m experiments.rlaif.run --workdir=/tmp/rl_lm/rlaif [--seeds=0,1] [--arms=gold,noisy,...] [--smoke]

Per seed s (every run in <workdir>/seed<s>/<arm>, its output in its log.txt; configs/rlaif.py holds the settings):
1. `judge`: the tiny model fine-tuned on 1,000 gold-labelled comparisons, both orders (`configs/rlaif.py:judge`).
2. the judge measured on held-out pairs (the test split's 500 pairs, their gold known): its agreement with the gold,
   its position bias (how often it picks the answer shown first; how often its choice flips with the order) and
   its length bias (how often it picks the longer side, against the gold's own rate) -> judge.json.
3. the arms, each PPO as configs/rlhf_ppo.py, seed s: `gold` (a reward model on gold Bradley-Terry labels), `noisy`
   (on labels 20% flipped: the "human" labels), `ai_labels` (on the judge's labels), `direct` (no reward model: the
   judge's P(the completion beats the gold-optimal reference) is the reward).
4. rlaif.json and rlaif.png (each arm's gold and proxy against the KL to the SFT policy) in the workdir, and the
   table: per arm the held-out gold after PPO and the last steps' training gold, mean over seeds.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from rl_lm.runs import arm_args, run_config, smoke_variant

ARMS = {"gold": "rlaif.py:gold", "noisy": "rlaif.py:noisy", "ai_labels": "rlaif.py", "direct": "rlaif.py:direct"}
LAST = 10  # training steps averaged for the end-of-run training gold


def _run(config: str, workdir: Path, overrides: list[str]) -> None:
  run_config("rlaif", config, workdir, overrides)


def measure_judge(variant: str | None, judge: Path, seed: int, pairs: int, out: Path) -> dict[str, float]:
  """The judge's agreement with the gold and its biases on held-out pairs (rl_lm.train.pairs.relabel), with the
  judge settings of `configs/rlaif.py:<variant>`."""
  from configs import rlaif
  from rl_lm.config import validate
  from rl_lm.rewards.judge import PairwiseJudge
  from rl_lm.tasks.preferences import SyntheticPreferences
  from rl_lm.train import pairs as pairs_lib
  from rl_lm.train import teacher
  from rl_lm.train.context import make_context

  cfg = rlaif.get_config(variant)
  cfg.seed, cfg.judge.init_from = seed, str(judge)
  validate(cfg)
  ctx = make_context(cfg, "")
  model = teacher.load_judge(cfg, ctx, lambda _: None)
  held_out = SyntheticPreferences(seed=seed).pairs("test", pairs, seed=seed)
  judge_fn = PairwiseJudge(model, cfg.judge.compare, cfg.judge.choices, cfg.judge.min_mass)
  _, stats = pairs_lib.relabel(held_out, judge_fn)
  out.write_text(json.dumps(stats, indent=1))
  return stats


def curves(run: Path) -> list[dict[str, float]]:
  """Per training step: the gold, the proxy (what trained) and the KL to the SFT policy (per sequence)."""
  keys = {"gold": "rollout/gold_mean", "proxy": "rollout/proxy_mean", "kl": "policy/kl_ref_seq"}
  out = []
  for line in open(run / "metrics.jsonl"):
    m = json.loads(line)
    if keys["gold"] in m:
      out.append({"step": m["step"], **{k: m.get(v, float("nan")) for k, v in keys.items()}})
  return out


def held_out_gold(run: Path) -> float:
  """The held-out gold mean after PPO (the last evaluation's)."""
  summary = json.loads((run / "rl_summary.json").read_text())
  return float(summary["after"]["extra"].get("gold_mean", float("nan")))


def plot(results: dict[str, Any], path: Path) -> None:
  """Left: the gold against the KL to the SFT policy for every arm and seed (a running mean over 5 steps: one step's
  rollouts are noisy). Right: the direct arm's proxy (the judge's score) and gold against the KL."""
  import matplotlib
  import numpy as np

  from rl_lm import plots

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  smooth = lambda xs: np.convolve(xs, np.ones(5) / 5, mode="valid")  # noqa: E731
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
  colours = dict(zip(ARMS, ("C0", "C1", "C2", "C3"), strict=True))
  first = min(results["seeds"])
  for seed, runs in results["seeds"].items():
    for arm, points in runs["arms"].items():
      if len(points) < 5:
        continue
      kl, gold = smooth([p["kl"] for p in points]), smooth([p["gold"] for p in points])
      left.plot(kl, gold, "-", color=colours[arm], alpha=0.8, label=arm if seed == first else None)
      if arm == "direct":
        right.plot(kl, smooth([p["proxy"] for p in points]), "--", color="C3", alpha=0.8,
                   label="proxy: the judge's score" if seed == first else None)
        right.plot(kl, gold, "-", color="C0", alpha=0.8, label="gold" if seed == first else None)
  left.set_title("the gold as PPO moves from the SFT policy")
  right.set_title("direct RLAIF: the judge's score and the gold")
  for ax in (left, right):
    ax.set_xlabel("KL to the SFT policy (nats per sequence)")
    ax.set_ylabel("reward (training rollouts, 5-step mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f"PPO on four reward sources, {len(results['seeds'])} seeds")
  plots.save(fig, path)


def main() -> None:
  workdir, seeds, chosen, smoke = arm_args("rlaif", __doc__.splitlines()[0], list(ARMS), "0,1")
  results: dict[str, Any] = {"seeds": {}}
  for seed in seeds:
    base = workdir / f"seed{seed}"
    _run("rlaif.py:judge_smoke" if smoke else "rlaif.py:judge", base / "judge", [f"--config.seed={seed}"])
    judge = base / "judge" / "checkpoints" / "sft"
    stats = measure_judge("smoke" if smoke else None, judge, seed, 64 if smoke else 500, base / "judge.json")
    arms, gold = {}, {}
    for arm in chosen:
      run = base / arm
      judged = [f"--config.judge.init_from={judge}"] if arm in ("ai_labels", "direct") else []
      _run(smoke_variant(ARMS[arm]) if smoke else ARMS[arm], run, [f"--config.seed={seed}", *judged])
      arms[arm], gold[arm] = curves(run), held_out_gold(run)
    results["seeds"][seed] = {"judge": stats, "arms": arms, "held_out_gold": gold}
  (workdir / "rlaif.json").write_text(json.dumps(results, indent=1))
  plot(results, workdir / "rlaif.png")
  runs = list(results["seeds"].values())
  mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
  judge_keys = ("judge/agreement_gold", "judge/first_rate", "judge/flip_rate", "judge/longer_rate",
                "judge/gold_longer_rate")
  print("judge (held-out pairs, per seed): " + "; ".join(
    ", ".join(f"{k.removeprefix('judge/')} {r['judge'][k]:.3f}" for k in judge_keys) for r in runs))
  print("arm | held-out gold after PPO (per seed) | mean | training gold, last steps | proxy, last steps")
  for arm in chosen:
    tail = [p for r in runs for p in r["arms"][arm][-LAST:]]
    per_seed = [r["held_out_gold"][arm] for r in runs]
    print(f"{arm} | {', '.join(f'{g:.3f}' for g in per_seed)} | {mean(per_seed):.3f} | "
          f"{mean([p['gold'] for p in tail]):.3f} | {mean([p['proxy'] for p in tail]):.3f}")


if __name__ == "__main__":
  main()
