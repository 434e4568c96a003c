"""Maths verifier: extraction, normalisation, strictness against hacks, math-verify with a real timeout."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rl_lm.rewards import maths
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


def test_worker_killed_mid_comparison_is_a_verifier_fault_and_is_replaced(monkeypatch):
  p = SymbolicPool(workers=1, timeout_s=60.0)
  try:
    assert verify_answer("1024", "\\boxed{2^{10}}", pool=p).score == 1.0  # starts the worker
    (old,) = p.pids()
    waiting = threading.Event()  # set once the request is written and the pool waits for the reply
    read = maths._Worker.readline
    monkeypatch.setattr(maths._Worker, "readline", lambda self, deadline: (waiting.set(), read(self, deadline))[1])
    out = []
    t = threading.Thread(target=lambda: out.append(verify_answer("2", "\\boxed{9^{9^{9^{9}}}}", pool=p)))
    t.start()
    assert waiting.wait(30)
    os.kill(old, signal.SIGKILL)
    t.join(30)
    r = out[0]
    assert (r.status, r.valid, r.score) == ("error", False, 0.0), r  # masked as a verifier fault, not a wrong answer
    assert r.info["reason"] == "math-verify worker died"
    assert p.pids() == [] and p.restarts == 1
    monkeypatch.undo()
    for _ in range(2):  # the pool keeps working, on a new worker
      assert verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=p).score == 1.0
    (new,) = p.pids()
    assert new != old and not _alive(old)
  finally:
    p.close()


def test_worker_found_dead_while_idle_is_replaced_without_losing_the_comparison():
  p = SymbolicPool(workers=1, timeout_s=60.0)
  try:
    assert verify_answer("1024", "\\boxed{2^{10}}", pool=p).score == 1.0
    (old,) = p.pids()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(old) and time.monotonic() < deadline:  # gone (a zombie until the pool reaps it)
      time.sleep(0.01)
    r = verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=p)
    assert (r.status, r.score) == ("ok", 1.0), r
    (new,) = p.pids()
    assert new != old and p.restarts == 1
  finally:
    p.close()


def _alive(pid: int) -> bool:
  """True while `pid` runs (a zombie, dead but not reaped, counts as gone)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False
