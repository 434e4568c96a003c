"""Maths verifier: the answer of a completion (`rl_lm.rewards.answers`) compared with the gold.

Comparison: plain numbers exactly, as fractions, in process. Powers, roots, π, variables and other LaTeX go to
`math-verify` in worker processes (`SymbolicPool`); so do lists and relations ("2a + b = 10"), when the gold is
one too. A closed form that may be too costly to evaluate ("(10^{6})!") never reaches math-verify
(`rl_lm.rewards.cost.too_costly`), unless the gold is one too.

The rules of extraction, refusal and normalisation are in `rl_lm.rewards.answers` (with `answer_text` and
`answer_words`); the symbolic workers and who is blamed when they overrun in `rl_lm.rewards.symbolic`.
"""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rl_lm.rewards.answers import (  # noqa: F401 - the public names of the maths verifier
  MARKERS,
  Answer,
  Extraction,
  MathsConfig,
  extract_answer,
  interpret,
  numbers_match,
)
from rl_lm.rewards.cost import too_costly  # noqa: F401
from rl_lm.rewards.registry import RewardResult, register
from rl_lm.rewards.symbolic import SymbolicPool, overrun_status, shared_pool  # noqa: F401
from rl_lm.tasks import arithmetic
from rl_lm.tasks.base import Problem


def verify_answer(
  gold: str, completion: str, config: MathsConfig | None = None, pool: SymbolicPool | None = None
) -> RewardResult:
  """Scores `completion` against the gold answer text: 1.0 / 0.0 with status "ok" (or "timeout", a valid 0), or a
  verifier fault ("overloaded", "error"; masked)."""
  config = config or MathsConfig()
  ext = extract_answer(completion, config)
  info = {"extracted": ext.text, "method": ext.method}
  if ext.answer is None:
    return RewardResult(0.0, "ok", {**info, "reason": ext.reason})
  pred, want = ext.answer, interpret(gold)
  if want.kind not in ("number", "symbolic", "tuple", "relation"):
    return RewardResult(0.0, "error", {**info, "reason": f"gold answer {gold!r} is not a single answer"})
  if pred.kind == "number" and want.kind == "number":
    ok = numbers_match(want, pred)
    return RewardResult(float(ok), "ok", {**info, "reason": "match" if ok else "mismatch", "path": "exact"})
  if pred.kind == "empty":
    return RewardResult(0.0, "ok", {**info, "reason": pred.reason})
  if pred.kind in ("tuple", "relation") and want.kind != pred.kind:
    return RewardResult(0.0, "ok", {**info, "reason": "several answers"})
  if not config.symbolic:
    return RewardResult(0.0, "ok", {**info, "reason": "symbolic answers disabled"})
  if too_costly(pred.text) and not too_costly(want.text or gold):
    return RewardResult(0.0, "ok", {**info, "reason": "too_complex"})
  pool = pool or shared_pool(config.workers, config.timeout_s, config.cpu_share)
  match, status, detail = pool.compare(want.text or gold, pred.text)
  if status != "ok":
    return RewardResult(0.0, status, {**info, "reason": detail, "path": "symbolic"}, valid=status == "timeout")
  return RewardResult(float(match), "ok", {**info, "reason": "match" if match else "mismatch", "path": "symbolic"})


class MathsReward:
  """The maths verifier as a reward: gold is `problem.answer`."""

  name = "maths"

  def __init__(self, pool: SymbolicPool | None = None, **config: object) -> None:
    self.config = MathsConfig(**config)  # type: ignore[arg-type]
    self.pool = pool

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    try:
      return verify_answer(problem.answer, completion, self.config, self.pool)
    except Exception as e:  # a verifier bug is a verifier fault, not a 0
      return RewardResult(0.0, "error", {"error": f"{type(e).__name__}: {e}"})

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    if self.config.workers <= 1 or len(problems) <= 1:
      return [self(p, c) for p, c in zip(problems, completions, strict=True)]
    with ThreadPoolExecutor(self.config.workers) as ex:  # only the symbolic path leaves this process
      return list(ex.map(self, problems, completions))


register("maths")(MathsReward)


class ArithmeticReward:
  """Exact check of the built-in arithmetic task (`rl_lm.tasks.arithmetic.is_correct`)."""

  name = "arithmetic"

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    got = arithmetic.answer_of(problem, completion)
    return RewardResult(float(got == problem.answer), "ok", {"extracted": got})

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    return [self(p, c) for p, c in zip(problems, completions, strict=True)]


register("arithmetic")(ArithmeticReward)
