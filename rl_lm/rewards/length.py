"""Length reward: the completion's length in characters.

Meant with a negative weight, as a length penalty beside correctness (`{"correctness": 1.0, "length": -0.01}`:
one point per 100 characters). With a positive weight it pays for rambling, which is the length-rewarding bug
experiments/alarms induces on purpose. It is never an infrastructure fault: status "ok", always valid.
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_lm.rewards.registry import RewardResult, register
from rl_lm.tasks.base import Problem


class LengthReward:
  """The number of characters of the completion, as a float."""

  name = "length"

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    del problem
    return RewardResult(float(len(completion)), "ok", {"chars": len(completion)})

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    return [self(p, c) for p, c in zip(problems, completions, strict=True)]


register("length")(LengthReward)
