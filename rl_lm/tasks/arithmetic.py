"""Built-in task: procedurally generated integer arithmetic with graded difficulty.

A problem is an expression followed by "=", e.g. prompt "12+7*3=", and the completion the verifier
accepts is the exact integer, "33" (the sampler appends EOS). Only "+", "-", "*" and parentheses
appear, so every result is an integer; results may be negative ("4-9=" -> "-5").

Difficulty grows with the number of operands, the number of digits, the operator set and whether
sub-expressions are grouped by parentheses (see `LEVELS`). Generation is deterministic from a seed.
Train and test are split by hashing the canonical expression string, so a test expression can never
be produced by `train_problems`, whatever the seed.

Verification is exact: the last line of the completion, stripped of surrounding whitespace, must be
an integer in canonical form ("-5", "0", "33"; not "+5", "033", "33.0", "33 34") equal to the gold.
Earlier lines are free working and are never read, so listing candidates cannot win.

With `worked=True` the reference completion shows one operation per line before the answer, e.g.
"7*3=21\\n12+21=33\\n33", which can help a small model on multi-operand levels.

With `template="chat"` the prompt is a question for an instruct model ("What is 12+7*3?"), which the
tokenizer frames as a user turn with the checkpoint's chat template. Such a model answers in sentences or
equations, so its problems (`metadata["answer_form"] == "equation"`) also accept a last line that is a
pure equation ending in the answer, "12 + 7*3 = 12 + 21 = 33" (an optional final period): digits,
operators, parentheses and single "=" only, so "not 33", "33 or 34", "!= 33", "<= 33" and any words
still score 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Iterator, Sequence

from rl_lm.tasks.base import Problem

TASK_NAME = "arithmetic"
# The prompt of an expression, by template: the bare "12+7*3=", or a question for a chat model's user turn.
CHAT_PROMPTS = {"plain": "{expr}=", "chat": "What is {expr}?"}
_TERM = r"(?=[^=]*[0-9])[0-9+\-*×x() ]+"  # one side of an equation: arithmetic only, with a digit in it
_EQUATION_RE = re.compile(rf"{_TERM}(?:={_TERM})*=\s*(-?(?:0|[1-9][0-9]*))")
_INT_RE = re.compile(r"-?(?:0|[1-9][0-9]*)")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2}


@dataclasses.dataclass(frozen=True)
class Level:
  """One difficulty level.

  Attributes:
    operands: (min, max) number of operands.
    max_digits: operands have 1..max_digits digits (uniform over digit counts, then values).
    ops: operators that may appear, a subset of "+-*".
    parens: whether operands are grouped by a random tree (parentheses where precedence needs them);
      otherwise the expression is a flat chain evaluated with the usual precedence.
    max_result_digits: expressions whose result has more digits are rejected and redrawn.
  """

  operands: tuple[int, int]
  max_digits: int
  ops: str
  parens: bool
  max_result_digits: int


LEVELS: dict[int, Level] = {
  1: Level((2, 2), 1, "+-", False, 2),
  2: Level((2, 2), 2, "+-", False, 3),
  3: Level((3, 3), 2, "+-*", False, 3),
  4: Level((3, 4), 2, "+-*", True, 4),
  5: Level((4, 5), 3, "+-*", True, 5),
}


# --- expressions ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Node:
  op: str  # "" for a literal
  value: int = 0
  left: _Node | None = None
  right: _Node | None = None


def _tokens(expr: str) -> list[str]:
  out = re.findall(r"\d+|[-+*()]", expr)
  if "".join(out) != expr:
    raise ValueError(f"not an arithmetic expression: {expr!r}")
  return out


def parse(expr: str) -> _Node:
  """Parses an expression over non-negative integers, + - * and parentheses (usual precedence)."""
  toks = _tokens(expr)
  pos = 0

  def peek() -> str | None:
    return toks[pos] if pos < len(toks) else None

  def take() -> str:
    nonlocal pos
    if pos >= len(toks):
      raise ValueError(f"unexpected end of {expr!r}")
    pos += 1
    return toks[pos - 1]

  def atom() -> _Node:
    t = take()
    if t == "(":
      node = chain(1)
      if take() != ")":
        raise ValueError(f"unbalanced parentheses in {expr!r}")
      return node
    if not t.isdigit():
      raise ValueError(f"unexpected {t!r} in {expr!r}")
    return _Node("", int(t))

  def chain(min_prec: int) -> _Node:
    left = atom() if min_prec == 2 else chain(2)
    while (t := peek()) is not None and t in _PRECEDENCE and _PRECEDENCE[t] == min_prec:
      take()
      right = atom() if min_prec == 2 else chain(2)
      left = _Node(t, 0, left, right)
    return left

  node = chain(1)
  if pos != len(toks):
    raise ValueError(f"trailing tokens in {expr!r}")
  return node


def _eval(node: _Node) -> int:
  if not node.op:
    return node.value
  a, b = _eval(node.left), _eval(node.right)
  return a + b if node.op == "+" else a - b if node.op == "-" else a * b


def evaluate(expr: str) -> int:
  """The exact integer value of `expr`."""
  return _eval(parse(expr))


def _render(node: _Node) -> str:
  if not node.op:
    return str(node.value)
  prec = _PRECEDENCE[node.op]
  left, right = _render(node.left), _render(node.right)
  if node.left.op and _PRECEDENCE[node.left.op] < prec:
    left = f"({left})"
  if node.right.op and (_PRECEDENCE[node.right.op] < prec or (node.op == "-" and _PRECEDENCE[node.right.op] == prec)):
    right = f"({right})"
  return f"{left}{node.op}{right}"


def worked_steps(expr: str) -> list[str]:
  """One line per operation in evaluation order, e.g. "12+7*3" -> ["7*3=21", "12+21=33"]."""
  steps: list[str] = []

  def walk(node: _Node) -> int:
    if not node.op:
      return node.value
    a, b = walk(node.left), walk(node.right)
    v = a + b if node.op == "+" else a - b if node.op == "-" else a * b
    steps.append(f"{a}{node.op}{b}={v}")
    return v

  walk(parse(expr))
  return steps


# --- generation and split ------------------------------------------------------------------------


def _operand(rng: random.Random, max_digits: int) -> int:
  d = rng.randint(1, max_digits)
  return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)


def _tree(rng: random.Random, values: list[int], ops: str) -> _Node:
  if len(values) == 1:
    return _Node("", values[0])
  cut = rng.randint(1, len(values) - 1)
  return _Node(rng.choice(ops), 0, _tree(rng, values[:cut], ops), _tree(rng, values[cut:], ops))


def generate_expression(rng: random.Random, level: int) -> str:
  """Draws one expression of the given level (any split)."""
  spec = LEVELS[level]
  while True:
    n = rng.randint(*spec.operands)
    values = [_operand(rng, spec.max_digits) for _ in range(n)]
    if spec.parens:
      expr = _render(_tree(rng, values, spec.ops))
    else:
      expr = str(values[0]) + "".join(rng.choice(spec.ops) + str(v) for v in values[1:])
    if len(str(abs(evaluate(expr)))) <= spec.max_result_digits:
      return expr


def _hash(text: str) -> int:
  return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_of(expr: str, test_fraction: float = 0.1) -> str:
  """'test' or 'train', decided by a hash of the canonical expression string alone."""
  return "test" if _hash("rl_lm/arithmetic/split:" + expr) % 1_000_000 < test_fraction * 1_000_000 else "train"


def problem_id(expr: str) -> str:
  """Stable id of the problem for expression `expr`."""
  return "arith-" + hashlib.sha1(expr.encode()).hexdigest()[:16]


# --- verification --------------------------------------------------------------------------------


def parse_completion(completion: str, equation: bool = False) -> str | None:
  """The final answer of a completion (its last line, stripped) if it is a canonical integer, else None.
  With `equation`, a last line that is a pure equation ending in a canonical integer gives that integer."""
  lines = completion.strip().splitlines()
  if not lines:
    return None
  last = lines[-1].strip()
  if equation and not _INT_RE.fullmatch(last):
    m = _EQUATION_RE.fullmatch(last.removesuffix(".").rstrip())
    last = m.group(1) if m else ""
  return last if _INT_RE.fullmatch(last) and last != "-0" else None


def answer_of(problem: Problem, completion: str) -> str | None:
  """`parse_completion` in the problem's answer form (an equation is allowed for chat prompts)."""
  return parse_completion(completion, equation=problem.metadata.get("answer_form") == "equation")


def is_correct(problem: Problem, completion: str) -> bool:
  """Exact check: the completion's final answer equals the gold integer, digit for digit."""
  return answer_of(problem, completion) == problem.answer


# --- task ----------------------------------------------------------------------------------------


class ArithmeticTask:
  """Integer-arithmetic problems at levels `levels`, split train/test by expression hash."""

  name = TASK_NAME

  def __init__(
    self, levels: Sequence[int] = tuple(LEVELS), test_fraction: float = 0.1, worked: bool = False,
    decimal_demos: float = 0.0, seed: int = 0, template: str = "plain",
  ) -> None:
    unknown = [lv for lv in levels if lv not in LEVELS]
    if unknown or not levels:
      raise ValueError(f"unknown arithmetic levels {unknown or levels}; known: {sorted(LEVELS)}")
    if not 0.0 < test_fraction < 1.0:
      raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not 0.0 <= decimal_demos <= 1.0:
      raise ValueError(f"decimal_demos must be in [0, 1], got {decimal_demos}")
    if template not in CHAT_PROMPTS:
      raise ValueError(f"template must be one of {sorted(CHAT_PROMPTS)}, got {template!r}")
    self.prompt_format = CHAT_PROMPTS[template]
    self.metadata = {"answer_form": "equation"} if template == "chat" else {}
    self.levels = tuple(levels)
    self.test_fraction = test_fraction
    self.worked = worked
    self.decimal_demos = decimal_demos
    self._demo_rng = random.Random(f"rl_lm/arithmetic/demos/{seed}")

  def make_problem(self, expr: str, level: int) -> Problem:
    """The problem for a given expression (the caller vouches for its level)."""
    answer = str(evaluate(expr))
    reference = "\n".join([*worked_steps(expr), answer]) if self.worked else answer
    return Problem(
      id=problem_id(expr), prompt=self.prompt_format.format(expr=expr), answer=answer, difficulty=level,
      task=TASK_NAME, reference=reference, metadata=self.metadata
    )

  def _stream(self, split: str, seed: int, levels: Sequence[int] | None) -> Iterator[Problem]:
    levels = tuple(levels or self.levels)
    rng = random.Random(f"rl_lm/arithmetic/{split}/{seed}")
    while True:
      level = rng.choice(levels)
      expr = generate_expression(rng, level)
      if split_of(expr, self.test_fraction) == split:
        yield self.make_problem(expr, level)

  def train_problems(
    self, n: int | None = None, seed: int = 0, levels: Sequence[int] | None = None
  ) -> Iterator[Problem]:
    """Training problems (levels drawn uniformly), endless when `n` is None; repeats are possible."""
    stream = self._stream("train", seed, levels)
    if n is None:
      yield from stream
      return
    for _ in range(n):
      yield next(stream)

  def test_problems(self, n: int | None = 500, seed: int = 0, levels: Sequence[int] | None = None) -> list[Problem]:
    """`n` distinct held-out problems, as evenly spread over `levels` as their test pools allow."""
    levels = tuple(levels or self.levels)
    n = 500 if n is None else n
    out: list[Problem] = []
    seen: set[str] = set()
    per_level = [n // len(levels) + (i < n % len(levels)) for i in range(len(levels))]
    for level, want in zip(levels, per_level, strict=True):
      rng = random.Random(f"rl_lm/arithmetic/test/{seed}/{level}")
      got, misses = 0, 0
      while got < want and misses < 20_000:  # small levels have small test pools
        expr = generate_expression(rng, level)
        if expr in seen or split_of(expr, self.test_fraction) != "test":
          misses += 1
          continue
        seen.add(expr)
        out.append(self.make_problem(expr, level))
        got, misses = got + 1, 0
    return out

  def reference_completion(self, problem: Problem) -> str:
    """The SFT target: the bare answer, or the worked form when `worked` is set.

    With `decimal_demos` = f, a fraction f of the targets (drawn afresh at every call, from a seeded
    generator) write the final answer as a decimal, "33.0": imperfect demonstrations in a style the
    exact verifier rejects, which SFT imitates and RL against the verifier can unlearn.
    """
    if self.decimal_demos and self._demo_rng.random() < self.decimal_demos:
      return problem.reference + ".0"
    return problem.reference
