"""pass@k estimator (hand values, brute force, Monte Carlo), the evaluation driver and its outputs."""

import itertools
import json
from math import comb

import numpy as np
import pytest

from rl_lm import evaluation
from rl_lm.evaluation import EvalResult, default_ks, pass_at_k, pass_at_k_array, pass_at_k_curve

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_hand_computed_values():
  assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
  assert pass_at_k(5, 2, 2) == pytest.approx(1 - comb(3, 2) / comb(5, 2))  # 0.7
  assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
  assert pass_at_k(10, 0, 1) == 0.0
  assert pass_at_k(10, 0, 10) == 0.0
  assert pass_at_k(10, 10, 1) == 1.0
  assert pass_at_k(10, 10, 10) == 1.0
  assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3
  assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, 2, 6), (-1, 0, 1), (5, -1, 1), (5, 2, -1), (5, 2, 0)])
def test_invalid_arguments_raise(n, c, k):
  with pytest.raises(ValueError):
    pass_at_k(n, c, k)
  with pytest.raises(ValueError):
    pass_at_k_array(n, np.array([c]), k)


def _brute_force(n, c, k):
  """Fraction of k-subsets of n samples (the first c correct) that hold a correct one."""
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_agrees_with_brute_force_enumeration():
  for n in range(1, 9):
    for c in range(n + 1):
      for k in range(1, n + 1):
        assert pass_at_k(n, c, k) == pytest.approx(_brute_force(n, c, k), abs=1e-12), (n, c, k)
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_array_agrees_with_scalar():
  rng = np.random.default_rng(0)
  n = rng.integers(1, 300, size=200)
  c = rng.integers(0, n + 1)
  for k in (1, 2, 7, 64):
    ok = n >= k
    got = pass_at_k_array(n[ok], c[ok], k)
    want = [pass_at_k(int(a), int(b), k) for a, b in zip(n[ok], c[ok], strict=True)]
    np.testing.assert_allclose(got, want, atol=1e-12)
  np.testing.assert_allclose(pass_at_k_array(5, np.array([0, 2, 5]), 2), [0.0, 0.7, 1.0], atol=1e-12)
  assert pass_at_k_array(5, np.array([], np.int64), 1).shape == (0,)


def test_large_n_is_stable():
  assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
  assert pass_at_k(10000, 3, 1000) == pytest.approx(1 - comb(9997, 1000) / comb(10000, 1000), rel=1e-9)
  assert 0.0 <= pass_at_k(10000, 1, 9999) <= 1.0


def test_subset_draws_match_estimator():
  """pass@k is the probability that k samples drawn without replacement from the n hold a correct one."""
  rng = np.random.default_rng(1)
  n, c, k, trials = 12, 3, 4, 20000
  is_correct = np.zeros(n, bool)
  is_correct[:c] = True
  hits = np.mean([is_correct[rng.choice(n, size=k, replace=False)].any() for _ in range(trials)])
  p = pass_at_k(n, c, k)
  assert abs(hits - p) < 4 * np.sqrt(p * (1 - p) / trials)


def test_estimator_is_unbiased_for_true_pass_at_k():
  """Averaged over repeated n-sample experiments, the estimate matches 1 - (1 - p)^k."""
  rng = np.random.default_rng(2)
  p, n, k, reps = 0.15, 10, 4, 40000
  counts = rng.binomial(n, p, size=reps)
  estimates = pass_at_k_array(n, counts, k)
  truth = 1 - (1 - p) ** k
  assert abs(estimates.mean() - truth) < 4 * estimates.std() / np.sqrt(reps)
  # The naive plug-in 1 - (1 - c/n)^k is biased low; the test above would notice a swap.
  naive = 1 - (1 - counts / n) ** k
  assert naive.mean() < truth - 4 * naive.std() / np.sqrt(reps)


def test_default_ks():
  assert default_ks(64) == [1, 2, 4, 8, 16, 32, 64]
  assert default_ks(10) == [1, 2, 4, 8, 10]
  assert default_ks(1) == [1]
  assert default_ks(3) == [1, 2, 3]
  with pytest.raises(ValueError):
    default_ks(0)


def test_curve_skips_problems_with_too_few_samples():
  curve = pass_at_k_curve(np.array([4, 2]), np.array([1, 2]), [1, 2, 4, 8])
  assert curve[1] == pytest.approx((0.25 + 1.0) / 2)
  assert curve[2] == pytest.approx((0.5 + 1.0) / 2)
  assert curve[4] == pytest.approx(1.0)  # only the first problem has 4 samples
  assert 8 not in curve


# ---------------------------------------------------------------------------------------------- driver


class _P:
  def __init__(self, id, prompt, answer):
    self.id, self.prompt, self.answer = id, prompt, answer


def _fake_problems():
  return [_P("a", "q0", "x"), _P("b", "q1", "y"), _P("c", "q2", "z")]


def _sample_fn(prompts, n):
  # q0: 2 of 4 right; q1: none right; q2: one right, one verifier error ("ERR"), two wrong.
  table = {"q0": ["x", "x", "w", "w"], "q1": ["w", "w", "w", "w"], "q2": ["z", "ERR", "w", "w"]}
  return [table[p][:n] for p in prompts]


def _correct_fn(problem, completion):
  if completion == "ERR":
    return None
  if completion == "BOOM":
    raise RuntimeError("verifier crashed")
  return completion == problem.answer


def _greedy_fn(prompts):
  return [{"q0": "x", "q1": "BOOM", "q2": "w"}[p] for p in prompts]


def test_evaluate_with_fakes_and_verifier_errors():
  calls = []

  def sample_fn(prompts, n):
    calls.append(list(prompts))
    return _sample_fn(prompts, n)

  res = evaluation.evaluate(_fake_problems(), sample_fn, _correct_fn, n=4, greedy_fn=_greedy_fn, batch_size=2)
  assert calls == [["q0", "q1"], ["q2"]]
  assert res.correct_counts == [2, 0, 1]
  assert res.valid_counts == [4, 4, 3]
  assert res.verifier_errors == 1
  assert res.greedy_verifier_errors == 1  # "BOOM" raised inside the verifier
  assert res.greedy_accuracy == pytest.approx(0.5)  # q0 right, q2 wrong, q1 excluded
  assert res.sample_accuracy == pytest.approx(3 / 11)
  assert sorted(res.pass_at_k) == [1, 2, 4]
  assert res.pass_at_k[1] == pytest.approx((0.5 + 0.0 + 1 / 3) / 3)
  assert res.pass_at_k[2] == pytest.approx((pass_at_k(4, 2, 2) + 0.0 + pass_at_k(3, 1, 2)) / 3)
  assert res.pass_at_k[4] == pytest.approx((1.0 + 0.0) / 2)  # q2 has only 3 valid samples
  assert res.problems_per_k == {1: 3, 2: 3, 4: 2}
  assert res.problem_ids == ["a", "b", "c"]
  m = res.metrics()
  assert m["eval/pass@1"] == res.pass_at_k[1] and m["eval/pass@4"] == res.pass_at_k[4]
  assert m["eval/greedy_accuracy"] == 0.5 and m["eval/verifier_errors"] == 1.0
  assert m["eval/num_problems"] == 3.0
  assert set(res.metrics(prefix="test/")) == {k.replace("eval/", "test/") for k in m}


def test_evaluate_without_greedy_and_with_strings():
  res = evaluation.evaluate(["p", "q"], lambda ps, n: [["1"] * n for _ in ps], lambda p, c: c == "1", n=3, ks=[1, 3])
  assert res.greedy_accuracy is None and "eval/greedy_accuracy" not in res.metrics()
  assert res.pass_at_k == {1: 1.0, 3: 1.0}
  assert res.problem_ids == ["0", "1"]


def test_evaluate_rejects_bad_outputs():
  probs = _fake_problems()
  with pytest.raises(ValueError, match="completions"):
    evaluation.evaluate(probs, lambda ps, n: [["x"] * (n - 1) for _ in ps], _correct_fn, n=4)
  with pytest.raises(ValueError, match="lists"):
    evaluation.evaluate(probs, lambda ps, n: [], _correct_fn, n=4)
  with pytest.raises(ValueError, match="True, False or None"):
    evaluation.evaluate(probs, _sample_fn, lambda p, c: 0.3, n=4)
  with pytest.raises(ValueError):
    evaluation.evaluate(probs, _sample_fn, _correct_fn, n=4, ks=[8])


def test_correct_from_reward():
  class R:
    def __init__(self, score, valid):
      self.score, self.valid = score, valid

  fn = evaluation.correct_from_reward(lambda p, c: R(float(c), c != "0.5"))
  assert fn(None, "1") is True and fn(None, "0") is False and fn(None, "0.5") is None


def test_json_round_trip_and_write_eval(tmp_path):
  res = evaluation.evaluate(_fake_problems(), _sample_fn, _correct_fn, n=4, greedy_fn=_greedy_fn)
  assert EvalResult.from_json(res.to_json()) == res
  json_path, png_path = evaluation.write_eval(res, tmp_path, step=120)
  assert json_path == tmp_path / "eval" / "step_000120.json"
  record = json.loads(json_path.read_text())
  assert record["step"] == 120 and record["pass_at_k"]["1"] == pytest.approx(res.pass_at_k[1])
  assert evaluation.load_eval(json_path) == res
  data = png_path.read_bytes()
  assert png_path.name == "step_000120.png" and len(data) > 1000 and data[:8] == PNG_SIGNATURE
  j2, p2 = evaluation.write_eval(res, tmp_path, step=0, label="before RL")
  assert j2.name == "step_000000_before_RL.json" and p2.read_bytes()[:8] == PNG_SIGNATURE
  assert json.loads(j2.read_text())["label"] == "before RL"


def test_overlay_plot(tmp_path):
  path = evaluation.plot_pass_at_k_curves(
    {"before RL": {1: 0.2, 4: 0.5, 16: 0.8}, "after RL": {1: 0.4, 4: 0.6, 16: 0.7}}, tmp_path / "sub" / "cmp.png",
    title="before vs after")
  data = path.read_bytes()
  assert data[:8] == PNG_SIGNATURE and len(data) > 1000


def test_compare_verdicts():
  before = {1: 0.20, 4: 0.50, 16: 0.80}
  assert "sharpened and narrowed" in evaluation.compare(before, {1: 0.40, 4: 0.60, 16: 0.70})
  text = evaluation.compare(before, {1: 0.40, 4: 0.60, 16: 0.80})
  assert "Verdict: sharpened:" in text and "pass@1 0.200 -> 0.400 (+0.200)" in text and "pass@16" in text
  assert "improved" in evaluation.compare(before, {1: 0.40, 4: 0.60, 16: 0.90})
  assert "regressed" in evaluation.compare(before, {1: 0.10, 4: 0.60, 16: 0.90})
  assert "narrowed: pass@16 fell" in evaluation.compare(before, {1: 0.20, 4: 0.50, 16: 0.60})
  assert "unchanged" in evaluation.compare(before, before)
  res = evaluation.evaluate(_fake_problems(), _sample_fn, _correct_fn, n=4, greedy_fn=_greedy_fn)
  assert "greedy accuracy 0.500 -> 0.500" in evaluation.compare(res, res)
