"""DPO on the synthetic preference task: the offline path, on the same pairs as configs/rlhf_ppo.py.

  python -m rl_lm.main --config=configs/dpo.py --workdir=/tmp/rl_lm/dpo

  sft  the tiny model imitates mixed-quality demonstrations
  dpo  DPO against the frozen SFT policy on 4000 labelled pairs (no sampling), with the RPO term
       (`dpo.nll_coef`: the chosen responses' per-token NLL) that keeps it from drifting off the data

At the end the stage samples one completion per held-out prompt from the DPO policy and from the SFT
policy (same key) and reports the gold win rate (`dpo_summary.json`). Variants: `ipo` (the IPO loss),
`smoke` (seconds, for tests).
"""

from __future__ import annotations

import ml_collections

from configs import rlhf_ppo


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if arg not in (None, "", "smoke", "ipo"):
    raise ValueError(f"configs/dpo.py: unknown variant {arg!r}; known: ipo, smoke")
  config = rlhf_ppo.get_config("smoke" if arg == "smoke" else None)
  config.stages = ("sft", "dpo")
  config.reward.learned = False
  config.dpo.beta = 0.1
  config.dpo.nll_coef = 1.0  # RPO: without it DPO here pushes the demonstrations' likelihood down and the
  #                            policy drifts to characters the data never show (README: gold win rate 0.08)
  config.dpo.steps = 300
  config.dpo.batch_size = 32
  config.dpo.learning_rate = 1e-4
  if arg == "ipo":
    config.dpo.loss_type = "ipo"
    config.dpo.beta = 0.5
    config.dpo.nll_coef = 0.0
  if arg == "smoke":
    config.dpo.steps = 6
    config.dpo.log_every = 3
    config.dpo.eval_prompts = 16
  return config
