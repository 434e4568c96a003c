"""HumanEval: 164 Python function-completion problems, scored by running their tests in the sandbox.

The prompt is the function signature and docstring; a completion is the function body the model
writes after it. The problem's metadata carries what the code verifier needs: "tests" (source
defining `check(candidate)`), "entry_point" (the function's name) and "prompt" (trusted source run
beside the tests, for the helpers some tests call). HumanEval is an evaluation set only: it has no
training split.

A file that cannot be read (malformed JSON, a missing field, no records) raises `DataError` naming the
file and line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rl_lm.tasks.base import DataError, Problem, bundled_data_dir, read_jsonl

TASK_NAME = "humaneval"
FILE_NAMES = ("HumanEval.jsonl.gz", "HumanEval.jsonl")  # looked for, in this order, in a data folder
FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def default_path() -> Path:
  """`data/humaneval/HumanEval.jsonl.gz` in the repository (shipped with it)."""
  return bundled_data_dir() / "humaneval" / FILE_NAMES[0]


def path_in(data_dir: str | Path) -> Path:
  """The HumanEval file of a data folder (`FILE_NAMES`); FileNotFoundError naming both when it has neither."""
  for name in FILE_NAMES:
    if (Path(data_dir) / name).exists():
      return Path(data_dir) / name
  raise FileNotFoundError(f"no HumanEval file in {data_dir} (looked for {' and '.join(FILE_NAMES)})")


def load_humaneval(path: str | Path | None = None) -> list[dict[str, str]]:
  """The raw records (task_id, prompt, canonical_solution, test, entry_point), gzipped or plain JSONL."""
  return [record for _, record in read_jsonl(path or default_path(), required=FIELDS, what="problems")]


# A chat model is asked for the whole function in a fenced block (rl_lm.rewards.code.build_program runs such a
# block after the prompt's imports and helpers); a plain prompt is the code itself, to be continued.
CHAT_PROMPT = ("Complete the following Python function. Reply with the complete function, including its "
               "signature, in a single ```python code block.\n\n```python\n{prompt}```")


def make_problem(record: dict[str, str], template: str = "plain") -> Problem:
  """A problem whose gold answer and reference completion are the canonical solution; `template`: "plain" (the
  prompt is the code) or "chat" (a request for the function, for a chat template's user turn)."""
  if template not in ("plain", "chat"):
    raise ValueError(f"template must be 'plain' or 'chat', got {template!r}")
  return Problem(
    id=record["task_id"],
    prompt=record["prompt"] if template == "plain" else CHAT_PROMPT.format(prompt=record["prompt"]),
    answer=record["canonical_solution"],
    task=TASK_NAME,
    reference=record["canonical_solution"],
    metadata={"tests": record["test"], "entry_point": record["entry_point"], "prompt": record["prompt"]},
  )


class HumanEvalTask:
  """The HumanEval problems (test split only)."""

  name = TASK_NAME

  def __init__(self, path: str | Path | None = None, data_dir: str | Path | None = None, template: str = "plain"
               ) -> None:
    """`path`: the JSONL file (gzipped or not); else `data_dir`'s file (`FILE_NAMES`); else `default_path()`.
    `template`: see `make_problem`."""
    self.path = path if path or not data_dir else path_in(data_dir)
    self.template = template
    self._problems: list[Problem] | None = None

  def problems(self) -> list[Problem]:
    """All problems, in file order (cached)."""
    if self._problems is None:
      self._problems = [make_problem(r, self.template) for r in load_humaneval(self.path)]
    return self._problems

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    """HumanEval has no training split; training on it would contaminate the evaluation."""
    self.problems()  # a broken file is the first thing to report
    raise DataError("HumanEval is an evaluation set: it has no training split (train on another task)")

  def test_problems(self, n: int | None = None, seed: int = 0) -> list[Problem]:
    """The first `n` problems (all when None); `seed` is accepted and unused."""
    del seed
    pool = self.problems()
    return list(pool if n is None else pool[:n])

  def reference_completion(self, problem: Problem) -> str:
    """The canonical solution body."""
    return problem.reference
