"""Format rewards: does the completion have the shape the task's verifier reads?

Scores 1.0 or 0.0 with status "ok"; meant as a small shaping term beside correctness
(e.g. `{"correctness": 1.0, "format": 0.1}`), and never enough to pay for a wrong answer.

* arithmetic: the last line is a canonical integer (`rl_lm.tasks.arithmetic.parse_completion`);
* gsm8k / maths: exactly one "####" line, it is the last non-empty line, and it holds one number;
* humaneval / code: the program (prompt + completion) compiles.
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_lm.rewards.code import build_program
from rl_lm.rewards.maths import interpret
from rl_lm.rewards.registry import RewardResult, register
from rl_lm.tasks import arithmetic
from rl_lm.tasks.base import Problem


def maths_format_ok(completion: str) -> bool:
  """Exactly one "####", on the last non-empty line, followed by a single number."""
  lines = [line for line in completion.strip().splitlines() if line.strip()]
  if completion.count("####") != 1 or not lines or not lines[-1].lstrip().startswith("####"):
    return False
  return interpret(lines[-1].split("####", 1)[1]).kind == "number"


def code_format_ok(problem: Problem, completion: str) -> bool:
  """The program built from the completion compiles (it is never run here)."""
  try:
    compile(build_program(problem, completion), "<candidate>", "exec", dont_inherit=True)
  except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
    return False
  return True


class FormatReward:
  """1.0 when the completion has the task's answer format (dispatch on `problem.task`)."""

  name = "format"

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    if problem.task == arithmetic.TASK_NAME:
      ok = arithmetic.answer_of(problem, completion) is not None
    elif problem.task in ("gsm8k", "maths"):
      ok = maths_format_ok(completion)
    elif problem.task in ("humaneval", "code"):
      ok = code_format_ok(problem, completion)
    else:
      return RewardResult(0.0, "error", {"error": f"no format rule for task {problem.task!r}"})
    return RewardResult(float(ok), "ok", {})

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    return [self(p, c) for p, c in zip(problems, completions, strict=True)]


register("format")(FormatReward)
