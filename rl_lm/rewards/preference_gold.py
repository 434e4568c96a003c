"""Gold rewards of the synthetic preference task (`rl_lm.tasks.preferences`).

* "preference_gold": the graded gold score itself (max 1.0, unbounded below), status "ok", with its
  parts (relevance, repeats, overlength) and the gold in `info`. It is what an over-optimisation run
  measures next to the learned proxy, and what RL trains on when the gold itself is the objective.
* "preference_correct": 1.0 when the gold score is at least `threshold` (default 0.75), else 0.0.
  "correctness" dispatches task "preferences" here, because everything that reads correctness treats it
  as a verdict: pass@k and the pass rate count completions scoring >= 1, and a graded score there would
  mean "only gold-optimal completions count". 0.75 is "good": six of eight characters on topic with no
  penalty, or better; about 7% of the demonstrations reach it.

A prompt that is not a synthetic preference prompt is a verifier fault (status "error"), never a 0.
"""

from __future__ import annotations

from rl_lm.rewards.registry import FunctionReward, Reward, RewardResult, register
from rl_lm.tasks import preferences
from rl_lm.tasks.base import Problem


def _info(problem: Problem, completion: str) -> dict[str, float]:
  """The gold's parts and the gold itself ("gold", not "score": a composite's info already has a "score")."""
  terms = preferences.gold_terms(problem, completion)
  return {"relevance": terms["relevance"], "repeats": terms["repeats"], "overlength": terms["overlength"],
          "gold": terms["score"]}


def _gold(problem: Problem, completion: str) -> RewardResult:
  info = _info(problem, completion)
  return RewardResult(info["gold"], "ok", info)


@register("preference_gold")
def preference_gold() -> Reward:
  """The graded gold score of the synthetic preference task."""
  return FunctionReward("preference_gold", _gold)


@register("preference_correct")
def preference_correct(threshold: float = 0.75) -> Reward:
  """1.0 when the gold score is at least `threshold`, else 0.0; `info` carries the gold and its parts."""

  def verdict(problem: Problem, completion: str) -> RewardResult:
    info = _info(problem, completion)
    return RewardResult(float(info["gold"] >= threshold), "ok", info)

  return FunctionReward("preference_correct", verdict)
