"""The embedded default: the tiny model learns integer arithmetic on CPU in minutes.

  python -m rl_lm.main --config=configs/default.py --workdir=/tmp/rl_lm/default

Stages: SFT warm start on reference answers, then GRPO with a verifier reward (exact integer),
a curriculum over difficulty levels, truncated importance sampling and the full diagnostics.
Held-out pass@k is measured before and after RL (eval/ JSON and PNG in the workdir).

Variants (`--config=configs/default.py:smoke`): `smoke` shrinks everything to seconds for tests.
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base_config()
  config.stages = ("sft", "rl")
  config.model.preset = "tiny"
  config.task.name = "arithmetic"
  config.task.levels = (1, 2, 3)
  config.sampling.max_new_tokens = 8
  config.sampling.temperature = 1.0
  config.sft.steps = 300
  config.rl.algorithm = "grpo"
  config.rl.steps = 100
  config.rl.prompts_per_step = 32
  config.rl.group_size = 8
  config.rl.max_prompt_len = 16
  config.rl.learning_rate = 1e-3
  config.rl.kl.placement = "loss"
  config.rl.kl.coef = 0.01
  config.eval.num_samples = 16
  config.task.eval_size = 200
  if arg == "smoke":
    config.model.preset = "test"
    config.sft.steps = 20
    config.sft.log_every = 10
    config.rl.steps = 3
    config.rl.prompts_per_step = 8
    config.rl.group_size = 4
    config.task.pool_size = 200
    config.task.eval_size = 16
    config.eval.num_samples = 4
    config.eval.rows = 64
  elif arg:
    raise ValueError(f"configs/default.py: unknown variant {arg!r}; known: smoke")
  return config
