"""The issue-16 reproductions: the KL-frontier gradient algebra, the length-bias and pass@k read-outs, and each
experiment's one command end to end on smoke variants."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.kl_frontier import gradients
from experiments.kl_frontier import run as kl_frontier
from experiments.length_bias import run as length_bias
from experiments.pass_at_k import run as pass_at_k
from rl_lm.runs import ROOT


def _pairs(n: int = 5, vocab: int = 7, scale: float = 1.0):
  rng = np.random.default_rng(1)
  for _ in range(n):
    t = rng.normal(size=vocab) * 2
    yield jnp.asarray(t, jnp.float32), jnp.asarray(t + rng.normal(size=vocab) * scale, jnp.float32)


def test_expected_kl_gradients_match_the_algebra():
  """loss k1 = 0; loss k2 = reward k1 = grad KL(pi||ref); loss k3 = grad KL(ref||pi); reward k3 = the difference of
  the two; and each against a hand-written expectation over the support."""
  for theta, phi in _pairs():
    fwd, rev = jax.grad(gradients.kl_forward)(theta, phi), jax.grad(gradients.kl_reverse)(theta, phi)
    g = {(pl, k): gradients.expected_gradient(theta, phi, pl, k) for pl in gradients.PLACEMENTS for k in ("k1", "k2",
                                                                                                           "k3")}
    np.testing.assert_allclose(g["loss", "k1"], 0.0, atol=1e-6)
    np.testing.assert_allclose(g["loss", "k2"], fwd, atol=1e-5)
    np.testing.assert_allclose(g["reward", "k1"], fwd, atol=1e-5)
    np.testing.assert_allclose(g["loss", "k3"], rev, atol=1e-5)
    np.testing.assert_allclose(g["reward", "k3"], fwd - rev, atol=1e-5)
    # reward k2 by hand: sum_x pi(x) (log r)^2 / 2 * grad log pi(x), grad_theta log pi(x) = e_x - pi
    p, logr = jax.nn.softmax(theta), jax.nn.log_softmax(phi) - jax.nn.log_softmax(theta)
    hand = sum(p[x] * logr[x] ** 2 / 2 * (jnp.eye(len(p))[x] - p) for x in range(len(p)))
    np.testing.assert_allclose(g["reward", "k2"], hand, atol=1e-5)
  rows = {(r["placement"], r["estimator"]): r for r in gradients.table(vocab=8, draws=4)}
  assert rows["loss", "k1"]["cos_forward"] == 0.0 and rows["loss", "k1"]["norm_ratio"] < 1e-4
  assert rows["loss", "k2"]["cos_forward"] > 0.999 and rows["reward", "k1"]["cos_forward"] > 0.999
  assert rows["loss", "k3"]["cos_reverse"] > 0.999
  with pytest.raises(ValueError, match="placement"):
    gradients.expected_gradient(theta, phi, "advantage", "k1")


def test_frontier_points_and_interpolation():
  pts = kl_frontier.points()
  assert len({p["name"] for p in pts}) == len(pts) == 22
  fixed = [p["coef"] for p in pts if p["family"] == "reward k1, fixed"]
  assert max(fixed) / min(fixed) >= 100  # two orders of magnitude
  assert {p["family"] for p in pts} >= {"no KL", "reward k1, adaptive", "loss k1, fixed", "loss k2, fixed",
                                        "loss k3, fixed", "reward k2, fixed", "reward k3, fixed"}
  curve = [{"kl": 1.0, "gold": 0.0}, {"kl": 4.0, "gold": 1.0}, {"kl": 0.0, "gold": 9.0}]  # KL 0 has no log
  assert kl_frontier.frontier_at(curve, "gold", 2.0) == pytest.approx(0.5)  # halfway in log KL
  assert kl_frontier.frontier_at(curve, "gold", 8.0) is None


def test_length_bias_read_out(tmp_path):
  rows = [{"step": s, "rollout/pass_rate": rate, "rollout/response_length_mean": 5.0,
           "rollout/response_length_correct": c, "rollout/response_length_incorrect": i}
          for s, (rate, c, i) in enumerate([(0.0, 0.0, 4.0), (0.5, 3.0, 6.0), (1.0, 5.0, 0.0)], 1)]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{"step": 0, "eval/pass@1": 0}, *rows]))
  (tmp_path / "rl_summary.json").write_text(json.dumps({"before": {"pass_at_k": {"1": 0.25}},
                                                        "after": {"pass_at_k": {"1": 0.5}}}))
  run = length_bias.read_run(tmp_path)
  assert run["steps"] == [1, 2, 3] and run["pass1_after"] == 0.5
  np.testing.assert_equal(run["correct"], [np.nan, 3.0, 5.0])  # no correct completion at step 1
  np.testing.assert_equal(run["incorrect"], [4.0, 6.0, np.nan])
  assert length_bias.change(run["incorrect"], 1) == (4.0, 6.0)
  np.testing.assert_allclose(length_bias.smooth(run["correct"], 2), [np.nan, 3.0, 4.0])
  table = [{"seed": 0, "algorithm": "GRPO", "incorrect_first": 10.0, "incorrect_last": 14.0},
           {"seed": 0, "algorithm": "Dr. GRPO", "incorrect_first": 10.0, "incorrect_last": 10.5}]
  assert length_bias.verdict(table).startswith("Reproduced on 1/1 seeds")
  table[1]["incorrect_last"] = 15.0
  assert length_bias.verdict(table).startswith("Not reproduced")


def test_pass_at_k_crossing_and_coverage():
  assert pass_at_k.crossing([0.2, 0.4, 0.5, 0.6], [0.4, 0.5, 0.5, 0.55]) == pytest.approx(3.0)
  k = pass_at_k.crossing([0.2, 0.4], [0.3, 0.3])  # after - before: +0.1 at k = 1, -0.1 at k = 2: halfway in log k
  assert k == pytest.approx(math.sqrt(2))
  assert pass_at_k.crossing([0.5, 0.6], [0.4, 0.7]) is None  # after starts below
  assert pass_at_k.crossing([0.1, 0.2], [0.3, 0.4]) is None  # no crossing inside the range
  summary = {"before": {"correct_counts": [0, 2, 4], "valid_counts": [4, 4, 4]},
             "after": {"correct_counts": [1, 4, 0], "valid_counts": [4, 4, 4]}}
  out = pass_at_k.curves(summary, 4)
  np.testing.assert_allclose(out["before"][0], (0 + 0.5 + 1) / 3)
  np.testing.assert_allclose(out["after"][3], 2 / 3)  # pass@4 of 4 samples: solved at all
  assert (out["solved_before"], out["solved_after"], out["lost"], out["gained"]) == (2, 2, 1, 1)


def _run(args: list[str], tmp_path, env: dict[str, str]) -> subprocess.CompletedProcess:
  run = subprocess.run([sys.executable, "-m", *args, f"--workdir={tmp_path}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, PYTHONPATH=str(ROOT), **env))
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
  return run


@pytest.mark.slow
def test_kl_frontier_runs_end_to_end(tmp_path, jax_cache_env):
  """The base stages, one PPO point with k3 in the loss, the table, JSON and plot."""
  _run(["experiments.kl_frontier.run", "--smoke", "--parallel=1", "--only=loss_k3_c0.3"], tmp_path, jax_cache_env)
  result = json.loads((tmp_path / "kl_frontier.json").read_text())
  (point,) = result["runs"]
  assert point["name"] == "loss_k3_c0.3" and point["kl"] >= 0 and math.isfinite(point["gold"])
  assert len(result["gradients"]) == 6 and (tmp_path / "kl_frontier.png").stat().st_size > 10_000
  assert "loss k3, fixed" in (tmp_path / "kl_frontier.md").read_text()


@pytest.mark.slow
def test_length_bias_runs_end_to_end(tmp_path, jax_cache_env):
  """One seed: its SFT run, then GRPO and Dr. GRPO from it; the table and the plot."""
  run = _run(["experiments.length_bias.run", "--smoke", "--parallel=1", "--seeds=0"], tmp_path, jax_cache_env)
  result = json.loads((tmp_path / "length_bias.json").read_text())
  assert sorted(r["algorithm"] for r in result["table"]) == ["Dr. GRPO", "GRPO"]
  log = (tmp_path / "dr_grpo_seed0" / "log.txt").read_text()
  assert "rl.algorithm=dr_grpo" in log and "sft_seed0/checkpoints/sft" in log
  assert (tmp_path / "length_bias.png").stat().st_size > 10_000 and "reproduced" in run.stdout.lower()


@pytest.mark.slow
def test_pass_at_k_runs_end_to_end(tmp_path, jax_cache_env):
  """One seed of the worked task with 8 held-out samples: curves to k = 8 before and after, the table and the plot."""
  _run(["experiments.pass_at_k.run", "--smoke", "--parallel=1", "--seeds=0", "--samples=8", "--tasks=worked"],
       tmp_path, jax_cache_env)
  results = json.loads((tmp_path / "pass_at_k.json").read_text())["results"]
  assert list(results) == ["worked multi-step arithmetic (configs/worked.py)"]
  for seeds in results.values():
    r = seeds["0"]
    assert len(r["before"]) == len(r["after"]) == 8
    assert all(a <= b + 1e-12 for a, b in zip(r["after"], r["after"][1:], strict=False))  # pass@k rises with k
  assert (tmp_path / "pass_at_k.png").stat().st_size > 10_000


@pytest.mark.slow
def test_distillation_runs_end_to_end(tmp_path, jax_cache_env):
  """One seed: the teacher run, then on-policy and off-policy distillation from its SFT; the table, JSON and plot."""
  run = _run(["experiments.distill.run", "--smoke", "--seeds=0", "--arms=onpolicy,offpolicy"], tmp_path,
             jax_cache_env)
  result = json.loads((tmp_path / "distill.json").read_text())
  arms = result["seeds"]["0"]["arms"]
  assert sorted(arms) == ["offpolicy", "onpolicy"] and [p["step"] for p in arms["offpolicy"]] == [0, 20]
  assert arms["onpolicy"][0]["step"] == 0 and arms["onpolicy"][-1]["tokens"] > 0
  log = (tmp_path / "seed0" / "onpolicy" / "log.txt").read_text()
  assert "teacher: " in log and "seed0/teacher/checkpoints/rl" in log
  assert (tmp_path / "seed0" / "offpolicy" / "teacher_samples.jsonl").exists()
  assert (tmp_path / "distill.png").stat().st_size > 10_000 and "steps to 90%" in run.stdout


@pytest.mark.slow
def test_rlaif_runs_end_to_end(tmp_path, jax_cache_env):
  """One seed: the judge, its measurement on held-out pairs, PPO on a reward model of its labels and on its direct
  score (the gold measured beside the proxy); the table, JSON and plot."""
  run = _run(["experiments.rlaif.run", "--smoke", "--seeds=0", "--arms=ai_labels,direct"], tmp_path, jax_cache_env)
  result = json.loads((tmp_path / "rlaif.json").read_text())["seeds"]["0"]
  assert set(result["judge"]) >= {"judge/agreement_gold", "judge/first_rate", "judge/flip_rate", "judge/longer_rate"}
  assert sorted(result["arms"]) == ["ai_labels", "direct"]
  for arm in ("ai_labels", "direct"):
    steps = result["arms"][arm]
    assert len(steps) == 3 and all(np.isfinite(p["gold"]) and np.isfinite(p["proxy"]) for p in steps), steps
  labels = json.loads((tmp_path / "seed0" / "ai_labels" / "judge_labels.json").read_text())
  assert labels["judge/pairs"] + labels["judge/dropped"] == 256
  assert "position bias over" in (tmp_path / "seed0" / "direct" / "log.txt").read_text()
  assert (tmp_path / "rlaif.png").stat().st_size > 10_000 and "held-out gold after PPO" in run.stdout
