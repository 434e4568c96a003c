"""GRPO on GSM8K from Qwen2.5-0.5B-Instruct, loaded from a Hugging Face directory with `hf.load`.

  python -m rl_lm.main --config=configs/gsm8k_qwen.py --workdir=/tmp/rl_lm/gsm8k \\
      --config.model.hf_checkpoint=/path/to/Qwen2.5-0.5B-Instruct

Sized for one GPU (about 80 GB) or a TPU slice: bfloat16 compute, parameters sharded over an fsdp
axis that takes every device, 64 prompts x 8 samples per step. The data are the GSM8K JSONL files
(`config.task.data_dir`, default data/gsm8k in the repository) or the TFDS builder where its data exist.

Variant `tiny` runs here on CPU in a couple of minutes: a random `tiny` model with the character
tokenizer on the GSM8K prompts that fit its 256-token window. It checks the plumbing (data,
verifier, sampler, loop, evaluation); a random model solves nothing, so expect pass rates of 0.
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base_config()
  config.stages = ("rl",)
  config.model.preset = "qwen2.5-0.5b"
  config.model.hf_checkpoint = ""  # required: a directory with config.json, *.safetensors, tokenizer.json
  config.model.dtype = "bfloat16"
  config.model.remat = True
  config.tokenizer = "hf"
  config.mesh.data = 1
  config.mesh.fsdp = -1
  config.task.name = "gsm8k"
  config.task.template = "chat"
  config.task.eval_size = 500
  config.task.pool_size = 7473
  config.sampling.max_new_tokens = 512
  config.sampling.temperature = 1.0
  config.rl.algorithm = "grpo"
  config.rl.steps = 500
  config.rl.prompts_per_step = 64
  config.rl.group_size = 8
  config.rl.max_prompt_len = 256
  config.rl.minibatches = 4
  config.rl.grad_accum = 4
  config.rl.learning_rate = 1e-6
  config.rl.warmup_steps = 10
  config.rl.clip_high = 0.28  # clip-higher (DAPO)
  config.rl.loss_mode = "token-mean"
  config.rl.kl.coef = 0.001
  config.rl.sampler_dtype = "bfloat16"
  config.rl.overlong = "penalty"
  config.rl.overlong_buffer = 64
  config.rl.curriculum.initial_levels = 1
  config.eval.every = 50
  config.eval.num_samples = 8
  config.eval.rows = 256
  if arg == "tiny":
    config.model.preset = "tiny"
    config.model.dtype = "float32"
    config.model.remat = False
    config.tokenizer = "char"
    config.mesh.data = -1
    config.mesh.fsdp = 1
    config.task.template = "plain"
    config.task.pool_size = 256
    config.task.eval_size = 64
    config.sampling.max_new_tokens = 32
    config.rl.max_prompt_len = 220
    config.rl.steps = 2
    config.rl.prompts_per_step = 4
    config.rl.group_size = 4
    config.rl.minibatches = 1
    config.rl.grad_accum = 1
    config.rl.learning_rate = 1e-4
    config.rl.overlong_buffer = 8
    config.rl.sampler_dtype = ""
    config.eval.every = 0
    config.eval.num_samples = 2
    config.eval.rows = 32
  elif arg:
    raise ValueError(f"configs/gsm8k_qwen.py: unknown variant {arg!r}; known: tiny")
  return config
