"""The shared shape of a verifiable problem and of a task that serves problems.

A `Problem` is everything a reward function needs to score one completion: the prompt the policy
sees, the gold answer the verifier checks against, and (in `metadata`) whatever else the verifier
needs (for code: the tests and the entry point). `reference` is a target completion for supervised
warm-start; it is what a perfect policy would write after `prompt`.

Data files are read by `read_jsonl`, which raises `DataError` naming the file and line of anything it
cannot read, so a run stops with one line (`rl_lm.main`) rather than a JSON parser's traceback.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol


class DataError(ValueError):
  """Data a task cannot serve: a file it cannot read as its records (the message names the file, line and
  field), or a split it does not have.

  `user_facing`: `rl_lm.main` reports it as one line, as the user's input, not as a bug.
  """

  user_facing = True


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


def bundled_data_dir() -> Path:
  """The data shipped with the repository (`data/` at its root: GSM8K and HumanEval, with their licences)."""
  return Path(__file__).resolve().parents[2] / "data"


def read_jsonl(path: str | os.PathLike[str], required: Sequence[str] = (), what: str = "records"
               ) -> list[tuple[int, dict[str, Any]]]:
  """The JSON objects of a JSONL file (gzipped when its name ends in ".gz"), each with its line number.

  Returns (line number, record) for each non-blank line; messages name the file as given. Raises DataError
  naming the file and line for a line that is not UTF-8, not JSON or not a JSON object, or that lacks a
  string field of `required`; naming the file for a broken gzip stream, and for a file without records
  ("<file> holds no <what>"). A missing file raises FileNotFoundError.
  """
  out = []
  opener = gzip.open if str(path).endswith(".gz") else open
  with opener(path, "rb") as f:
    try:
      lines = list(f)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError; a truncated stream an EOFError
      raise DataError(f"{path}: not a readable gzip file ({e})") from None
  for lineno, raw in enumerate(lines, 1):
    where = f"{path}:{lineno}"
    try:
      line = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
      raise DataError(f"{where}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
      raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in required:
      if key not in record:
        raise DataError(f"{where}: missing field {key!r} (each line needs {', '.join(map(repr, required))})")
      if not isinstance(record[key], str):
        raise DataError(f"{where}: field {key!r} must be a string, got {type(record[key]).__name__}")
    out.append((lineno, record))
  if not out:
    raise DataError(f"{path} holds no {what}")
  return out
