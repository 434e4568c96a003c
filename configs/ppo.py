"""PPO on the built-in arithmetic task: a value model on the policy's backbone, GAE, and the KL
penalty in the reward with the adaptive controller of Ziegler et al. (2019).

  python -m rl_lm.main --config=configs/ppo.py --workdir=/tmp/rl_lm/ppo

Same SFT warm start and held-out pass@k evaluation as configs/default.py. Variant `smoke`: seconds.
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.rl.algorithm = "ppo"
  config.rl.kl.placement = "reward"  # InstructGPT: -coef * KL per token, added to the reward
  config.rl.kl.estimator = "k1"
  config.rl.kl.adaptive = True
  config.rl.kl.coef = 0.05
  config.rl.kl.target = 0.02
  config.rl.kl.horizon = 10000
  config.rl.value.learning_rate = 1e-3
  config.rl.value.gamma = 1.0
  config.rl.value.lam = 0.95
  config.rl.epochs = 2
  return config
