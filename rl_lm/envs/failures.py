"""Every episode that did not succeed, labelled with whose fault it was.

- task: the policy played by the rules and its answer was wrong (the environment said done, unsolved). It trains
  like any wrong answer: reward as given.
- model: the policy broke the protocol: a malformed tool call (the environment says so in `info["failure"]`), a
  turn cut at its token budget, the episode's token budget or turn limit exhausted, a repetition loop (the same
  turn three times running, or a turn that ends in one short block repeated). Also the policy's doing: trains.
- environment: the environment raised, hung, or its worker died; a reset failed; a tool's own infrastructure
  failed. Not the policy's doing, so the episode is masked from the gradient and counted, never scored 0.

Observations that cannot become tokens (rl_lm/envs/episodes.py `Framing.frame`): not text (a lone surrogate),
refused by the tokenizer (a character outside its alphabet), or oversized. The episode ends there, with the
reason `UNFRAMED`: ..., charged to whoever produced the text (`observation_source`): the first observation is
the environment's own (its reset); a later one is the model's when its step made a tool call (a tool's output
is a function of the policy's input: the program it wrote, the expression it typed; the environment's wording
around that output counts with it), else the environment's. Two exceptions, the environment's whatever the
text: an observation that is not a `str` at all (the interface is broken), and the chat template's renderer
failing (`ChatTemplateError`: it raised, ran out of time or size). So a policy cannot make the trainer raise,
nor raise the environment-failure rate (an alarm, and masked episodes it would not be judged on) by steering a
tool's output; an environment that emits what cannot be framed is found and counted.

Precedence: an environment failure anywhere makes the episode an environment failure (whatever the policy did
before, the episode was cut short by the environment); otherwise a success is a success (the policy recovered
from any mistake of its own); otherwise a model failure, if any, names it; otherwise the task was failed. The
label's reason says what happened.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rl_lm.envs import text as text_lib

OUTCOMES = ("success", "task", "model", "environment")
REPEATS = 3  # the same turn this many times running is a loop
PERIOD_MAX, PERIOD_REPEATS = 16, 4  # a cut turn ending in a block of <= 16 tokens repeated >= 4 times is a loop
UNFRAMED = "unframed observation"  # the reason's prefix when an observation could not become tokens
REASON_CHARS = 300  # a reason is kept for logs and statuses: bounded, and `text.visible`


@dataclasses.dataclass(frozen=True)
class Verdict:
  outcome: str  # one of OUTCOMES
  reason: str = ""

  @property
  def trains(self) -> bool:
    """Whether the episode reaches the gradient (everything but environment failures)."""
    return self.outcome != "environment"


def periodic_tail(tokens: list[int], period_max: int = PERIOD_MAX, repeats: int = PERIOD_REPEATS) -> bool:
  """Whether `tokens` end in some block of at most `period_max` tokens repeated at least `repeats` times."""
  for p in range(1, period_max + 1):
    n = p * repeats
    if len(tokens) >= n and all(tokens[-i] == tokens[-i - p] for i in range(1, n - p + 1)):
      return True
  return False


def observation_source(info: Mapping[str, Any]) -> str:
  """Who produced a step's observation (the module docstring): "model" when the step made a tool call
  (`info["tool_calls"]` > 0), else "environment"."""
  try:
    calls = int(info.get("tool_calls", 0))
  except (TypeError, ValueError):
    calls = 0
  return "model" if calls > 0 else "environment"


def _reason(reason: str) -> str:
  return text_lib.clip(text_lib.visible(str(reason)), REASON_CHARS)


class Tracker:
  """One episode's account, fed by the episode runner as it goes; `verdict()` at the end."""

  def __init__(self) -> None:
    self._env = ""
    self._model = ""
    self._success: bool | None = None
    self._turns: list[str] = []
    self._cut_loop = False
    self.injected = False  # an injected crash or hang reached this episode (for measuring the classifier)

  def environment(self, reason: str) -> None:
    self._env = self._env or _reason(reason)

  def model(self, reason: str) -> None:
    self._model = self._model or _reason(reason)

  def fail(self, verdict: Verdict) -> None:
    """Records a model or environment failure given as a verdict (e.g. `Framing.frame`'s)."""
    if verdict.outcome not in ("model", "environment"):
      raise ValueError(f"Tracker.fail takes a model or environment verdict, got {verdict.outcome!r}")
    (self.model if verdict.outcome == "model" else self.environment)(verdict.reason)

  def turn(self, tokens: list[int], text: str, stopped: bool) -> None:
    self._turns.append(text)
    self._cut_loop = not stopped and periodic_tail(tokens)

  def repeating(self) -> bool:
    """The last REPEATS turns are the same text."""
    return len(self._turns) >= REPEATS and len(set(self._turns[-REPEATS:])) == 1

  def finish(self, success: bool) -> None:
    self._success = bool(success)

  def verdict(self) -> Verdict:
    if self._env:
      return Verdict("environment", self._env)
    if self._success:  # a policy that recovered from its own mistake still solved the task
      return Verdict("success")
    if self._cut_loop:
      return Verdict("model", "repetition loop")
    if self._model:
      return Verdict("model", self._model)
    return Verdict("task", "wrong answer" if self._success is not None else "no verdict")


def precision_recall(predicted: list[bool], actual: list[bool]) -> tuple[float, float]:
  """Precision and recall of `predicted` against `actual` (1.0 where nothing was predicted or nothing was there)."""
  tp = sum(p and a for p, a in zip(predicted, actual, strict=True))
  pp, ap = sum(predicted), sum(actual)
  return (tp / pp if pp else 1.0), (tp / ap if ap else 1.0)
