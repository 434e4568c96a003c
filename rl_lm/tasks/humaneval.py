"""HumanEval: 164 Python function-completion problems, scored by running their tests in the sandbox.

The prompt is the function signature and docstring; a completion is the function body the model
writes after it. The problem's metadata carries what the code verifier needs: "tests" (source
defining `check(candidate)`), "entry_point" (the function's name) and "prompt" (trusted source run
beside the tests, for the helpers some tests call). HumanEval is an evaluation set only: it has no
training split.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from rl_lm.tasks.base import Problem, shared_data_dir

TASK_NAME = "humaneval"


def default_path() -> Path:
  """`../shared/data/humaneval/HumanEval.jsonl.gz` relative to the repository root."""
  return shared_data_dir() / "humaneval" / "HumanEval.jsonl.gz"


def load_humaneval(path: str | Path | None = None) -> list[dict[str, str]]:
  """The raw records (task_id, prompt, canonical_solution, test, entry_point), gzipped or plain JSONL."""
  path = Path(path or default_path())
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def make_problem(record: dict[str, str]) -> Problem:
  """A problem whose gold answer and reference completion are the canonical solution."""
  return Problem(
    id=record["task_id"],
    prompt=record["prompt"],
    answer=record["canonical_solution"],
    task=TASK_NAME,
    reference=record["canonical_solution"],
    metadata={"tests": record["test"], "entry_point": record["entry_point"], "prompt": record["prompt"]},
  )


class HumanEvalTask:
  """The HumanEval problems (test split only)."""

  name = TASK_NAME

  def __init__(self, path: str | Path | None = None) -> None:
    self.path = path
    self._problems: list[Problem] | None = None

  def problems(self) -> list[Problem]:
    """All problems, in file order (cached)."""
    if self._problems is None:
      self._problems = [make_problem(r) for r in load_humaneval(self.path)]
    return self._problems

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    """HumanEval has no training split; training on it would contaminate the evaluation."""
    raise ValueError("HumanEval is an evaluation set: it has no training split")

  def test_problems(self, n: int | None = None, seed: int = 0) -> list[Problem]:
    """The first `n` problems (all when None); `seed` is accepted and unused."""
    del seed
    pool = self.problems()
    return list(pool if n is None else pool[:n])

  def reference_completion(self, problem: Problem) -> str:
    """The canonical solution body."""
    return problem.reference
