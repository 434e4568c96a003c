"""Built-in arithmetic task: determinism, split disjointness, exact verification, graded difficulty."""

from __future__ import annotations

import random
import re

import pytest

from rl_lm.rewards.audit import ARITHMETIC_PROBES
from rl_lm.tasks.arithmetic import (
  LEVELS,
  ArithmeticTask,
  evaluate,
  generate_expression,
  is_correct,
  parse_completion,
  split_of,
  worked_steps,
)
from rl_lm.tokenizer import CharTokenizer


def test_generation_is_deterministic_from_the_seed():
  task = ArithmeticTask()
  a = [p.prompt for p in task.train_problems(200, seed=3)]
  b = [p.prompt for p in task.train_problems(200, seed=3)]
  c = [p.prompt for p in task.train_problems(200, seed=4)]
  assert a == b
  assert a != c
  assert [p.id for p in task.test_problems(100, seed=1)] == [p.id for p in task.test_problems(100, seed=1)]


def test_train_and_test_never_share_an_expression():
  task = ArithmeticTask()
  test = {p.prompt for p in task.test_problems(2000)}
  train = [p for seed in range(3) for p in task.train_problems(5000, seed=seed)]
  assert test and train
  assert not test & {p.prompt for p in train}
  assert all(split_of(p.prompt[:-1]) == "train" for p in train)
  assert all(split_of(p) == "test" for p in (q[:-1] for q in test))


def test_ids_are_stable_and_unique():
  problems = ArithmeticTask().test_problems(1000)
  assert len({p.id for p in problems}) == len({p.prompt for p in problems}) == len(problems)
  again = ArithmeticTask().make_problem(problems[0].prompt[:-1], problems[0].difficulty)
  assert again == problems[0]


def test_answers_are_exact_integers():
  rng = random.Random(0)
  for level in LEVELS:
    for _ in range(500):
      expr = generate_expression(rng, level)
      assert evaluate(expr) == eval(expr)  # noqa: S307 - generated arithmetic only
      steps = worked_steps(expr)
      assert int(steps[-1].split("=")[-1]) == evaluate(expr)


def test_levels_grow_in_operands_digits_and_parentheses():
  task = ArithmeticTask()
  by_level = {lv: task.test_problems(300, levels=[lv]) for lv in LEVELS}
  n_ops = {lv: sum(len(re.findall(r"[-+*]", p.prompt)) for p in ps) / len(ps) for lv, ps in by_level.items()}
  assert all(n_ops[a] <= n_ops[b] for a, b in zip(list(LEVELS), list(LEVELS)[1:], strict=False))
  assert not any("(" in p.prompt for lv in (1, 2, 3) for p in by_level[lv])
  assert any("(" in p.prompt for p in by_level[5])
  assert all(p.difficulty == lv for lv, ps in by_level.items() for p in ps)


def test_text_fits_the_character_tokenizer():
  tok = CharTokenizer()
  for worked in (False, True):
    task = ArithmeticTask(worked=worked)
    for p in task.test_problems(500):
      text = p.prompt + task.reference_completion(p)
      assert tok.decode(tok.encode(text)) == text
      assert len(text) < 128


@pytest.mark.parametrize("completion", ["33", " 33\n", "7*3=21\n12+21=33\n33"])
def test_verifier_accepts_the_exact_answer(completion):
  problem = ArithmeticTask().make_problem("12+7*3", 3)
  assert problem.prompt == "12+7*3=" and problem.answer == "33"
  assert is_correct(problem, completion)


@pytest.mark.parametrize(("name", "completion"), ARITHMETIC_PROBES)
def test_verifier_rejects_near_misses_and_lists(name, completion):
  problem = ArithmeticTask().make_problem("12+7*3", 3)
  assert not is_correct(problem, completion), name


def test_negative_answers_and_canonical_form():
  problem = ArithmeticTask().make_problem("4-9", 1)
  assert problem.answer == "-5"
  assert is_correct(problem, "-5")
  assert not is_correct(problem, "- 5")
  assert parse_completion("-0") is None
  assert parse_completion("0") == "0"


def _left_to_right_without_carries(prompt: str) -> str:
  """A weak baseline: ignores precedence and parentheses, and forgets carries when adding."""
  toks = re.findall(r"\d+|[-+*]", prompt)
  acc = int(toks[0])
  for op, v in zip(toks[1::2], toks[2::2], strict=True):
    v = int(v)
    if op == "+" and acc >= 0:
      a, b = str(acc)[::-1], str(v)[::-1]
      digits = [(int(a[i]) if i < len(a) else 0) + (int(b[i]) if i < len(b) else 0) for i in range(max(len(a), len(b)))]
      acc = int("".join(str(d % 10) for d in digits)[::-1])
    elif op == "+":
      acc += v
    elif op == "-":
      acc -= v
    else:
      acc *= v
  return str(acc)


def test_difficulty_levels_separate_a_simple_baseline():
  task = ArithmeticTask()
  rates = []
  for level in LEVELS:
    problems = list(task.train_problems(3000, seed=0, levels=[level]))
    rates.append(sum(is_correct(p, _left_to_right_without_carries(p.prompt)) for p in problems) / len(problems))
  print("baseline pass rate by level:", [round(r, 3) for r in rates])
  assert all(a - b > 0.02 for a, b in zip(rates, rates[1:], strict=False)), rates
  assert rates[0] - rates[-1] > 0.4


def test_unknown_level_is_rejected():
  with pytest.raises(ValueError, match="known"):
    ArithmeticTask(levels=(9,))


def test_chat_prompts_accept_a_pure_equation_ending_in_the_answer_and_nothing_looser():
  from rl_lm.tasks.arithmetic import ArithmeticTask

  chat, plain = (ArithmeticTask(levels=(2,), template=t).make_problem("79+87", 2) for t in ("chat", "plain"))
  assert chat.prompt == "What is 79+87?" and chat.metadata["answer_form"] == "equation"
  fair = ["166", "79 + 87 = 166", "79 + 87 = 166.", "79+87 = 80+86 = 166", "Let me see.\n79 + 87 = 166", "79 x 2 = 166"]
  unfair = ["The sum is 166", "79 + 87 != 166", "79 + 87 = 166 or 167", "= 166", " = 166", "79 + 87 == 166",
            "79 + 87 <= 166", "not 166", "79 + 87 = 166\n167", "79 + 87 = 0166", "79 + 87 = 166.0", "79 + 87 ≈ 166",
            "x = 166", "79 + 87 = 166!", "79 + 87 = 165 + 1", "79 + 87 = 166 (maybe)", "79 + 87 = -166", ""]
  assert [is_correct(chat, c) for c in fair] == [True] * len(fair)
  assert [c for c in unfair if is_correct(chat, c)] == []
  assert not is_correct(plain, "79 + 87 = 166") and is_correct(plain, "166")  # the plain task stays bare-integer
