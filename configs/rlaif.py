"""RLAIF against RLHF on the synthetic preference task, whose gold reward is known (tasks/preferences.py).

The judge is a generative tiny model fine-tuned on a small gold-labelled set of comparisons (1,000 pairs, both
orders: the `judge_pairs` task); its verdict is read from its next-token distribution over "1" and "2"
(rl_lm/rewards/judge.py). Then PPO, the recipe of configs/rlhf_ppo.py, on four reward sources:

  python -m rl_lm.main --config=configs/rlaif.py:judge --workdir=/tmp/rl_lm/rlaif/judge            # the judge
  J=/tmp/rl_lm/rlaif/judge/checkpoints/sft
  python -m rl_lm.main --config=configs/rlaif.py:gold --workdir=DIR      # RM on gold Bradley-Terry labels
  python -m rl_lm.main --config=configs/rlaif.py:noisy --workdir=DIR     # RM on "human" labels, 20% flipped
  python -m rl_lm.main --config=configs/rlaif.py --workdir=DIR --config.judge.init_from=$J   # RM on AI labels
  python -m rl_lm.main --config=configs/rlaif.py:direct --workdir=DIR --config.judge.init_from=$J
      # direct RLAIF: the judge's P(the completion beats the gold-optimal reference) is the reward

Every arm measures the gold beside what it trains on (rollout/gold_mean, the held-out gold_mean); the direct arm's
proxy is the judge's score. experiments/rlaif/run.py runs them all over seeds and tabulates.

Variants: judge, gold, noisy, direct, and each with "_smoke" (seconds, for tests; `smoke` is the AI-label arm).
"""

from __future__ import annotations

import ml_collections

from configs import rlhf_ppo

VARIANTS = ("judge", "gold", "noisy", "direct", "smoke", "judge_smoke", "gold_smoke", "noisy_smoke", "direct_smoke")
COMPARE = "{prompt} 1:{first} 2:{second} better:"  # short: the tiny model's context is small


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if arg not in (None, *VARIANTS):
    raise ValueError(f"configs/rlaif.py: unknown variant {arg!r}; known: {', '.join(VARIANTS)}")
  smoke = bool(arg) and arg.endswith("smoke")
  arm = (arg or "").removesuffix("smoke").removesuffix("_") or "ai_labels"
  config = rlhf_ppo.get_config("smoke" if smoke else None)
  config.judge.compare, config.judge.choices = COMPARE, "12"
  config.judge.param_dtype = "float32"  # a tiny judge: bfloat16 would only blur its verdicts
  config.judge.max_len, config.judge.rows = 64, 64
  config.judge.min_mass = 0.0 if smoke else 0.5  # a 10-step judge has not yet learned to answer "1" or "2"
  if arm == "judge":  # SFT of the judge on gold-labelled comparisons, both orders
    config.stages = ("sft",)
    config.task.name = "judge_pairs"
    config.preferences.train_pairs = 64 if smoke else 1000
    config.sft.max_len = 48
    config.sft.steps = 10 if smoke else 600
    config.sft.log_every = 5 if smoke else 100
  elif arm == "ai_labels":
    config.preferences.labeller = "judge"
  elif arm == "noisy":
    config.preferences.label_noise = 0.2
  elif arm == "direct":  # no reward model: the judge scores every completion; the gold is measured beside it
    config.stages = ("sft", "rl")
    config.reward.learned = False
    config.reward.weights = ml_collections.ConfigDict({"judge_pairwise": 1.0})
    config.reward.gold = ml_collections.ConfigDict({"preference_gold": 1.0})
    config.reward.success_threshold = 0.5  # P(beats the gold-optimal reference) >= 0.5 counts as solved
  return config
