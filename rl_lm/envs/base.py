"""The environment interface: what a multi-turn task implements, in one file, to train through the RL loop.

  from rl_lm.envs import base

  @base.register("my_env")                           # selected by config.env.name (base.ENVIRONMENTS)
  class MyEnv(base.Environment):                     # one instance per episode
    def reset(self, problem, rng) -> str: ...        # the first observation (the prompt the policy sees first)
    def step(self, action: str) -> base.Step: ...    # the policy's turn as text -> what it sees next

Text crosses only this boundary. The rollout (rl_lm/envs/episodes.py) keeps one token array per episode: the
policy's sampled tokens (trained on, with the sampler's log-probs) and the observations' tokens (never trained
on), appended as tokens and framed by the checkpoint's chat template; what the policy emitted is never
re-tokenised.

`Step.info` may carry, besides anything the environment wants logged:
- "success": bool, the episode solved its task (default: reward > 0 when done);
- "failure": "model" when the policy broke the protocol (a malformed tool call), with "reason";
- "tool_calls": int, tool calls this step made; its observation then counts as the policy's output: one that
  cannot be framed is the model's failure (rl_lm/envs/failures.py).
An environment that raises, hangs or whose worker dies is an environment failure (rl_lm/envs/failures.py):
masked from the gradient and counted, never scored 0. An environment must not raise for the policy's mistakes:
those are observations (or a "failure": "model" step), since only the environment's own faults are masked.

`rng` in `reset` is a `numpy.random.Generator` seeded from the run's seed, the step and the episode, so an
environment that draws (a tool's noise, a task variant) repeats itself on resume.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from rl_lm.registry import Registry
from rl_lm.tasks.base import Problem


@dataclasses.dataclass(frozen=True)
class Step:
  """An environment's answer to one action."""

  observation: str  # what the policy reads next ("" when done)
  reward: float  # added to the episode's return
  done: bool  # the episode is over
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Environment:
  """One episode of a multi-turn task. Subclasses implement `reset` and `step`; `close` frees resources."""

  def reset(self, problem: Problem, rng: np.random.Generator) -> str:
    raise NotImplementedError

  def step(self, action: str) -> Step:
    raise NotImplementedError

  def close(self) -> None:
    """Called once when the episode ends, however it ends."""


def _builtins() -> None:
  importlib.import_module("rl_lm.envs.calculator")  # registers "calculator"
  importlib.import_module("rl_lm.envs.python_tool")  # registers "python_tool"


#: name -> (module, qualname) of the class, importable in a worker process; the built-ins load at the first lookup.
ENVIRONMENTS: Registry[tuple[str, str]] = Registry("environment", load=_builtins)


def register(name: str) -> Callable[[type[Environment]], type[Environment]]:
  """Class decorator: `config.env.name = name` runs episodes of this environment. The class must be importable
  by its module path (defined at a module's top level), since workers build it in their own processes."""

  def wrap(cls: type[Environment]) -> type[Environment]:
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
      raise TypeError(f"register({name!r}) takes an Environment subclass, got {cls!r}")
    ENVIRONMENTS.add(name, (cls.__module__, cls.__qualname__))
    return cls

  return wrap


def names() -> list[str]:
  """The registered environment names (the built-in ones included), sorted."""
  return list(ENVIRONMENTS.names())


def locate(name: str) -> tuple[str, str]:
  """(module, attribute) of a registered environment, to build it in another process; an unknown name raises
  rl_lm.registry.UnknownNameError (a KeyError and a ValueError) naming the known ones."""
  return ENVIRONMENTS.get(name)


def build(where: tuple[str, str]) -> Environment:
  """A fresh environment from its (module, attribute), importing the module if this process has not yet."""
  module, attribute = where
  obj: Any = importlib.import_module(module)
  for part in attribute.split("."):
    obj = getattr(obj, part)
  return obj()
