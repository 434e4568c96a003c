"""Reward-model over-optimisation (Gao et al., 2022) on the synthetic preference task, in one command:

  python -m experiments.overoptimization.run --workdir=/tmp/rl_lm/overopt [--coefs=0.2,0.05,0.01,0.0]
      [--rl_steps=60] [--prompts=200] [--max_n=64] [--seed=0] [--variant=smoke]

1. base: `configs/rlhf_ppo.py` stages sft and reward_model, once (skipped when already complete).
2. best-of-n: for each held-out prompt, 64 completions from the SFT policy; for n = 1, 2, 4, ... 64 the
   completion the reward model scores highest among the first n is kept. Its KL from the SFT policy
   is the analytic log n - (n - 1) / n nats (Stiennon et al. 2020; Gao et al. 2022).
3. PPO: `configs/rlhf_ppo.py` stage rl from the base SFT policy against the base reward model, once per
   KL coefficient; proxy and gold come from each step's rollouts, KL is the sequence-level k1 estimate
   (`policy/kl_ref_seq`, nats per completion), all averaged over windows of steps.
4. `overoptimization.png` (proxy and gold against sqrt(KL), one curve per method) and
   `overoptimization.json` (every point) in the workdir; the table is printed.

Proxy: the reward model's score minus its mean on SFT samples (zero at the reference). Gold: the task's
programmatic score (rl_lm/tasks/preferences.py), which the reward model approximates from noisy pairs.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from rl_lm.runs import ROOT, run_main

CONFIG = str(ROOT / "configs" / "rlhf_ppo.py")


def _main(workdir: Path, *overrides: str, variant: str = "") -> None:
  """Runs `rl_lm.main` on CONFIG[:variant] (rl_lm.runs.run_main: its output goes to <workdir>/log.txt); a
  failure ends the experiment."""
  code, _ = run_main(f"{CONFIG}:{variant}" if variant else CONFIG, workdir,
                     ["--config.logging.wandb_mode=disabled", *overrides])
  if code:
    raise SystemExit(f"overoptimization: rl_lm.main failed with status {code}; see {workdir}/log.txt")


def best_of_n(base: Path, seed: int, prompts: int, max_n: int, variant: str = "") -> list[dict[str, float]]:
  """Proxy and gold of best-of-n selection from the SFT policy, n = 1, 2, 4, ... max_n."""
  import jax

  from configs import rlhf_ppo
  from rl_lm import sampling
  from rl_lm.tasks.preferences import gold_score
  from rl_lm.train import reward_model, stage_run
  from rl_lm.train.context import make_context
  from rl_lm.train.rollout import Sampler
  from rl_lm.train.source import task_from_config

  config = rlhf_ppo.get_config(variant or None)
  config.seed = seed
  ctx = make_context(config, str(base))
  target = stage_run.abstract(jax.eval_shape(lambda: ctx.policy), ctx.param_shardings)
  ctx.policy = stage_run.load_params(str(base / "checkpoints" / "sft"), target)
  rm = reward_model.load(ctx, str(base / "checkpoints" / "reward_model"))
  problems = task_from_config(config).test_problems(prompts, seed=seed)
  tok = ctx.tokenizer
  scfg = sampling.config_from(config.sampling, tok)
  rows = 512
  sampler = Sampler(ctx.model_cfg, scfg, tok, ctx.mesh, ctx.rules, config.rl.max_prompt_len, rows)
  texts_in = [p.prompt for p in problems for _ in range(max_n)]
  out = sampler.sample(ctx.policy, texts_in, jax.random.fold_in(ctx.key, 11))
  proxy = reward_model.score(ctx, rm.params, out["tokens"], out["prompt_mask"] | out["completion_mask"], rows)
  proxy = (proxy - rm.offset).reshape(len(problems), max_n)  # [prompts, max_n]
  gold = np.asarray([gold_score(p, c) for p, c in zip([p for p in problems for _ in range(max_n)], out["texts"],
                                                      strict=True)]).reshape(len(problems), max_n)
  points = []
  n = 1
  while n <= max_n:
    pick = np.argmax(proxy[:, :n], axis=1)
    rows_ = np.arange(len(problems))
    kl = math.log(n) - (n - 1) / n
    points.append({"method": "best-of-n", "n": n, "kl": kl, "proxy": float(proxy[rows_, pick].mean()),
                   "gold": float(gold[rows_, pick].mean())})
    n *= 2
  return points


def ppo_curve(run: Path, window: int) -> list[dict[str, float]]:
  """(KL, proxy, gold) of one PPO run, averaged over windows of `window` steps."""
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if "rollout/proxy_mean" in r]
  points = []
  for start in range(0, len(rows) - window + 1, window):
    chunk = rows[start: start + window]
    mean = {k: float(np.mean([float(r[k]) for r in chunk]))
            for k in ("policy/kl_ref_seq", "rollout/proxy_mean", "rollout/gold_mean")}
    points.append({"step": chunk[-1]["step"], "kl": max(mean["policy/kl_ref_seq"], 0.0),
                   "proxy": mean["rollout/proxy_mean"], "gold": mean["rollout/gold_mean"]})
  return points


def plot(results: dict[str, Any], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
  for name, pts in results["curves"].items():
    x = [math.sqrt(p["kl"]) for p in pts]
    style = "o--" if name == "best-of-n" else "o-"
    axes[0].plot(x, [p["proxy"] for p in pts], style, label=name, ms=3)
    axes[1].plot(x, [p["gold"] for p in pts], style, label=name, ms=3)
  axes[0].set_title("proxy reward (the reward model, centred on SFT)")
  axes[1].set_title("gold reward (the task's programmatic score)")
  for ax in axes:
    ax.set_xlabel("sqrt(KL from the SFT policy), sqrt(nats)")
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=8)
  fig.suptitle("reward-model over-optimisation: PPO at several KL coefficients and best-of-n")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--coefs", default="0.2,0.05,0.01,0.0", help="PPO KL coefficients, comma separated")
  parser.add_argument("--rl_steps", type=int, default=60)
  parser.add_argument("--window", type=int, default=5, help="PPO steps averaged into one point")
  parser.add_argument("--prompts", type=int, default=200, help="held-out prompts for best-of-n")
  parser.add_argument("--max_n", type=int, default=64)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--variant", default="", help="a variant of configs/rlhf_ppo.py (smoke: a quick check)")
  args = parser.parse_args()
  workdir = Path(args.workdir)
  base = workdir / "base"
  print(f"overoptimization: SFT and reward model in {base}", flush=True)
  _main(base, "--config.stages=('sft','reward_model')", f"--config.seed={args.seed}", variant=args.variant)
  results: dict[str, Any] = {"curves": {}, "config": vars(args)}
  print("overoptimization: best-of-n", flush=True)
  results["curves"]["best-of-n"] = best_of_n(base, args.seed, args.prompts, args.max_n, args.variant)
  for coef in [float(c) for c in args.coefs.split(",")]:
    run = workdir / f"ppo_kl{coef:g}"
    print(f"overoptimization: PPO with KL coefficient {coef:g} in {run}", flush=True)
    _main(run, "--config.stages=('rl',)", f"--config.seed={args.seed}", f"--config.rl.kl.coef={coef}",
          f"--config.rl.steps={args.rl_steps}", f"--config.rl.init_from={base / 'checkpoints' / 'sft'}",
          f"--config.reward.model_checkpoint={base / 'checkpoints' / 'reward_model'}", "--config.eval.every=0",
          variant=args.variant)
    results["curves"][f"PPO, KL coef {coef:g}"] = ppo_curve(run, args.window)
  (workdir / "overoptimization.json").write_text(json.dumps(results, indent=1))
  plot(results, workdir / "overoptimization.png")
  print(f"{'method':<22} {'KL (nats)':>10} {'proxy':>8} {'gold':>8}")
  for name, pts in results["curves"].items():
    for p in pts:
      print(f"{name:<22} {p['kl']:>10.3f} {p['proxy']:>8.3f} {p['gold']:>8.3f}")
  print(f"overoptimization: wrote {workdir / 'overoptimization.png'} and overoptimization.json", flush=True)


if __name__ == "__main__":
  main()
