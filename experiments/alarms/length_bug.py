"""configs/default.py with the length-rewarding bug of the alarm set's `fail_length` run: the `length` reward
(characters of the completion) added with weight +1 where a length penalty (a negative weight) was meant.

  python -m rl_lm.main --config=experiments/alarms/length_bug.py --workdir=DIR   (variant `smoke`: seconds)

A new reward name cannot be added with a `--config.reward.weights.<name>` flag (unknown keys are refused), so
the bug lives in its own config file.
"""

from __future__ import annotations

import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = default.get_config(arg)
  config.reward.weights = ml_collections.ConfigDict({"correctness": 1.0, "length": 1.0})
  return config
