"""Multi-digit products, "347*862=": arithmetic the tiny model cannot do in its head, solvable with a calculator.

The task of the calculator environment (rl_lm/envs/calculator.py). Problems are split train/test by a hash of
the expression, as in the arithmetic task. A demonstration is a list of turns, ("policy", text) and
("env", observation): with probability `tool_demos` it calls the calculator and copies its answer,
otherwise it writes the product straight away, as someone who can multiply in their head would. A small model
imitating the second kind guesses; RL against the answer can teach it to prefer the first.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from rl_lm.tasks.base import Problem

TASK_NAME = "products"


def split_of(expr: str, test_fraction: float) -> str:
  h = int.from_bytes(hashlib.sha256(f"rl_lm/products/split:{expr}".encode()).digest()[:8], "big")
  return "test" if h % 1_000_000 < test_fraction * 1_000_000 else "train"


class ProductsTask:
  """a*b with `digits`-digit factors; `tool_demos`: the fraction of demonstrations that use the calculator."""

  name = TASK_NAME

  def __init__(self, digits: int = 3, test_fraction: float = 0.2, tool_demos: float = 0.5, seed: int = 0):
    if digits < 1:
      raise ValueError(f"digits must be >= 1, got {digits}")
    if not 0.0 < test_fraction < 1.0:
      raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not 0.0 <= tool_demos <= 1.0:
      raise ValueError(f"tool_demos must be in [0, 1], got {tool_demos}")
    self.digits, self.test_fraction, self.tool_demos = digits, test_fraction, tool_demos
    self._demo_rng = random.Random(f"rl_lm/products/demos/{seed}")

  def make_problem(self, a: int, b: int) -> Problem:
    expr = f"{a}*{b}"
    return Problem(id="prod-" + hashlib.sha1(expr.encode()).hexdigest()[:16], prompt=f"{expr}=", answer=str(a * b),
                   difficulty=self.digits, task=TASK_NAME, reference=str(a * b), metadata={"expression": expr})

  def _stream(self, split: str, seed: int) -> Iterator[Problem]:
    rng = random.Random(f"rl_lm/products/{split}/{seed}")
    lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
    while True:
      a, b = rng.randint(lo, hi), rng.randint(lo, hi)
      if split_of(f"{a}*{b}", self.test_fraction) == split:
        yield self.make_problem(a, b)

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    stream = self._stream("train", seed)
    for _ in range(n) if n is not None else iter(int, 1):
      yield next(stream)

  def test_problems(self, n: int | None = 200, seed: int = 0) -> list[Problem]:
    out, seen = [], set()
    for p in self._stream("test", seed + 10**6):
      if len(out) >= (200 if n is None else n):
        break
      if p.id not in seen:
        seen.add(p.id)
        out.append(p)
    return out

  def episode_demonstration(self, problem: Problem) -> list[tuple[str, str]]:
    """One demonstration's turns: ("policy", text) and ("env", observation) in order (drawn afresh per call)."""
    if self._demo_rng.random() < self.tool_demos:
      return [("policy", f"[calc({problem.metadata['expression']})]"), ("env", f"{problem.answer}\n"),
              ("policy", problem.answer)]
    return [("policy", problem.answer)]

  def reference_completion(self, problem: Problem) -> str:
    """A single-turn target (the bare answer), for stages that take one."""
    return problem.answer
