"""Tasks: built-in arithmetic (the default), products (for the calculator), GSM8K, HumanEval, synthetic preferences.

`make_task(name, **options)` builds a task by name; every task serves `Problem`s through
`train_problems`, `test_problems` and `reference_completion` (see `rl_lm.tasks.base.Task`).
"""

from __future__ import annotations

from typing import Any

from rl_lm.tasks.arithmetic import ArithmeticTask
from rl_lm.tasks.base import Problem, Task
from rl_lm.tasks.gsm8k import GSM8KTask
from rl_lm.tasks.humaneval import HumanEvalTask
from rl_lm.tasks.preferences import SyntheticPreferences
from rl_lm.tasks.products import ProductsTask

TASKS = {
  "arithmetic": ArithmeticTask, "gsm8k": GSM8KTask, "humaneval": HumanEvalTask, "preferences": SyntheticPreferences,
  "products": ProductsTask,
}


def make_task(name: str, **options: Any) -> Task:
  """The task called `name`, built with `options`; raises ValueError naming the known tasks."""
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
  return TASKS[name](**options)


__all__ = [
  "ArithmeticTask", "GSM8KTask", "HumanEvalTask", "Problem", "ProductsTask", "SyntheticPreferences", "Task", "TASKS",
  "make_task",
]
