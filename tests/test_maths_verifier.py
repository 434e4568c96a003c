"""Maths verifier: extraction, normalisation, strictness against hacks, math-verify with a real timeout."""

from __future__ import annotations

import threading

import pytest

from rl_lm.rewards.audit import MATHS_PROBES
from rl_lm.rewards.maths import MathsConfig, SymbolicPool, extract_answer, interpret, verify_answer


@pytest.mark.parametrize(
  ("completion", "method", "text"),
  [
    ("work\n#### 18", "hashes", "18"),
    ("so \\boxed{18} it is", "boxed", "18"),
    ("\\boxed{\\frac{1}{2}}", "boxed", "\\frac{1}{2}"),
    ("The answer is 18.", "answer_is", "18"),
    ("Thus the final answer is $18 per day.", "answer_is", "$18 per day"),
    ("A: 18", "answer_colon", "18"),
    ("Answer: 18", "answer_colon", "18"),
    ("#### 18\n\\boxed{19}", "hashes", "18"),
  ],
)
def test_extraction(completion, method, text):
  ext = extract_answer(completion)
  assert (ext.method, ext.text) == (method, text)


@pytest.mark.parametrize(
  ("gold", "completion"),
  [
    ("18", "#### 18"),
    ("18", "#### 18.00"),
    ("18", "#### $18"),
    ("18", "#### 18 dollars"),
    ("1600", "#### 1,600"),
    ("1600", "#### $1,600.00"),
    ("-5", "#### \u22125"),
    ("0.5", "#### 1/2"),
    ("0.5", "\\boxed{\\frac{1}{2}}"),
    ("25", "#### 25%"),
    ("0.25", "#### 25%"),
    ("18", "**Answer:** 18"),
    ("18", "The answer is \\(18\\)."),
    ("7.5", "The answer is 7.50."),
  ],
)
def test_normalised_answers_match(gold, completion):
  r = verify_answer(gold, completion)
  assert (r.score, r.status) == (1.0, "ok"), r.info


@pytest.mark.parametrize(("name", "gold", "completion"), MATHS_PROBES)
def test_adversarial_answers_score_zero(name, gold, completion):
  r = verify_answer(gold, completion)
  assert r.score == 0.0 and r.valid, (name, r)


def test_last_number_fallback_is_opt_in():
  assert verify_answer("18", "so she has 18").score == 0.0
  assert verify_answer("18", "so she has 18", MathsConfig(last_number_fallback=True)).score == 1.0
  assert verify_answer("18", "18 or 17", MathsConfig(last_number_fallback=True)).score == 0.0


def test_interpretation_kinds():
  assert interpret("17, 18").kind == "ambiguous"
  assert interpret("1,000").kind == "number"
  assert interpret("").kind == "empty"
  assert interpret("2\\sqrt{2}").kind == "symbolic"


@pytest.fixture(scope="module")
def pool():
  p = SymbolicPool(workers=1, timeout_s=2.0)
  yield p
  p.close()


def test_symbolic_answers_go_through_math_verify(pool):
  assert verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=pool).score == 1.0
  assert verify_answer("1024", "\\boxed{2^{10}}", pool=pool).score == 1.0
  assert verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{7}}", pool=pool).score == 0.0
  r = verify_answer("18", "\\boxed{\\{17, 18\\}}", pool=pool)
  assert r.score == 0.0


def test_symbolic_timeout_is_reported_not_scored_and_pool_recovers(pool):
  r = verify_answer("2", "\\boxed{9^{9^{9^{9}}}}", pool=pool)
  assert r.status == "timeout" and not r.valid and r.score == 0.0
  assert verify_answer("1024", "\\boxed{2^{10}}", pool=pool).score == 1.0


def test_symbolic_path_works_off_the_main_thread(pool):
  out = []
  t = threading.Thread(target=lambda: out.append(verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=pool)))
  t.start()
  t.join(60)
  assert out and out[0].score == 1.0
