"""The LLM-judge rewards by name: "judge" (pointwise) and "judge_pairwise" (against the problem's reference).

Registered here, apart from rl_lm/rewards/judge.py, so that importing the rewards package (as the sandbox's and
the maths verifier's worker processes do) does not import JAX: the judge's module loads when a judge is built.
Both take the judge model as the option `judge` (`rl_lm.rewards.judge.JudgeModel`, built from `config.judge` by
the rollout source); without one they refuse to build.
"""

from __future__ import annotations

from typing import Any

from rl_lm.rewards.registry import register


def _need(judge: Any, name: str) -> None:
  if judge is None:
    raise ValueError(f"the {name!r} reward needs a judge model: set config.judge.init_from or "
                     "config.judge.hf_checkpoint")


@register("judge")
def make_pointwise_judge(judge: Any = None, rubric: str = "", scale: str = "12345", min_mass: float = 0.5) -> Any:
  """The rubric's expected score in [0, 1] (rl_lm.rewards.judge.PointwiseJudge)."""
  _need(judge, "judge")
  from rl_lm.rewards.judge import PointwiseJudge

  return PointwiseJudge(judge, rubric, scale, min_mass)


@register("judge_pairwise")
def make_pairwise_judge(judge: Any = None, compare: str = "", choices: str = "12", min_mass: float = 0.5) -> Any:
  """P(the completion is better than the reference), both orders averaged (rl_lm.rewards.judge.PairwiseJudge)."""
  _need(judge, "judge_pairwise")
  from rl_lm.rewards.judge import PairwiseJudge

  return PairwiseJudge(judge, compare, choices, min_mass)
