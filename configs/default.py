"""The embedded default: SFT then GRPO on integer arithmetic, the tiny model, CPU, about 3 minutes.

  python -m rl_lm.main --config=configs/default.py --workdir=/tmp/rl_lm/default

Stages: SFT warm start on demonstrations, then GRPO against the exact verifier, with the
curriculum, truncated importance sampling, KL to the SFT reference and the full diagnostics.
Held-out pass@k (k = 1 ... 16) and greedy accuracy are measured before and after RL (eval/ JSON
and PNG, pass_at_k.png, rl_summary.json in the workdir).

The demonstrations are imperfect, as real ones are: 40% write the answer as a decimal ("7.0"), a
style the exact verifier rejects. SFT imitates the mix; RL against the verifier removes it, which
shows as held-out pass@1 rising towards the greedy accuracy while pass@16 holds (sharpening). With
`--config.task.decimal_demos=0` the SFT model already answers in the verified form and RL on this
task has little to add: the tiny model learns its training prompts but not new arithmetic.

Variants (`--config=configs/default.py:smoke`): `smoke` shrinks everything to seconds for tests.

Sweep (`sweep()` below: RL learning rate x seed, 6 runs, each in DIR/<overrides>, results in DIR/sweep_results.md):

  python -m rl_lm.sweep --config=configs/default.py --workdir=/tmp/rl_lm/sweep --parallel=2
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config
from rl_lm.sweep import grid


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base_config()
  config.stages = ("sft", "rl")
  config.model.preset = "tiny"
  config.task.name = "arithmetic"
  config.task.levels = (1,)  # one-digit addition and subtraction: what the tiny model masters in minutes
  config.task.test_fraction = 0.3  # a hash split: 67 of the 200 expressions are held out
  config.task.decimal_demos = 0.4  # imperfect demonstrations: 40% write "7.0" where the verifier wants "7"
  config.sampling.max_new_tokens = 6  # up to "-198" and eos
  config.sampling.temperature = 1.0
  config.sft.steps = 400
  config.sft.max_len = 16  # bos + "99-99=" + answer + eos fits in 12
  config.rl.algorithm = "grpo"
  config.rl.steps = 80
  config.rl.prompts_per_step = 16
  config.rl.group_size = 8
  config.rl.max_prompt_len = 12
  config.rl.minibatches = 4  # four optimizer steps per batch of 128 episodes
  config.rl.learning_rate = 1e-4
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
    config.rl.minibatches = 1
    config.task.pool_size = 200
    config.task.eval_size = 16
    config.eval.num_samples = 4
    config.eval.rows = 64
  elif arg:
    raise ValueError(f"configs/default.py: unknown variant {arg!r}; known: smoke")
  return config


def sweep(arg: str | None = None) -> list[dict]:
  """RL learning rate x seed around the default (1e-4); the same points for every variant."""
  del arg
  return grid({"rl.learning_rate": (3e-5, 1e-4, 3e-4), "seed": (0, 1)})
