"""The entry point end to end: the sample config's smoke variant runs on a mesh and writes its samples."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FAKE_WANDB = ROOT / "tests" / "fake_wandb.py"  # a recording fake `wandb` module


def test_sample_smoke_runs(tmp_path):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  run = subprocess.run(
    [sys.executable, "-m", "rl_lm.main", "--config=configs/sample.py:smoke", f"--workdir={tmp_path}",
     "--config.sample.num_batches=2", "--config.mesh.data=2", "--config.mesh.tensor=4"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert "decode throughput" in run.stdout and "'data': 2" in run.stdout
  records = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
  assert len(records) == 2 * 8
  assert all(0 < r["length"] <= 8 and r["sum_logprob"] < 0 for r in records)


def test_a_run_writes_tensorboard_and_wandb_offline_that_read_back(tmp_path, jax_cache_env):
  """SFT then RL through the entry point with TensorBoard on and W&B offline: both logs hold every stage's
  metrics, equal to metrics.jsonl / sft_metrics.jsonl. TensorBoard is read back by its own loader; W&B is the
  recording fake tests/fake_wandb.py, copied as `wandb.py` to a folder first on PYTHONPATH, which writes every
  call to a JSONL file."""
  from rl_lm.metrics import read_jsonl, read_tensorboard

  fake_dir, calls_file = tmp_path / "fake_packages", tmp_path / "wandb_calls.jsonl"
  fake_dir.mkdir()
  shutil.copy(FAKE_WANDB, fake_dir / "wandb.py")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake_dir), str(ROOT)]),
             RL_LM_FAKE_WANDB_LOG=str(calls_file), **jax_cache_env)  # the session's compilation cache (conftest)
  run = subprocess.run(
    [sys.executable, "-m", "rl_lm.main", "--config=configs/default.py:smoke", f"--workdir={tmp_path}",
     "--config.sft.steps=4", "--config.sft.log_every=2", "--config.rl.steps=2", "--config.logging.tensorboard=True",
     "--config.logging.wandb_mode=offline", f"--config.export_dir={tmp_path / 'export'}", "--verbosity=-1"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert "W&B did not start" not in run.stderr
  # The run-health summary: in the console and in rl_summary.json (what fired, when, what it usually means).
  assert "run health: " in run.stdout
  health = json.loads((tmp_path / "rl_summary.json").read_text())["health"]
  assert set(health) == {"alarms", "notes", "patience"} and health["patience"] == 3
  # The final policy, exported as a Hugging Face folder, loads back to the same parameters.
  from rl_lm.models import hf

  assert f"rl_lm: exported the policy to {tmp_path / 'export'}" in run.stdout
  cfg, exported = hf.load(str(tmp_path / "export"))
  assert cfg.n_layers == 2 and sorted(os.listdir(tmp_path / "export")) == ["config.json", "model.safetensors"]
  sft_rows = read_jsonl(tmp_path / "sft_metrics.jsonl")
  rl_rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "rollout/reward_mean" in r]
  tb_sft, tb_rl = read_tensorboard(tmp_path / "tensorboard" / "sft"), read_tensorboard(tmp_path / "tensorboard" / "rl")
  assert [s for s, _ in tb_sft["train/loss"]] == [2, 4]
  np.testing.assert_allclose([v for _, v in tb_sft["train/loss"]], [r["train/loss"] for r in sft_rows], rtol=1e-6)
  np.testing.assert_allclose([v for _, v in tb_rl["rollout/reward_mean"]], [r["rollout/reward_mean"] for r in rl_rows],
                             rtol=1e-6)

  calls = [json.loads(line) for line in calls_file.read_text().splitlines()]
  ids = {stage: (tmp_path / f"wandb_run_id_{stage}.txt").read_text().strip() for stage in ("sft", "rl")}
  inits = {c["run"]: c["kwargs"] for c in calls if c["call"] == "init"}
  assert set(inits) == set(ids.values()) and len(inits) == 2  # one W&B run per stage
  assert all(inits[ids[stage]]["name"] == f"{tmp_path.name}-{stage}" for stage in ids)
  assert all(kw["mode"] == "offline" and kw["dir"] == str(tmp_path) for kw in inits.values())
  assert sorted(c["run"] for c in calls if c["call"] == "finish") == sorted(ids.values())  # each run finished

  def logged(stage, key):
    return [(c["step"], c["data"][key]) for c in calls if c["call"] == "log" and c["run"] == ids[stage]
            and key in c["data"]]

  wb_sft, wb_rl = logged("sft", "train/loss"), logged("rl", "rollout/reward_mean")
  assert wb_sft == [(r["step"], r["train/loss"]) for r in sft_rows] and [s for s, _ in wb_sft] == [2, 4]
  assert wb_rl == [(r["step"], r["rollout/reward_mean"]) for r in rl_rows]
  assert logged("rl", "eval/pass@1")  # the evaluations before and after RL
