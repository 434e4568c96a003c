"""Worked multi-step arithmetic: SFT then GRPO where responses are long, the tiny model, CPU.

  python -m rl_lm.main --config=configs/worked.py --workdir=/tmp/rl_lm/worked

The task is integer arithmetic at levels 2 and 3 (two operands of up to two digits, or three with "*"),
and the demonstrations write one operation per line before the answer ("7*3=21\\n12+21=33\\n33"), so a
response is 10-20 characters and correct ones vary in length with the problem. The completion budget is
48 tokens: room for a wrong response to run on (repeated or invented working lines), which the exact
verifier, reading only the last line, scores 0 like any other wrong answer. No KL term, no curriculum, no
entropy bonus: the R1-Zero-like setting of Liu et al. (2025), where the loss's length normalisation is the
only thing that treats long and short responses differently.

The RL objective is the original GRPO's: advantages scaled by the group std, each response's token losses
averaged over its own length (`seq-mean-token-mean`). Variant `dr_grpo` is Dr. GRPO: no std scaling, a
constant normaliser (`seq-mean-token-sum-norm`, the budget of 48 tokens). experiments/length_bias
compares the two; experiments/pass_at_k uses this config as its second task. Variant `smoke`: seconds.

Status (measured 2026-12-03, seeds 0-2): not yet a working RL setup. SFT reaches held-out pass@1 0.05-0.11, and
RL at these settings collapses it to 0.00-0.02 under both GRPO and Dr. GRPO (experiments/length_bias/README.md);
it needs retuning (longer SFT, a lower learning rate, the KL leash) before either experiment can use it.
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
  config.task.levels = (2, 3)
  config.task.worked = True
  config.task.test_fraction = 0.1
  config.task.eval_size = 100
  config.sampling.max_new_tokens = 48
  config.sampling.temperature = 1.0
  config.sft.steps = 600
  config.sft.max_len = 40  # bos + "12+34*5=" + two working lines + answer + eos fits in 33
  config.rl.algorithm = "grpo"
  config.rl.loss_mode = "seq-mean-token-mean"  # GRPO as published: each response averaged over its own length
  config.rl.steps = 80
  config.rl.prompts_per_step = 16
  config.rl.group_size = 8
  config.rl.max_prompt_len = 12
  config.rl.minibatches = 4
  config.rl.learning_rate = 3e-4
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
