"""Reward functions by name, and their weighted composition.

Every reward maps (problem, completion text) to a `RewardResult`: a float score, a status and an info
dict. Masking is by cause. What the completion causes is a verdict on it and scores 0: a wrong or
unreadable answer, a program that fails, crashes, runs out of memory or runs out of its time, an
answer so long or convoluted that checking it overruns. What the infrastructure causes is masked
(`valid` False) and counted, never scored 0: a verifier that crashed or could not start ("error"), a
sandbox that failed ("sandbox_error"), a host so loaded that the check never got its CPU time
("overloaded"). A 0 for a timeout the infrastructure caused would teach the policy to avoid whatever
the broken part touched; a mask for a timeout the program caused would teach it to time out rather
than answer wrong.

Rewards are registered by name in `REWARDS` (rl_lm/registry.py) with `@register(name)` on a factory, which
makes the name a valid key of `config.reward.weights`; `make_reward(name, **options)` builds one and
`build_reward({"correctness": 1.0, "format": 0.1}, options)` builds a weighted sum.
`score_batch` scores many episodes at once: code runs in the sandbox's bounded process pool, the
symbolic maths path in its worker processes.

Built-in names: "correctness" (dispatches on `problem.task` to "arithmetic", "maths" or "code"),
"arithmetic", "maths", "code", "format", "length".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rl_lm.registry import Registry, UnknownNameError
from rl_lm.tasks.base import Problem

#: Statuses of infrastructure faults ("the verifier could not decide"); episodes carrying them are masked.
#: A "timeout" is the completion's own doing (its program or answer overran) and is a valid 0.
VERIFIER_FAULTS = frozenset({"error", "sandbox_error", "overloaded"})


@dataclasses.dataclass(frozen=True)
class RewardResult:
  """The score of one episode.

  Attributes:
    score: the reward (0.0 when not valid; never read as a real 0 then).
    status: maths "ok" | "timeout" | "error" | "overloaded"; code "passed" | "failed" | "syntax_error"
      | "runtime_error" | "timeout" | "memory_limit" | "sandbox_error" | "overloaded"; a composite takes
      its first component's status, or the first invalid component's.
    info: details (extracted answer, reason, sandbox detail, per-component results).
    valid: False when the score must not be trusted (an infrastructure fault); defaults to
      `status not in VERIFIER_FAULTS`, and is always False for a non-finite score.
  """

  score: float
  status: str
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  valid: bool | None = None

  def __post_init__(self) -> None:
    if self.valid is None:
      object.__setattr__(self, "valid", self.status not in VERIFIER_FAULTS)
    if not math.isfinite(self.score):  # a NaN or inf score is a reward bug: masked and counted, never trained on
      object.__setattr__(self, "valid", False)


class Reward(Protocol):
  """A reward function; `batch` may parallelise (the default is a loop)."""

  name: str

  def __call__(self, problem: Problem, completion: str) -> RewardResult: ...

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]: ...


class FunctionReward:
  """Wraps a plain function `fn(problem, completion) -> RewardResult` as a `Reward`."""

  def __init__(self, name: str, fn: Callable[[Problem, str], RewardResult]) -> None:
    self.name, self.fn = name, fn

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    try:
      return self.fn(problem, completion)
    except Exception as e:  # a crashing verifier is a verifier fault, reported as such
      return RewardResult(0.0, "error", {"error": f"{type(e).__name__}: {e}"})

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    return [self(p, c) for p, c in zip(problems, completions, strict=True)]


class UnknownRewardError(UnknownNameError):
  """A reward name nobody registered; the message lists the known ones. `rl_lm.main` reports it as one line."""


REWARDS: Registry[Callable[..., Reward]] = Registry("reward", error=UnknownRewardError)  # name -> factory


def register(name: str) -> Callable[[Callable[..., Reward]], Callable[..., Reward]]:
  """Decorator: registers a reward factory under `name` (the factory takes keyword options)."""
  return REWARDS.register(name)


def known_rewards() -> list[str]:
  """The registered reward names, sorted."""
  return list(REWARDS.names())


def make_reward(name: str, **options: Any) -> Reward:
  """Builds the reward `name`; raises UnknownRewardError (a ValueError) naming the known rewards if none."""
  return REWARDS.get(name)(**options)


class CompositeReward:
  """Weighted sum of rewards; invalid if any component is invalid."""

  name = "composite"

  def __init__(self, components: Mapping[str, tuple[float, Reward]]) -> None:
    if not components:
      raise ValueError("a composite reward needs at least one component")
    self.components = dict(components)

  def _combine(self, parts: Mapping[str, RewardResult]) -> RewardResult:
    score = sum(w * parts[n].score for n, (w, _) in self.components.items())
    invalid = [n for n, r in parts.items() if not r.valid]
    status = parts[invalid[0]].status if invalid else next(iter(parts.values())).status
    info = {
      "components": {n: {**r.info, "score": r.score, "status": r.status, "valid": r.valid} for n, r in parts.items()}
    }
    return RewardResult(0.0 if invalid else float(score), status, info, valid=not invalid)

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    return self._combine({n: r(problem, completion) for n, (_, r) in self.components.items()})

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    columns = {n: r.batch(problems, completions) for n, (_, r) in self.components.items()}
    return [self._combine({n: col[i] for n, col in columns.items()}) for i in range(len(problems))]


def build_reward(
  weights: Mapping[str, float], options: Mapping[str, Mapping[str, Any]] | None = None
) -> CompositeReward:
  """A composite from a config mapping {name: weight}; `options[name]` are that reward's keyword options.

  Example: `build_reward({"correctness": 1.0, "format": 0.1}, {"code": {"workers": 2, "timeout_s": 5}})`.
  "correctness" passes `options` on to the per-task rewards it dispatches to.
  """
  options = options or {}
  unknown = [n for n in weights if n not in REWARDS]
  if unknown:
    raise UnknownRewardError(f"unknown reward(s) {unknown}; known rewards: {', '.join(REWARDS.names())}")
  comps = {}
  for name, w in weights.items():
    opts = dict(options.get(name, {}))
    if name == "correctness":
      opts.setdefault("options", options)
    comps[name] = (float(w), make_reward(name, **opts))
  return CompositeReward(comps)


def score_batch(
  problems: Sequence[Problem],
  completions: Sequence[str],
  reward: Reward | Mapping[str, float] | None = None,
  options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[RewardResult]:
  """Scores episodes; `reward` is a Reward, a {name: weight} mapping, or None for {"correctness": 1}."""
  if len(problems) != len(completions):
    raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
  if reward is None or isinstance(reward, Mapping):
    reward = build_reward(reward or {"correctness": 1.0}, options)
  return reward.batch(problems, completions)


# --- task dispatch -------------------------------------------------------------------------------

#: Which reward checks correctness for each task name.
TASK_VERIFIERS = {"arithmetic": "arithmetic", "gsm8k": "maths", "maths": "maths", "humaneval": "code", "code": "code",
                  "preferences": "preference_correct"}  # gold >= threshold; see rewards/preference_gold.py


class CorrectnessReward:
  """Dispatches each problem to its task's verifier (`TASK_VERIFIERS`), batching per verifier."""

  name = "correctness"

  def __init__(self, options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    self._options = options or {}
    self._rewards: dict[str, Reward] = {}

  def _for(self, problem: Problem) -> Reward:
    name = TASK_VERIFIERS.get(problem.task)
    if name is None:
      raise ValueError(f"no verifier for task {problem.task!r}; known tasks: {sorted(TASK_VERIFIERS)}")
    if name not in self._rewards:
      self._rewards[name] = make_reward(name, **self._options.get(name, {}))
    return self._rewards[name]

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    try:
      reward = self._for(problem)
    except ValueError as e:  # no verifier for this task: a fault, not a 0
      return RewardResult(0.0, "error", {"error": str(e)})
    return reward(problem, completion)

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(problems):
      groups.setdefault(TASK_VERIFIERS.get(p.task, ""), []).append(i)
    out: list[RewardResult | None] = [None] * len(problems)
    for name, idx in groups.items():
      ps, cs = [problems[i] for i in idx], [completions[i] for i in idx]
      scored = self._for(ps[0]).batch(ps, cs) if name else [self(p, c) for p, c in zip(ps, cs, strict=True)]
      for i, r in zip(idx, scored, strict=True):
        out[i] = r
    return out  # type: ignore[return-value]


register("correctness")(CorrectnessReward)
