"""Every episode that did not succeed, labelled with whose fault it was.

- task: the policy played by the rules and its answer was wrong (the environment said done, unsolved). It trains
  like any wrong answer: reward as given.
- model: the policy broke the protocol: a malformed tool call (the environment says so in `info["failure"]`), a
  turn cut at its token budget, the episode's token budget or turn limit exhausted, a repetition loop (the same
  turn three times running, or a turn that ends in one short block repeated). Also the policy's doing: trains.
- environment: the environment raised, hung, or its worker died; a reset failed; a tool's own infrastructure
  failed. Not the policy's doing, so the episode is masked from the gradient and counted, never scored 0.

Precedence: an environment failure anywhere makes the episode an environment failure (whatever the policy did
before, the episode was cut short by the environment); otherwise a success is a success (the policy recovered
from any mistake of its own); otherwise a model failure, if any, names it; otherwise the task was failed. The
label's reason says what happened.
"""

from __future__ import annotations

import dataclasses

OUTCOMES = ("success", "task", "model", "environment")
REPEATS = 3  # the same turn this many times running is a loop
PERIOD_MAX, PERIOD_REPEATS = 16, 4  # a cut turn ending in a block of <= 16 tokens repeated >= 4 times is a loop


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
    self._env = self._env or reason

  def model(self, reason: str) -> None:
    self._model = self._model or reason

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
