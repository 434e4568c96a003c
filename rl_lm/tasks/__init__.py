"""Tasks: built-in arithmetic (the default), products (for the calculator), GSM8K, HumanEval, synthetic preferences
and the demonstrations of a judge of them (judge_pairs).

Tasks are registered by name in `TASKS` (rl_lm/registry.py), which makes the name a valid `config.task.name`:

  @tasks.register("my_task")
  class MyTask(tasks.Task): ...

`make_task(name, **options)` builds a task by name; every task serves `Problem`s through
`train_problems`, `test_problems` and `reference_completion` (see `rl_lm.tasks.base.Task`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl_lm.registry import Registry
from rl_lm.tasks.arithmetic import ArithmeticTask
from rl_lm.tasks.base import Problem, Task
from rl_lm.tasks.gsm8k import GSM8KTask
from rl_lm.tasks.humaneval import HumanEvalTask
from rl_lm.tasks.judge_pairs import JudgePairs
from rl_lm.tasks.preferences import SyntheticPreferences
from rl_lm.tasks.products import ProductsTask

TASKS: Registry[Callable[..., Task]] = Registry("task")  # name -> the task's class (or a factory), options as kwargs


def register(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
  """Decorator: registers a task class (or factory) under `name`; `make_task(name, **options)` builds it."""
  return TASKS.register(name)


register("arithmetic")(ArithmeticTask)
register("gsm8k")(GSM8KTask)
register("humaneval")(HumanEvalTask)
register("judge_pairs")(JudgePairs)
register("preferences")(SyntheticPreferences)
register("products")(ProductsTask)


def make_task(name: str, **options: Any) -> Task:
  """The task called `name`, built with `options`; raises UnknownNameError (a ValueError) naming the known tasks."""
  return TASKS.get(name)(**options)


__all__ = [
  "ArithmeticTask", "GSM8KTask", "HumanEvalTask", "JudgePairs", "Problem", "ProductsTask", "SyntheticPreferences",
  "Task", "TASKS", "make_task", "register",
]
