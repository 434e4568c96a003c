"""The shared shape of a verifiable problem and of a task that serves problems.

A `Problem` is everything a reward function needs to score one completion: the prompt the policy
sees, the gold answer the verifier checks against, and (in `metadata`) whatever else the verifier
needs (for code: the tests and the entry point). `reference` is a target completion for supervised
warm-start; it is what a perfect policy would write after `prompt`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class Problem:
  """One verifiable problem.

  Attributes:
    id: stable, unique identifier (same problem, same id, across runs and machines).
    prompt: the text the policy continues.
    answer: the gold answer, in the form the task's verifier compares against.
    difficulty: task-specific level (arithmetic: 1..N; datasets without levels: 0).
    task: name of the task that made it ("arithmetic", "gsm8k", "humaneval"); reward functions
      dispatch on it.
    reference: a reference completion for SFT warm-start (may be empty).
    metadata: anything else the verifier needs (code: "tests", "entry_point", "prompt").
  """

  id: str
  prompt: str
  answer: str
  difficulty: int = 0
  task: str = ""
  reference: str = ""
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)


class Task(Protocol):
  """What the trainers need of a task."""

  name: str

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    """Training problems; an endless stream when `n` is None and the task is procedural."""
    ...

  def test_problems(self, n: int | None = None, seed: int = 0) -> list[Problem]:
    """Held-out problems, never produced by `train_problems`."""
    ...

  def reference_completion(self, problem: Problem) -> str:
    """The SFT target completion for `problem`."""
    ...


def shared_data_dir() -> Path:
  """The shared data folder, `../shared/data` relative to the repository root (may not exist)."""
  return Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
