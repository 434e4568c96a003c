"""The embedded default: the tiny model on the built-in task, on CPU, in minutes.

  python -m rl_lm.main --config=configs/default.py --workdir=/tmp/rl_lm/default

Variants (`--config=configs/default.py:smoke`): `smoke` shrinks everything to seconds for tests.
Until the RL loop lands (issue 4) this runs the "sample" stage: the tiny model, randomly
initialised, sampled with the jitted KV-cache sampler.
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
  if arg == "smoke":
    config.model.preset = "test"
    config.sampling.max_new_tokens = 8
    config.sample.num_batches = 1
  elif arg:
    raise ValueError(f"configs/default.py: unknown variant {arg!r}; known: smoke")
  return config
