"""Pod-scale recipes for `python -m rl_lm.aot`: a real model, a realistic RL batch, three recipes.

  python -m rl_lm.aot --config=configs/pod.py:model=llama-3.1-8b,recipe=grpo --topology=v5p-64 \\
      --config.mesh.data=4 --config.mesh.fsdp=1 --config.mesh.tensor=8

Nothing here runs on this CPU: the models are the released shapes (`rl_lm/models/presets.py`), compiled for a
TPU slice without weights. The batch is 64 GSM8K prompts x 8 samples = 512 rows of 256 prompt + 768 new tokens,
bfloat16 compute over float32 weights, as `configs/gsm8k_qwen.py` trains. The character tokenizer stands in for
the checkpoint's (the tool needs only the vocabulary size, which is the preset's).

The argument is `key=value` pairs:
  model=<preset>    qwen2.5-0.5b (default), qwen2.5-1.5b, qwen2.5-7b, llama-3.1-8b, qwen2.5-32b, llama-3.1-70b, ...
  recipe=grpo       policy + reference (full fine-tune): GRPO, clip-higher, token-mean, KL in the loss
  recipe=lora       the same with LoRA rank 16 on every projection: the frozen base is the reference
  recipe=ppo        policy, reference, value model and a Bradley-Terry reward model on one mesh: the reward model
                    stage (on the preference task's pairs, as configs/rlhf_ppo.py), then PPO on its scores with
                    GAE and the KL in the reward
`experiments/pod_scale/run.py` compiles the grid of models x slices x recipes and writes the README's table.

On a slice, `python -m rl_lm.main --config=configs/pod.py:model=llama-3.1-8b,recipe=grpo` runs these shapes from
random weights: a throughput check of the estimates. To train the released model, add its checkpoint and tokenizer
(`--config.model.hf_checkpoint=<folder> --config.tokenizer=hf`, as configs/gsm8k_qwen.py does).
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config
from rl_lm.models import presets

RECIPES = ("grpo", "lora", "ppo")


def _parse(arg: str | None) -> dict[str, str]:
  out = {"model": "qwen2.5-0.5b", "recipe": "grpo"}
  for part in (arg or "").split(","):
    if not part:
      continue
    key, sep, value = part.partition("=")
    if not sep or key not in out:
      raise ValueError(f"configs/pod.py: argument {part!r}: expected model=<preset> or recipe=<{'|'.join(RECIPES)}>")
    out[key] = value
  if out["recipe"] not in RECIPES:
    raise ValueError(f"configs/pod.py: recipe={out['recipe']!r}: expected one of {', '.join(RECIPES)}")
  return out


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options = _parse(arg)
  config = base_config()
  config.stages = ("rl",)
  config.model.preset = options["model"]
  config.model.dtype = "bfloat16"
  config.model.remat = True
  config.model.logit_chunk = 128
  config.tokenizer = "char"
  config.mesh.data = 1
  config.mesh.fsdp = -1
  config.task.name = "gsm8k"
  config.task.template = "plain"
  config.sampling.max_new_tokens = 768
  config.sampling.temperature = 1.0
  config.rl.algorithm = "grpo"
  config.rl.prompts_per_step = 64
  config.rl.group_size = 8
  config.rl.max_prompt_len = 256
  config.rl.minibatches = 4
  config.rl.grad_accum = 2
  config.rl.prepare_chunks = 8  # prepare scores 64 rows at a time, as the update trains on them
  config.rl.learning_rate = 1e-6
  config.rl.clip_high = 0.28
  config.rl.loss_mode = "token-mean"
  config.rl.kl.coef = 0.001
  config.rl.sampler_dtype = "bfloat16"
  # Under 3B parameters the weights are FSDP-sharded (experiments/pod_scale/run.py), and a decode step would
  # all-gather every one of them for every token: the sampler gathers them once a rollout instead (README, "At pod
  # scale"). Bigger models take tensor parallelism, where there is nothing to gather.
  config.rl.sampler_gather = presets.get(options["model"]).num_params() < 3e9
  config.eval.rows = 256
  if options["recipe"] == "lora":
    config.model.lora.rank = 16
    config.rl.learning_rate = 1e-5
  elif options["recipe"] == "ppo":
    config.stages = ("reward_model", "rl")
    config.task.name = "preferences"  # the pairs the reward model learns from, as configs/rlhf_ppo.py
    config.reward.learned = True
    config.reward_model.batch_size = 64  # pairs of 1,024 tokens per step
    config.preferences.max_len = 1024
    config.rl.algorithm = "ppo"
    config.rl.kl.placement = "reward"
    config.rl.kl.estimator = "k1"
    config.rl.kl.coef = 0.05
  return config
