"""The InstructGPT recipe on the synthetic preference task, as stages of one command:

  python -m rl_lm.main --config=configs/rlhf_ppo.py --workdir=/tmp/rl_lm/rlhf

  sft           the tiny model imitates mixed-quality demonstrations (rl_lm/tasks/preferences.py)
  reward_model  Bradley-Terry on 4000 labelled pairs over the SFT backbone, centred on SFT samples
  rl            PPO against the learned reward, the KL penalty to the SFT policy in the reward

The gold reward (the task's programmatic score, `preference_gold`) is never trained on: it is
measured beside the proxy at every step (`rollout/gold_mean` next to `rollout/proxy_mean`), and the
held-out evaluation's pass@k counts completions whose gold is at least 0.75. Variants: `smoke`
(seconds, for tests); `adaptive` (Ziegler et al.'s controller instead of a fixed coefficient).
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base_config()
  config.stages = ("sft", "reward_model", "rl")
  config.model.preset = "tiny"
  config.task.name = "preferences"
  config.task.test_fraction = 0.1
  config.task.eval_size = 200
  config.sampling.max_new_tokens = 16  # room past the 8-character target: over-long completions can happen
  config.sampling.temperature = 1.0
  config.sft.steps = 300
  config.sft.max_len = 24
  config.preferences.train_pairs = 4000
  config.preferences.eval_pairs = 500
  config.preferences.max_len = 24
  config.reward_model.steps = 300
  config.reward_model.batch_size = 32
  config.reward_model.learning_rate = 3e-4
  config.reward.weights = ml_collections.ConfigDict({"preference_gold": 1.0})  # the gold, measured only
  config.reward.learned = True
  config.reward.success_threshold = 0.75
  config.rl.algorithm = "ppo"
  config.rl.steps = 60
  config.rl.prompts_per_step = 32
  config.rl.group_size = 2
  config.rl.max_prompt_len = 8
  config.rl.minibatches = 2
  config.rl.epochs = 2
  config.rl.learning_rate = 1e-4
  config.rl.curriculum.enabled = False  # the preference prompts have no difficulty levels
  config.rl.kl.placement = "reward"
  config.rl.kl.estimator = "k1"
  config.rl.kl.coef = 0.2  # strong enough that the gold keeps rising (experiments/overoptimization)
  config.rl.alarms.zero_variance_max = 1.0  # group_size 2 with a continuous reward: the note means nothing
  config.eval.num_samples = 4
  config.eval.every = 20
  if arg == "adaptive":
    config.rl.kl.adaptive = True
    config.rl.kl.target = 0.05
  if arg == "smoke":
    config.model.preset = "test"
    config.sft.steps = 10
    config.sft.log_every = 5
    config.preferences.train_pairs = 256
    config.preferences.eval_pairs = 64
    config.reward_model.steps = 6
    config.reward_model.log_every = 3
    config.reward_model.normalize_samples = 32
    config.rl.steps = 3
    config.rl.prompts_per_step = 8
    config.rl.minibatches = 1
    config.rl.epochs = 1
    config.task.eval_size = 16
    config.eval.every = 0
  elif arg and arg != "adaptive":
    raise ValueError(f"configs/rlhf_ppo.py: unknown variant {arg!r}; known: adaptive, smoke")
  return config
