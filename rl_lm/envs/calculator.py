"""The calculator environment: a problem with an exact answer, and a calculator the policy may call.

Each policy turn is either a call `[calc(expression)]` (rl_lm/envs/tools.py's grammar), answered with the
result and a newline, or the final answer, which ends the episode: reward 1 when it is the gold answer digit for
digit (surrounding whitespace aside), else 0. A malformed call ends the episode as the policy's failure
(reward 0). Tool errors (a division by zero, a bad expression) are observations. Works with any task whose
problems carry an exact `answer` (products, arithmetic).
"""

from __future__ import annotations

import numpy as np

from rl_lm.envs import base, tools
from rl_lm.tasks.base import Problem


@base.register("calculator")
class CalculatorEnv(base.Environment):
  TOOLS = ("calc",)

  def reset(self, problem: Problem, rng: np.random.Generator) -> str:
    del rng
    self.problem = problem
    return problem.prompt

  def step(self, action: str) -> base.Step:
    call = tools.parse(action, self.TOOLS)
    if call.kind == "call":
      result = tools.calculator(call.arguments)
      return base.Step(f"{result.output}\n", 0.0, False, {"tool_calls": 1, "tool_error": result.error})
    if call.kind == "malformed":
      return base.Step("", 0.0, True, {"failure": "model", "reason": f"malformed tool call: {call.malformed}"})
    solved = action.strip() == self.problem.answer
    return base.Step("", float(solved), True, {"success": solved})
