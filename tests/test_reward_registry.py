"""Reward registry: names, weighted composition, fault reporting, batch dispatch across tasks."""

from __future__ import annotations

import pytest

from rl_lm.rewards import RewardResult, build_reward, known_rewards, make_reward, register, score_batch
from rl_lm.rewards.code import CodeReward
from rl_lm.rewards.registry import FunctionReward
from rl_lm.tasks.arithmetic import ArithmeticTask
from rl_lm.tasks.base import Problem

ADD_TESTS = "def check(candidate):\n  assert candidate(2, 3) == 5\n"
ADD_PROMPT = "def add(a, b):\n"


def _code_problem() -> Problem:
  meta = {"tests": ADD_TESTS, "entry_point": "add", "prompt": ADD_PROMPT}
  return Problem("add", ADD_PROMPT, "", task="code", metadata=meta)


def test_builtin_names_and_unknown_name_error():
  assert {"correctness", "arithmetic", "maths", "code", "format"} <= set(known_rewards())
  with pytest.raises(ValueError, match="known rewards: .*arithmetic.*correctness"):
    make_reward("corectness")
  with pytest.raises(ValueError, match="known rewards"):
    build_reward({"correctness": 1.0, "lenght": 0.1})


def test_result_validity_follows_status():
  assert RewardResult(1.0, "ok").valid
  assert RewardResult(0.0, "passed").valid
  assert not RewardResult(0.0, "error").valid
  assert RewardResult(0.0, "timeout").valid  # the completion's own overrun is a verdict
  assert not RewardResult(0.0, "sandbox_error").valid
  assert not RewardResult(0.0, "overloaded").valid
  assert not RewardResult(0.0, "overloaded", valid=None).valid
  assert not RewardResult(float("nan"), "ok").valid


def test_composite_weights_correctness_and_format():
  p = ArithmeticTask().make_problem("12+7*3", 3)
  reward = build_reward({"correctness": 1.0, "format": 0.1})
  assert reward(p, "33").score == pytest.approx(1.1)
  assert reward(p, "34").score == pytest.approx(0.1)
  assert reward(p, "thirty-three").score == 0.0
  r = reward(p, "33")
  assert r.status == "ok" and r.info["components"]["format"]["score"] == 1.0


def test_verifier_faults_are_reported_and_invalidate_the_composite():
  def broken(problem, completion):
    raise RuntimeError("verifier bug")

  def slow(problem, completion):
    return RewardResult(0.0, "overloaded", {"reason": "the host starved the check"})

  register("test_broken")(lambda: FunctionReward("test_broken", broken))
  register("test_slow")(lambda: FunctionReward("test_slow", slow))
  p = ArithmeticTask().make_problem("1+1", 1)
  r = make_reward("test_broken")(p, "2")
  assert r.status == "error" and not r.valid and "verifier bug" in r.info["error"]
  comp = build_reward({"correctness": 1.0, "test_slow": 1.0})(p, "2")
  assert not comp.valid and comp.status == "overloaded"
  with pytest.raises(ValueError, match="already registered"):
    register("test_slow")(lambda: None)


def test_score_batch_dispatches_each_task_to_its_verifier():
  arith = ArithmeticTask().make_problem("4-9", 1)
  maths = Problem("m", "Q", "18", task="gsm8k")
  code = _code_problem()
  problems = [arith, maths, code, arith, maths, code]
  completions = ["-5", "so\n#### 18", "  return a + b\n", "5", "#### 17 18", "  return a - b\n"]
  results = score_batch(problems, completions, {"correctness": 1.0}, options={"code": {"workers": 2, "timeout_s": 5}})
  assert [r.score for r in results] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
  assert [r.status for r in results] == ["ok", "ok", "passed", "ok", "ok", "failed"]
  assert all(r.valid for r in results)
  with pytest.raises(ValueError):
    score_batch(problems, completions[:2])


def test_format_reward_per_task():
  fmt = make_reward("format")
  arith = ArithmeticTask().make_problem("1+1", 1)
  maths = Problem("m", "Q", "18", task="gsm8k")
  assert fmt(arith, "2").score == 1.0 and fmt(arith, "two").score == 0.0
  assert fmt(maths, "work\n#### 18").score == 1.0
  assert fmt(maths, "#### 18\nmore text").score == 0.0
  assert fmt(maths, "#### 17 18").score == 0.0
  assert fmt(_code_problem(), "  return a + b\n").score == 1.0
  assert fmt(_code_problem(), "  return a +\n").score == 0.0
  assert fmt(Problem("z", "", "", task="unknown"), "x").status == "error"


def test_a_program_that_runs_out_of_time_scores_zero_not_masked():
  sleeping = "  import time\n  time.sleep(60)\n"  # never runnable: its overrun is its own on any host
  scored = CodeReward(timeout_s=1.0)(_code_problem(), sleeping)
  assert scored.status == "timeout" and scored.valid and scored.score == 0.0


def test_a_task_without_verifier_is_an_error_not_a_zero():
  odd = Problem("z", "", "", task="unheard_of")
  results = score_batch([odd, ArithmeticTask().make_problem("1+1", 1)], ["x", "2"])
  assert results[0].status == "error" and not results[0].valid
  assert "known tasks" in results[0].info["components"]["correctness"]["error"]
  assert results[1].score == 1.0


def test_length_reward_counts_characters_and_composes_as_a_penalty_or_as_the_bug():
  (problem,) = ArithmeticTask(levels=(1,)).test_problems(1, seed=0)
  answer = problem.answer
  assert make_reward("length")(problem, answer + "\n").score == len(answer) + 1
  penalised = build_reward({"correctness": 1.0, "length": -0.01})
  assert penalised(problem, answer).score == pytest.approx(1.0 - 0.01 * len(answer))
  buggy = build_reward({"correctness": 1.0, "length": 1.0})  # experiments/alarms/length_bug.py
  assert buggy(problem, "x" * 12).score == 12.0 > buggy(problem, answer).score  # rambling outscores the answer
