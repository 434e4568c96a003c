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

Built on configs/default.py: only the worked demonstrations, the budget, the loss and the absent KL differ.

History: levels 2 and 3 (two-digit operands, three with "*") were the first setting. The tiny model reached
held-out pass@1 0.05-0.11 after SFT (0.08 after 1,500 steps), and RL lowered it at learning rate 3e-4
(collapse, 2026-12-03) and at 1e-4 (2026-12-04). On this task (measured 2026-12-04), held-out pass@1 goes
0.262 -> 0.390, 0.322 -> 0.471 and 0.155 -> 0.197 on seeds 0-2 (GRPO), and 0.262 -> 0.360, 0.322 -> 0.450 and
0.155 -> 0.241 (Dr. GRPO).
"""

from __future__ import annotations

import ml_collections

from configs import default

VARIANTS = ("dr_grpo", "smoke")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if arg and arg not in VARIANTS:
    raise ValueError(f"configs/worked.py: unknown variant {arg!r}; known: {', '.join(VARIANTS)}")
  # configs/default.py's task (level 1, 40% decimal demonstrations, 67 held out), model, SFT, RL batch, learning
  # rate (1e-4; 3e-4 collapsed every run on levels 2-3) and evaluation; its smoke variant for ours.
  config = default.get_config("smoke" if arg == "smoke" else None)
  config.task.worked = True
  config.sampling.max_new_tokens = 16 if arg == "smoke" else 48
  config.sft.max_len = 24  # bos + "1-9=" + "1-9=-8" + newline + "-8.0" + eos fits in 17
  config.rl.loss_mode = "seq-mean-token-mean"  # GRPO as published: each response averaged over its own length
  config.rl.kl.placement = "none"  # no KL term, no curriculum: the R1-Zero-like setting
  config.rl.curriculum.enabled = False
  if arg == "dr_grpo":
    config.rl.algorithm = "dr_grpo"  # advantages without the group std
    config.rl.loss_mode = "seq-mean-token-sum-norm"  # token sums over a constant: the budget (rl.norm_constant 0)
  return config
