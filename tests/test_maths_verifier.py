"""Maths verifier: extraction, normalisation, strictness against hacks, math-verify with a real timeout.

More hostile phrasings and pathological inputs: tests/test_maths_adversarial.py."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from rl_lm.rewards import maths, symbolic
from rl_lm.rewards.audit import MATHS_PROBES
from rl_lm.rewards.maths import (
  MathsConfig,
  SymbolicPool,
  extract_answer,
  interpret,
  overrun_status,
  too_costly,
  verify_answer,
)


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
    ("#### 18\n\\boxed{18}", "hashes", "18"),
    ("\\boxed{１８}", "boxed", "18"),
    ("> Answer: 18", "answer_colon", "18"),  # a quoted answer counts when it is the only one
    ("```\n#### 5\n```\nThe answer is 18.", "answer_is", "18"),  # code is no answer
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
    ("1/3", "#### 0.\\overline{3}"),
    ("18", "\\boxed{\\text{18}}"),
    ("18", "The answer is 18.\nShe sells 16 - 3 - 4 = 9 eggs, not 10."),
    ("18", "The final answer is $18$. I hope it is correct."),
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
  assert interpret("17, 18").kind == "tuple"  # a list: compared only with a list gold
  assert interpret("17 18").kind == "ambiguous"
  assert (interpret("17+1").kind, interpret("17+1").reason) == ("ambiguous", "expression")
  assert interpret("1,000").kind == "number"
  assert interpret("").kind == "empty"
  assert interpret("2\\sqrt{2}").kind == "symbolic"
  assert interpret("not 18").kind == "refused"
  assert interpret("x" * 2000).kind == "too_long"
  assert interpret("x = 18 = 19").kind == "relation"  # an equation: compared only with a gold equation
  assert (interpret("18 \\mid 19").kind, interpret("18 \\mid 19").reason) == ("ambiguous", "several numbers")
  assert (interpret("x = 18").kind, interpret("x = 18").value) == ("number", 18)  # a label
  assert (interpret("１８").kind, interpret("１８").value) == ("number", 18)
  assert (interpret("18²").kind, interpret("18²").text) == ("symbolic", "18^{2}")  # an exponent, never dropped
  assert interpret("gamma(10)").kind == "symbolic"  # a function, not the unit "gamma"


@pytest.mark.parametrize(
  ("gold", "completion", "score"),
  [
    ("25", "#### 25%", 1.0),  # GSM8K writes whole-number percentages without the sign
    ("0.25", "#### 25%", 1.0),  # 25% is 0.25
    ("0.5", "#### 0.5%", 0.0),  # 0.5% is 0.005
    ("12.5", "#### 12.5%", 0.0),
    ("12.5\\%", "#### 12.5", 1.0),  # a percent gold: the sign may be dropped
    ("12.5\\%", "#### 0.125", 1.0),
    ("12.5\\%", "#### 12.5 percent", 1.0),
    ("18000", "#### 18 thousand", 1.0),
    ("18", "#### 18 thousand", 0.0),
  ],
)
def test_percent_and_scale_rules(gold, completion, score):
  assert verify_answer(gold, completion).score == score


@pytest.mark.parametrize(
  ("completion", "reason"),
  [
    ("The answer is not 18.", "negation: not"),
    ("#### less than 18", "comparison: less"),
    ("#### 18 is wrong", "negation: wrong"),
    ("The answer is 18. Or 19.", "hedge: Or"),
    ("It is not \\boxed{18}.", "negation: not (before the answer)"),
    ("Maybe the answer is 18.", "hedge: Maybe (before the answer)"),
    ("\\boxed{18}, 19", "several numbers"),
    ("\\boxed{18} is incorrect", "negation: incorrect"),
    ("#### 18\nWait, 19", "correction: Wait"),
    ("#### 18\n#### 19", "conflicting"),
    ("#### " + "9 " * 200, "too_long"),
    ("#### 18\n" * 20, "too_many"),
    ("#### nicht 18", "negation: nicht"),
    ("#### 不是18", "negation: 不"),
    ("#### 18 个", "unreadable: 个"),
    ("It is nоt \\boxed{18}", "unreadable: nоt (before the answer)"),  # a Cyrillic "о"
    ("La respuesta no es \\boxed{18}", "negation: no (before the answer)"),
    ("Maybe, the answer is 18.", "hedge: Maybe (before the answer)"),
    ("#### 18 (jk)", "correction: jk"),
    ("#### 18 /s", "correction: /"),
    ("\\boxed{18} 😜", "correction: 😜"),
    ("#### 18\nUpdate: 19", "correction: Update"),
    ("#### 18\nThe real total is 19.", "several numbers"),
    ("\\boxed{18} update 19", "correction: update"),
    ("#### 18\n\nSome text.\n\nThe answer is 19.", "several numbers"),  # within the lines read after it
    ("#### 18\nA.\nB.\nC.\nD.\nThe answer is 19.", "conflicting (answer_is)"),  # further on
    ("\\boxed{18 \\mid 19}", "several numbers"),
    ("#### 18½", "several numbers"),
    ("#### 十八", "several numbers"),
    ("19 \\mid \\boxed{18}", "several numbers (before the answer)"),
    ("e.g. #### 18", "no_answer (only in an example, a quote or code)"),
    ("```\n#### 18\n```", "no_answer (only in an example, a quote or code)"),
  ],
)
def test_refusals_say_why(completion, reason):
  r = verify_answer("18", completion)
  assert (r.score, r.valid, r.info["reason"]) == (0.0, True, reason)


def test_context_that_is_not_about_the_answer_is_fine():
  assert verify_answer("18", "She doesn't sell 3 eggs, so the answer is 18.").score == 1.0
  assert verify_answer("18", "The number of eggs not sold is \\boxed{18}.").score == 1.0
  assert verify_answer("18", "#### 18\n\nQuestion: Is it 5 or 6? Maybe 5.").score == 1.0
  assert verify_answer("5", "#### 5 more apples than Tom").score == 1.0


@pytest.fixture(scope="module")
def pool():
  p = SymbolicPool(workers=1, timeout_s=2.0)
  yield p
  p.close()


def test_symbolic_answers_go_through_math_verify(pool):
  assert verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=pool).score == 1.0
  assert verify_answer("1024", "\\boxed{2^{10}}", pool=pool).score == 1.0
  assert verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{7}}", pool=pool).score == 0.0
  assert verify_answer("2a + b = 10", "\\boxed{b + 2a = 10}", pool=pool).score == 1.0  # a relation, both sides
  assert verify_answer("10", "\\boxed{2a + b = 10}", pool=pool).info["reason"] == "several answers"
  r = verify_answer("18", "\\boxed{\\{17, 18\\}}", pool=pool)
  assert r.score == 0.0


COSTLY = (  # each takes math-verify seconds to forever; any function or "!" of a huge argument, however spelled
  "9^{9^{9^{9}}}", "9^{99999999}", "2^2^2^2", "x^{100000!}", "100000!", "(10^{6})!", "\\Gamma(10^{6})", "\\Gamma(1e6)",
  "\\Gamma\\left(10^{6}\\right)", "Γ(10^6)", "gamma(1e6)", "1000000!", "\\operatorname{factorial}(10^6)",
  "binomial(10^6, 5*10^5)", "\\binom{10^{6}}{500000}", "\\dbinom{10^6}{3}", "1000000!!", "!1000000", "1000000#",
  "\\operatorname{sf}(10^4)", "superfactorial(5000)", "fibonacci(10^9)", "\\operatorname{fib}(10^{9})", "exp(10^9)",
  "\\exp(10^{9})", "e^{10^9}", "\\mathrm{e}^{10^{9}}", "2^(2^(2^2))", "2^{2^{2^{2}}}", "2^{2²}", "((10^{9999})^{9999})",
  "\\Gamma(\\Gamma(20))", "\\frac{10^6}{2}!", "{10^6}!", "10^{6}!", "\\sum_{i=1}^{10^6} i!", "\\prod_{k=1}^{10^{6}} k",
  "1e999999999", "1e" + "9" * 5000, "\\Gamma " * 200 + "5",
)
CHEAP = (
  "2^{10}", "\\sqrt{8}", "5!", "1000!", "\\Gamma(1000)", "\\binom{10}{3}", "2\\sqrt{2}", "\\frac{\\sqrt{3}}{2}",
  "\\sqrt{10^{100}}", "\\log(10^{100})", "\\sin(10^9)", "10^{10000}", "(2^2)^2", "\\pi r^2", "e^{i\\pi}", "x^2 + y^2",
  "\\left(\\frac{1}{2}\\right)^{10}", "18 \\text{ dollars}",
)


@pytest.mark.parametrize("answer", COSTLY)
def test_costly_closed_forms_never_reach_math_verify(answer):
  """Refused in well under a second of CPU time: as too complex, or earlier (a "1000000!" is the number 1000000,
  a "binomial(a, b)" two answers), but never by math-verify."""
  assert too_costly(answer), answer
  cpu = time.thread_time()  # this thread's: the process's would count the worker's other threads (XLA's)
  r = verify_answer("2", f"\\boxed{{{answer}}}", MathsConfig(max_answer_chars=10_000), pool=_NoPool())
  assert time.thread_time() - cpu < 0.5
  assert r.score == 0.0 and r.valid and r.info.get("path") != "symbolic", r.info
  if "(" in answer and answer[0].isalpha():  # a function written as a word is no unit: "gamma(1e6)" is not 1e6
    assert "path" not in r.info, r.info


@pytest.mark.parametrize("answer", CHEAP)
def test_cheap_closed_forms_are_not_costly(answer):
  assert not too_costly(answer)


def test_overrun_blame_follows_the_worker_cpu_time():
  assert overrun_status(1.9, timeout_s=2.0, cpu_share=0.5) == "timeout"  # it computed: the answer's fault
  assert overrun_status(0.2, timeout_s=2.0, cpu_share=0.5) == "overloaded"  # it waited: the host's fault
  assert overrun_status(None, timeout_s=2.0, cpu_share=0.5) == "overloaded"


@pytest.mark.parametrize(("status", "valid"), [("timeout", True), ("overloaded", False), ("error", False)])
def test_symbolic_statuses_map_to_validity(status, valid):
  class Pool:
    def compare(self, gold, pred):
      return None, status, "detail"

  r = verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=Pool())
  assert (r.score, r.status, r.valid) == (0.0, status, valid)


def test_symbolic_overrun_kills_the_worker_and_blames_whoever_used_the_time(pool):
  restarts = pool.restarts
  match, status, detail = pool.compare("2", "9^{9^{9^{9}}}")  # the pool itself, past the cost screen
  assert match is None and pool.restarts == restarts + 1
  cpu = float(re.search(r"\(([0-9.]+)s on a CPU", detail).group(1))
  assert status == overrun_status(cpu, pool.timeout_s, pool.cpu_share), detail
  assert verify_answer("1024", "\\boxed{2^{10}}", pool=pool).score == 1.0


def test_a_starved_worker_is_a_masked_host_fault_and_is_replaced():
  p = SymbolicPool(workers=1, timeout_s=1.0)
  try:
    assert verify_answer("1024", "\\boxed{2^{10}}", pool=p).score == 1.0
    (old,) = p.pids()
    os.kill(old, signal.SIGSTOP)  # it gets no CPU, as on a host too busy to run it
    r = verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=p)
    assert (r.status, r.valid, r.score) == ("overloaded", False, 0.0), r
    assert p.restarts == 1 and not _alive(old)
    assert verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=p).score == 1.0
  finally:
    p.close()


def test_symbolic_path_works_off_the_main_thread(pool):
  out = []
  t = threading.Thread(target=lambda: out.append(verify_answer("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", pool=pool)))
  t.start()
  t.join(60)
  assert out and out[0].score == 1.0


def test_worker_killed_mid_comparison_is_a_verifier_fault_and_is_replaced(monkeypatch):
  p = SymbolicPool(workers=1, timeout_s=60.0)
  monkeypatch.setattr(maths, "too_costly", lambda text: False)  # let a slow answer reach the worker
  try:
    assert verify_answer("1024", "\\boxed{2^{10}}", pool=p).score == 1.0  # starts the worker
    (old,) = p.pids()
    waiting = threading.Event()  # set once the request is written and the pool waits for the reply
    read = symbolic._Worker.readline
    monkeypatch.setattr(symbolic._Worker, "readline", lambda self, deadline: (waiting.set(), read(self, deadline))[1])
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


class _NoPool:
  """A symbolic pool that must not be used."""

  def compare(self, gold: str, pred: str) -> tuple[bool | None, str, str]:
    raise AssertionError(f"reached math-verify with {pred!r}")
