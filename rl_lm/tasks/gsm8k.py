"""GSM8K grade-school maths word problems, loaded from JSONL or from the TFDS `gsm8k` builder.

Each record is {"question", "answer"}; the answer is a worked solution ending in "#### <number>",
and the gold answer is that number with thousands separators removed ("1,600" -> "1600").
The worked solution (with the "<<48/2=24>>" calculator annotations removed by default) is the
reference completion for SFT warm-start; it ends with the "#### <number>" line the maths verifier
reads first.

Prompt templates are selected by name in config (`TEMPLATES`: "plain", "chat") or given as a custom
string containing "{question}". "chat" is the question and the answer-format instruction as the text of
one user turn: the tokenizer frames it with the checkpoint's own chat template (rl_lm/chat.py), so no
model's turn markers are written here. The reference completion is the template's `target_prefix`
followed by the solution.

A JSONL file that cannot be read (malformed JSON, a missing field, an answer without "####", no
records at all) raises `DataError` naming the file and line.

`ascii_text=True` maps the few non-ASCII characters of GSM8K (curly quotes, dashes, "×", "€", ...) to
ASCII so that the text is encodable by the character tokenizer.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rl_lm.tasks.base import DataError, Problem, bundled_data_dir, read_jsonl

TASK_NAME = "gsm8k"
_ANNOTATION_RE = re.compile(r"<<[^<>]*>>")
_ASCII = {
  "\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-", "\u2212": "-",
  "\u00d7": "x", "\u00f7": "/", "\u20ac": "EUR ", "\u00a3": "GBP ", "\u00a2": " cents", "\u00a0": " ", "\u200b": "",
  "\u2028": "\n", "\t": " ", "\u00b3": "^3", "\u00b2": "^2", "\u00bd": "1/2", "\u00bc": "1/4", "\u00be": "3/4",
  "\u221a": "sqrt", "\u00e9": "e", "\u00e8": "e", "\u00f1": "n", "\u00e7": "c",
}


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
  """A prompt format: `prompt` contains "{question}"; the reference completion starts with `target_prefix`."""

  prompt: str
  target_prefix: str = ""


_INSTRUCTION = "Solve the problem step by step. Write the final answer as a number on the last line, after '####'."
TEMPLATES: dict[str, PromptTemplate] = {
  "plain": PromptTemplate("Question: {question}\nAnswer:", " "),
  "chat": PromptTemplate("{question}\n" + _INSTRUCTION),  # a user turn, framed by the tokenizer's chat template
}


def get_template(template: str | PromptTemplate) -> PromptTemplate:
  """A template by name, or a custom prompt string containing "{question}"."""
  if isinstance(template, PromptTemplate):
    return template
  if template in TEMPLATES:
    return TEMPLATES[template]
  if "{question}" in template:
    return PromptTemplate(template)
  raise ValueError(f"unknown GSM8K template {template!r}; known: {sorted(TEMPLATES)} or a string with '{{question}}'")


def to_ascii(text: str) -> str:
  """Maps GSM8K's non-ASCII characters to ASCII look-alikes and drops any that remain."""
  text = "".join(_ASCII.get(c, c) for c in text)
  return "".join(c for c in text if c == "\n" or 32 <= ord(c) < 127)


def gold_answer(solution: str) -> str:
  """The number after the last "####" of a GSM8K solution, without thousands separators."""
  if "####" not in solution:
    raise ValueError(f"GSM8K solution has no '####': {solution[-80:]!r}")
  return solution.rsplit("####", 1)[1].strip().replace(",", "")


def strip_annotations(solution: str) -> str:
  """Removes calculator annotations: "48/2 = <<48/2=24>>24" -> "48/2 = 24"."""
  return _ANNOTATION_RE.sub("", solution)


# --- loading -------------------------------------------------------------------------------------


def default_data_dir() -> Path:
  """`data/gsm8k` in the repository (shipped with it)."""
  return bundled_data_dir() / "gsm8k"


def _load_jsonl(path: Path) -> list[dict[str, str]]:
  records = read_jsonl(path, required=("question", "answer"), what="problems")
  for lineno, record in records:
    if "####" not in record["answer"]:
      raise DataError(f"{path}:{lineno}: field 'answer' has no '#### <number>' final answer")
  return [record for _, record in records]


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _load_tfds(split: str, data_dir: str | None) -> list[dict[str, str]]:
  """Reads a prepared TFDS `gsm8k` split without downloading (random-access source, else tf.data)."""
  import tensorflow_datasets as tfds  # optional: only this path needs it

  try:
    source = tfds.data_source("gsm8k", split=split, data_dir=data_dir, download=False)
    rows = [source[i] for i in range(len(source))]
  except Exception:  # older builds stored as TFRecord: fall back to tf.data (needs TensorFlow)
    rows = list(tfds.as_numpy(tfds.load("gsm8k", split=split, data_dir=data_dir, download=False)))
  return [{"question": _text(r["question"]), "answer": _text(r["answer"])} for r in rows]


def load_gsm8k(split: str = "test", source: str = "auto", data_dir: str | Path | None = None) -> list[dict[str, str]]:
  """Records {"question", "answer"} of a GSM8K split.

  Args:
    split: "train" or "test".
    source: "jsonl" (files `<data_dir>/<split>.jsonl`), "tfds" (a prepared TFDS `gsm8k` builder in
      `data_dir`, never downloaded), or "auto" (JSONL when the file exists, else TFDS).
    data_dir: folder of the JSONL files (default `data/gsm8k` in the repository) or TFDS data dir.

  Raises DataError naming the file and line of a record it cannot read, or the file (or TFDS split)
  when it holds no problems.
  """
  if source not in ("auto", "jsonl", "tfds"):
    raise ValueError(f"unknown GSM8K source {source!r}; known: auto, jsonl, tfds")
  if source in ("auto", "jsonl"):
    path = Path(data_dir or default_data_dir()) / f"{split}.jsonl"
    if path.exists():
      return _load_jsonl(path)
    if source == "jsonl":
      raise FileNotFoundError(f"no GSM8K file at {path}")
    tfds_dir = os.environ.get("TFDS_DATA_DIR") or str(Path.home() / "tensorflow_datasets")
    if "://" not in tfds_dir and not (Path(tfds_dir) / TASK_NAME).is_dir():  # spare the user TFDS's own pages
      raise FileNotFoundError(f"no GSM8K file at {path}, and no prepared TFDS gsm8k in {tfds_dir}")
  records = _load_tfds(split, None if data_dir is None or source == "auto" else str(data_dir))
  if not records:
    raise DataError(f"the TFDS gsm8k {split!r} split holds no problems")
  return records


# --- task ----------------------------------------------------------------------------------------


class GSM8KTask:
  """GSM8K as a task: problems with the number after "####" as gold and the solution as reference."""

  name = TASK_NAME

  def __init__(
    self,
    template: str | PromptTemplate = "plain",
    source: str = "auto",
    data_dir: str | Path | None = None,
    ascii_text: bool = False,
    keep_annotations: bool = False,
  ) -> None:
    self.template = get_template(template)
    self.source = source
    self.data_dir = data_dir
    self.ascii_text = ascii_text
    self.keep_annotations = keep_annotations
    self._cache: dict[str, list[Problem]] = {}

  def make_problem(self, record: Mapping[str, str], split: str, index: int) -> Problem:
    """The problem for one record (`index` is its line in the split, which makes the id)."""
    question, solution = record["question"], record["answer"]
    if not self.keep_annotations:
      solution = strip_annotations(solution)
    if self.ascii_text:
      question, solution = to_ascii(question), to_ascii(solution)
    return Problem(
      id=f"gsm8k-{split}-{index:05d}",
      prompt=self.template.prompt.format(question=question),
      answer=gold_answer(record["answer"]),
      task=TASK_NAME,
      reference=self.template.target_prefix + solution,
      metadata={"question": question, "solution": solution},
    )

  def problems(self, split: str) -> list[Problem]:
    """All problems of a split, in file order (cached)."""
    if split not in self._cache:
      records = load_gsm8k(split, self.source, self.data_dir)
      self._cache[split] = [self.make_problem(r, split, i) for i, r in enumerate(records)]
    return self._cache[split]

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    """Training problems in a seeded order, reshuffled each epoch; endless when `n` is None."""
    pool = self.problems("train")
    rng = random.Random(f"rl_lm/gsm8k/{seed}")
    count, epoch = 0, []
    while n is None or count < n:
      if not epoch:
        epoch = list(pool)
        rng.shuffle(epoch)
      yield epoch.pop()
      count += 1

  def test_problems(self, n: int | None = None, seed: int = 0) -> list[Problem]:
    """The first `n` test problems in file order (all when None); `seed` is accepted and unused."""
    del seed
    pool = self.problems("test")
    return list(pool if n is None else pool[:n])

  def reference_completion(self, problem: Problem) -> str:
    """The reference solution (ends with "#### <number>")."""
    return problem.reference
