"""Sample from a model with the jitted KV-cache sampler: a random preset or a Hugging Face checkpoint.

  python -m rl_lm.main --config=configs/sample.py --workdir=/tmp/rl_lm/sample
  python -m rl_lm.main --config=configs/sample.py:hf --workdir=/tmp/rl_lm/sample \\
      --config.model.hf_checkpoint=/path/to/Qwen2.5-0.5B-Instruct

Prints the completions and the decode throughput, writes samples.jsonl. Variant `smoke`: seconds.
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base_config()
  config.stages = ("sample",)
  config.model.preset = "tiny"
  config.sampling.max_new_tokens = 32
  config.sample.batch_size = 8
  config.sample.num_batches = 3
  if arg == "hf":
    config.tokenizer = "hf"
  elif arg == "smoke":
    config.model.preset = "test"
    config.sampling.max_new_tokens = 8
    config.sample.num_batches = 1
  elif arg:
    raise ValueError(f"configs/sample.py: unknown variant {arg!r}; known: hf, smoke")
  return config
