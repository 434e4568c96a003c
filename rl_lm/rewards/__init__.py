"""Verifiable rewards: reward functions by name, a maths verifier, a code sandbox, format checks.

Importing the package registers the built-in rewards ("correctness", "arithmetic", "maths", "code",
"format", "length", "preference_gold", "preference_correct", and the LLM judge's "judge" and "judge_pairwise");
see `rl_lm.rewards.registry` for the interface and
`score_batch` for batch scoring.
"""

from __future__ import annotations

from rl_lm.rewards import code, format, judged, length, maths, preference_gold  # noqa: F401 - registers the built-ins
from rl_lm.rewards.registry import (
  REWARDS,
  VERIFIER_FAULTS,
  CompositeReward,
  Reward,
  RewardResult,
  build_reward,
  known_rewards,
  make_reward,
  register,
  score_batch,
)

__all__ = [
  "REWARDS",
  "VERIFIER_FAULTS",
  "CompositeReward",
  "Reward",
  "RewardResult",
  "build_reward",
  "known_rewards",
  "make_reward",
  "register",
  "score_batch",
]
