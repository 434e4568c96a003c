"""Run health: patience, alarms vs notes, the summary, resume, and the calibration's failure step and lead time."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from experiments.alarms import calibration
from rl_lm import health
from rl_lm.config import AlarmConfig
from rl_lm.runs import ROOT

HEALTHY = {"policy/entropy": 0.2, "policy/kl_ref_k1": 0.1, "train/grad_norm": 3.0, "rollout/reward_std": 0.4,
           "rollout/pass_rate": 0.6, "groups/zero_variance_frac": 0.1, "rollout/truncation_rate": 0.0,
           "offpolicy/logprob_gap_mean_abs": 1e-7, "offpolicy/is_weight_max": 1.0}


def _steps(monitor: health.Monitor, values: list[dict], start: int = 1) -> list[tuple[int, list[str]]]:
  return [(s, monitor.update(s, {**HEALTHY, **v})) for s, v in enumerate(values, start)]


def test_a_condition_is_reported_once_after_patience_steps_and_again_after_it_clears():
  m = health.Monitor(AlarmConfig(patience=3))
  high = {"policy/kl_ref_k1": 0.9}
  out = dict(_steps(m, [high, high, {}, high, high, high, high, {}, high, high, high]))
  assert out[1] == out[2] == out[4] == out[5] == []  # a broken streak starts again
  assert out[6] == ["ALARM step 6: policy/kl_ref_k1=0.9 > 0.5: policy drifted far from the reference (3 steps)"]
  assert out[7] == out[8] == []  # once per spell
  assert out[11] and out[11][0].startswith("ALARM step 11")
  (rec,) = m.summary()["alarms"]
  assert (rec["rule"], rec["first_step"], rec["last_step"], rec["steps"], rec["episodes"]) == ("kl_ref", 6, 11, 7, 2)
  assert rec["worst"] == 0.9 and "over-optimisation" in rec["usually"]


def test_notes_are_not_alarms_and_a_gradient_spike_needs_no_patience():
  m = health.Monitor(AlarmConfig(patience=2))
  zero = {"groups/zero_variance_frac": 0.9}
  out = dict(_steps(m, [zero, {**zero, "train/grad_norm": 400}]))
  assert out[1] == []
  assert out[2][0] == "ALARM step 2: train/grad_norm=400 > 50: gradients blew up (1 step)"
  assert out[2][1].startswith("NOTE step 2: groups/zero_variance_frac=0.9 > 0.8")
  s = m.summary()
  assert [a["rule"] for a in s["alarms"]] == ["grad_norm"] and [n["rule"] for n in s["notes"]] == ["zero_variance"]
  lines = m.summary_lines()
  assert lines[0] == "run health: 1 alarm(s), 1 note(s)" and "Usually:" in lines[1]
  assert health.Monitor().summary_lines() == ["run health: no alarm, no note"]


def test_sampler_gap_is_an_alarm_without_importance_weights_and_a_note_with_them():
  gap = {"offpolicy/logprob_gap_mean_abs": 0.01}
  corrected = {**HEALTHY, **gap}
  uncorrected = {k: v for k, v in corrected.items() if k != "offpolicy/is_weight_max"}
  assert health.check(corrected, kinds=("alarm",)) == []
  assert health.check(corrected, kinds=("note",))[0].startswith("NOTE offpolicy/logprob_gap_mean_abs=0.01")
  assert health.check(uncorrected)[0].startswith("ALARM offpolicy/logprob_gap_mean_abs=0.01 > 0.001")
  assert health.check({**uncorrected, "offpolicy/staleness_max": 1.0}) == []  # stale rows: the policy's own change


def test_constant_reward_alarms_unless_everything_is_solved():
  broken = {**HEALTHY, "rollout/reward_std": 0.0, "rollout/pass_rate": 0.0}
  assert health.check(broken) == ["ALARM rollout/reward_std=0 <= 1e-06: every reward in the batch is the same"]
  assert health.check({**broken, "rollout/pass_rate": 1.0}) == []


def test_non_finite_is_immediate_and_the_state_survives_a_resume():
  m = health.Monitor(AlarmConfig(patience=3))
  assert m.update(1, {**HEALTHY, "train/loss": math.nan}) == ["ALARM step 1: non-finite train/loss"]
  _steps(m, [{"policy/entropy": 0.001}] * 2, start=2)
  state = json.loads(json.dumps(m.state_dict()))  # what the checkpoint stores
  resumed = health.Monitor(AlarmConfig(patience=3))
  resumed.load_state_dict(state)
  assert resumed.update(4, {**HEALTHY, "policy/entropy": 0.001})[0].startswith("ALARM step 4: policy/entropy")
  assert [a["rule"] for a in resumed.summary()["alarms"]] == ["non_finite", "entropy"]


def _write_run(root, name, steps, evals):
  d = root / name
  d.mkdir(parents=True)
  rows = [{"step": s, "eval/pass@1": p} for s, p in evals.items()]
  rows += [{"step": s, **HEALTHY, **v} for s, v in enumerate(steps, 1)]
  (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in sorted(rows, key=lambda r: r["step"])) + "\n")


def test_calibration_reads_failure_steps_lead_times_and_false_positives(tmp_path):
  """Two healthy default runs and the lr x30 failure, by hand: the failure leaves the healthy band at step 10,
  the KL alarm is printed at step 6 (patience 3 from step 4): lead 4; a healthy run's spike is a false positive."""
  evals_ok = {0: 0.5, 5: 0.6, 10: 0.7, 15: 0.72}
  _write_run(tmp_path, "default_s0", [{}] * 15, evals_ok)
  _write_run(tmp_path, "default_s1", [{}] * 6 + [{"policy/kl_ref_k1": 0.8}] * 3 + [{}] * 6, evals_ok)
  _write_run(tmp_path, "fail_lr30", [{}] * 3 + [{"policy/kl_ref_k1": 2.0}] * 12, {0: 0.5, 5: 0.58, 10: 0.3, 15: 0.1})
  result = calibration.calibrate(tmp_path)
  by_name = {r["name"]: r for r in result["runs"]}
  assert by_name["fail_lr30"]["failure_step"] == 10  # 0.58 is within 0.05 of the band at step 5; 0.3 is not
  assert by_name["fail_lr30"]["alarms"] == {"kl_ref": 6} and by_name["fail_lr30"]["lead"] == 4
  assert by_name["default_s1"]["alarms"] == {"kl_ref": 9}
  kl = next(r for r in result["rules"] if r["rule"] == "kl_ref")
  assert (kl["flagged"], kl["false_positives"], kl["precision"], kl["leads"]) == (1, 1, 0.5, [4])
  assert kl["healthy_extreme"] == 0.8  # held for 3 steps in default_s1
  assert kl["recall"] == 1.0  # the one failure in this workdir
  table = calibration.write(result, tmp_path / "out")
  assert "| fail_lr30 | failure | kl_ref (6) |" in table and (tmp_path / "out" / "calibration.json").exists()


@pytest.mark.slow
def test_the_alarm_set_runs_end_to_end_on_smoke_variants(tmp_path, jax_cache_env):
  """`python -m experiments.alarms.run --smoke` on a healthy run and the length-bug failure (its own config file
  and the `length` reward): both finish, and the table and the run-health summaries are written."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), **jax_cache_env)
  run = subprocess.run([sys.executable, "-m", "experiments.alarms.run", f"--workdir={tmp_path}", "--smoke",
                        "--parallel=1", "--only=default_s0,fail_length"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "fail_length done" in run.stdout and "default_s0 done" in run.stdout
  result = json.loads((tmp_path / "calibration.json").read_text())
  assert sorted(r["name"] for r in result["runs"]) == ["default_s0", "fail_length"]
  for name in ("default_s0", "fail_length"):
    assert "health" in json.loads((tmp_path / name / "rl_summary.json").read_text())
  log = (tmp_path / "fail_length" / "log.txt").read_text()
  assert "experiments/alarms/length_bug.py" in log and "run health:" in log


def test_a_step_without_rules_checks_finiteness_and_keeps_the_streaks():
  """On-policy distillation's steps on the teacher's samples: no rule counts them, a NaN still alarms."""
  monitor = health.Monitor(AlarmConfig(patience=2))
  high = {"policy/kl_ref_k1": 5.0}
  assert monitor.update(1, high) == []
  assert monitor.update(2, {"train/loss": float("nan")}, rules=False)[0].startswith("ALARM step 2: non-finite")
  assert any("policy/kl_ref_k1" in line for line in monitor.update(3, high))  # the streak went on: 2 steps
