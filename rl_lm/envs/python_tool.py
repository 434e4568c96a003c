"""A maths problem with a Python interpreter: the policy may run programs (in the code sandbox) before answering.

The first observation is the problem's prompt and one line that says how to call the tool (`INSTRUCTION`).
Each policy turn is either a call `[python(program)]` (rl_lm/envs/tools.py's grammar), answered with the
program's standard output (or its error) in the code sandbox, or the final answer, checked by the maths verifier
(rl_lm/rewards/maths.py: the answer extraction that refuses hedged and negated answers): reward 1 or 0, and the
episode ends. A malformed call ends the episode as the policy's failure. The sandbox failing to run a program
at all is the environment's failure (`tools.ToolInfraError` propagates, and the episode is masked). A call's
step reports `tool_calls`, so its observation counts as the policy's output: one the tokenizer cannot take (a
program that prints characters outside the character tokenizer's alphabet) ends the episode as the model's
failure (rl_lm/envs/failures.py), never the run.
"""

from __future__ import annotations

import numpy as np

from rl_lm.envs import base, tools
from rl_lm.rewards import maths
from rl_lm.tasks.base import Problem

_TOOL: tools.PythonTool | None = None  # one sandbox per process (a worker serves many episodes)
INSTRUCTION = ("You can run Python: reply with only [python(your code)] and you will see what it prints. "
               "When you know the answer, reply with it.")


@base.register("python_tool")
class PythonToolEnv(base.Environment):
  TOOLS = ("python",)

  def reset(self, problem: Problem, rng: np.random.Generator) -> str:
    del rng
    self.problem = problem
    return f"{problem.prompt}\n{INSTRUCTION}"

  def step(self, action: str) -> base.Step:
    global _TOOL
    call = tools.parse(action, self.TOOLS)
    if call.kind == "call":
      _TOOL = _TOOL or tools.PythonTool()
      result = _TOOL(call.arguments)
      return base.Step(f"{result.output.rstrip()}\n", 0.0, False, {"tool_calls": 1, "tool_error": result.error})
    if call.kind == "malformed":
      return base.Step("", 0.0, True, {"failure": "model", "reason": f"malformed tool call: {call.malformed}"})
    verdict = maths.verify_answer(self.problem.answer, action)
    if not verdict.valid:
      raise tools.ToolInfraError(f"maths verifier: {verdict.status}")
    return base.Step("", float(verdict.score), True, {"success": verdict.score >= 1.0})
