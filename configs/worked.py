"""Worked arithmetic: SFT then GRPO with a long completion budget, the tiny model, CPU, 2.5 minutes (measured alone).

  python -m rl_lm.main --config=configs/worked.py --workdir=/tmp/rl_lm/worked

The task is one-digit addition and subtraction (level 1, as in configs/default.py), and the demonstrations
write the operation out before the answer ("7+5=12\\n12"). As in the default, 40% of them end in a decimal
("12.0") that the exact verifier rejects, so RL has a format to fix. The completion budget is 48 tokens
against correct responses of 7-10: room for a wrong response to run on (repeated or invented working lines),
which the verifier, reading only the last line, scores 0 like any other wrong answer. No KL term, no
curriculum, no entropy bonus: the R1-Zero-like setting of Liu et al. (2025), where the loss's length
normalisation is the only thing that treats long and short responses differently.

The RL objective is the original GRPO's: advantages scaled by the group std, each response's token losses
averaged over its own length (`seq-mean-token-mean`). Variant `dr_grpo` is Dr. GRPO: no std scaling, a
constant normaliser (`seq-mean-token-sum-norm`, the budget of 48 tokens). experiments/length_bias
compares the two; experiments/pass_at_k uses this config as its second task. Variant `smoke`: seconds.

History: levels 2 and 3 (two-digit operands, three with "*") were the first setting. The tiny model reached
held-out pass@1 0.05-0.11 after SFT (0.08 after 1,500 steps), and RL lowered it at learning rate 3e-4
(collapse, 2026-12-03) and at 1e-4 (2026-12-04). On this task (measured 2026-12-04), held-out pass@1 goes
0.262 -> 0.390, 0.322 -> 0.471 and 0.155 -> 0.197 on seeds 0-2 (GRPO), and 0.262 -> 0.360, 0.322 -> 0.450 and
0.155 -> 0.241 (Dr. GRPO).
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config

VARIANTS = ("dr_grpo", "smoke")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if arg and arg not in VARIANTS:
    raise ValueError(f"configs/worked.py: unknown variant {arg!r}; known: {', '.join(VARIANTS)}")
  config = base_config()
  config.stages = ("sft", "rl")
  config.model.preset = "tiny"
  config.task.name = "arithmetic"
  config.task.levels = (1,)  # one-digit addition and subtraction, as in configs/default.py
  config.task.worked = True
  config.task.decimal_demos = 0.4  # imperfect demonstrations, as in configs/default.py: RL has a format to fix
  config.task.test_fraction = 0.3  # a hash split: 67 of the 200 expressions are held out
  config.task.eval_size = 200
  config.sampling.max_new_tokens = 48
  config.sampling.temperature = 1.0
  config.sft.steps = 400
  config.sft.max_len = 24  # bos + "1-9=" + "1-9=-8" + newline + "-8.0" + eos fits in 18
  config.rl.algorithm = "grpo"
  config.rl.loss_mode = "seq-mean-token-mean"  # GRPO as published: each response averaged over its own length
  config.rl.steps = 80
  config.rl.prompts_per_step = 16
  config.rl.group_size = 8
  config.rl.max_prompt_len = 12
  config.rl.minibatches = 4
  config.rl.learning_rate = 1e-4  # 3e-4 collapsed every run (measured 2026-12-03)
  config.rl.kl.placement = "none"
  config.rl.curriculum.enabled = False
  config.eval.num_samples = 16
  if arg == "dr_grpo":
    config.rl.algorithm = "dr_grpo"  # advantages without the group std
    config.rl.loss_mode = "seq-mean-token-sum-norm"  # token sums over a constant: the budget (rl.norm_constant 0)
  if arg == "smoke":
    config.model.preset = "test"
    config.sft.steps = 20
    config.sft.log_every = 10
    config.sampling.max_new_tokens = 16
    config.rl.steps = 3
    config.rl.prompts_per_step = 8
    config.rl.group_size = 4
    config.rl.minibatches = 1
    config.task.pool_size = 200
    config.task.eval_size = 16
    config.eval.num_samples = 4
    config.eval.rows = 64
  return config
