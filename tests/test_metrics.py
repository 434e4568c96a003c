"""Metric writers: JSONL round trip, console line and ETA with a fake clock, W&B offline, run_info, plots."""

import io
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import metrics
from rl_lm.metrics import ConsoleProgress, JsonlWriter, MetricsWriter, MultiWriter, WandbWriter

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class FakeClock:
  def __init__(self, t=0.0):
    self.t = t

  def __call__(self):
    return self.t


def test_scalarize():
  out = metrics.scalarize({"a": jnp.float32(0.5), "b": np.int64(3), "c": np.array([2.5]), "d": True, "e": "rl",
                           "f": jnp.array(True)})
  assert out == {"a": 0.5, "b": 3, "c": 2.5, "d": True, "e": "rl", "f": True}
  assert type(out["a"]) is float and type(out["b"]) is int
  with pytest.raises(ValueError, match="'v'.*shape"):
    metrics.scalarize({"v": np.zeros(3)})


def test_jsonl_round_trip(tmp_path):
  path = tmp_path / "sub" / "metrics.jsonl"
  with JsonlWriter(path) as w:
    assert isinstance(w, MetricsWriter)
    w.write(1, {"rollout/reward_mean": jnp.float32(0.25), "eval/pass@1": np.float64(0.5), "n": np.int32(7)})
    # Flushed at every write: readable before close.
    assert json.loads(path.read_text().splitlines()[0]) == {"step": 1, "rollout/reward_mean": 0.25,
                                                             "eval/pass@1": 0.5, "n": 7}
    w.write(2, {"train/loss": float("nan"), "train/grad_norm": jnp.float32(jnp.inf), "x": -math.inf})
  lines = path.read_text().splitlines()
  assert len(lines) == 2
  raw = json.loads(lines[1])  # strict JSON: non-finite values are strings
  assert raw == {"step": 2, "train/loss": "nan", "train/grad_norm": "inf", "x": "-inf"}
  recs = metrics.read_jsonl(path)
  assert recs[0]["rollout/reward_mean"] == 0.25 and recs[0]["n"] == 7
  assert math.isnan(recs[1]["train/loss"]) and recs[1]["train/grad_norm"] == math.inf and recs[1]["x"] == -math.inf
  # Appends on reopen (resume).
  with JsonlWriter(path) as w:
    w.write(3, {"a": 1.0})
  assert [r["step"] for r in metrics.read_jsonl(path)] == [1, 2, 3]
  with pytest.raises(RuntimeError, match="closed"):
    w.write(4, {})


def test_format_helpers():
  assert metrics.format_duration(42) == "42s"
  assert metrics.format_duration(224) == "3m44s"
  assert metrics.format_duration(7380) == "2h03m"
  assert metrics.format_duration(math.inf) == "?"
  assert metrics.format_value(0.41) == "0.41" and metrics.format_value(0.0123) == "0.0123"
  assert metrics.format_value(1234.6) == "1235" and metrics.format_value(3.2e-5) == "3.20e-05"
  assert metrics.format_value(0.0) == "0" and metrics.format_value(7) == "7"


def test_console_line_and_eta_with_fake_clock():
  clock, out = FakeClock(), io.StringIO()
  bar = ConsoleProgress(200, keys=("rollout/reward_mean", "rollout/pass_rate", "policy/kl_ref_k3", "custom/thing"),
                        stream=out, clock=clock)
  dt = 1 / 0.84  # seconds per step
  for step in range(1, 13):
    clock.t += dt
    bar.write(step, {"rollout/reward_mean": 0.41, "rollout/pass_rate": np.float32(0.38),
                     "policy/kl_ref_k3": jnp.float32(0.012), "custom/thing": 3, "other": 1.0})
  lines = out.getvalue().splitlines()
  assert len(lines) == 12
  assert lines[-1] == "step 12/200 (6%) | 0.84 steps/s | ETA 3m44s | reward 0.41 | pass 0.38 | kl 0.012 | thing 3"
  clock.t += dt
  bar.update(13, {})  # alias of write
  assert out.getvalue().splitlines()[-1] == "step 13/200 (6%) | 0.84 steps/s | ETA 3m43s"
  bar.log("ALARM policy/entropy=0.012 < 0.05: entropy collapsed")
  assert out.getvalue().splitlines()[-1].startswith("ALARM policy/entropy")


def test_console_ema_and_every():
  clock, out = FakeClock(), io.StringIO()
  bar = ConsoleProgress(100, keys=(), every=5, stream=out, clock=clock, smoothing=0.5)
  clock.t = 10.0  # first interval (includes compilation): 10 s for step 1
  bar.write(1, {})
  assert bar.step_time == 10.0 and out.getvalue() == ""  # step 1 is not a multiple of 5
  clock.t = 12.0  # steps 2..5 in 2 s: 0.5 s per step
  bar.write(5, {})
  assert bar.step_time == pytest.approx(0.5 * 10.0 + 0.5 * 0.5)
  assert out.getvalue().strip() == "step 5/100 (5%) | 0.19 steps/s | ETA 8m19s"  # 95 steps x 5.25 s
  clock.t = 13.0
  bar.write(100, {})  # the last step always prints
  assert out.getvalue().splitlines()[-1].startswith("step 100/100 (100%)")
  assert out.getvalue().splitlines()[-1].endswith("ETA 0s")


def test_console_without_total():
  clock, out = FakeClock(), io.StringIO()
  bar = ConsoleProgress(None, keys=("train/loss",), stream=out, clock=clock)
  clock.t = 2.0
  bar.write(1, {"train/loss": 1.5})
  assert out.getvalue().strip() == "step 1 | 0.5 steps/s | loss 1.5"


def test_multi_writer(tmp_path):
  out = io.StringIO()
  console = ConsoleProgress(10, keys=("a",), stream=out, clock=FakeClock())
  jsonl = JsonlWriter(tmp_path / "m.jsonl")
  multi = MultiWriter([jsonl, console])
  multi.write(1, {"a": 0.5})
  multi.log("hello")
  multi.close()
  assert metrics.read_jsonl(tmp_path / "m.jsonl") == [{"step": 1, "a": 0.5}]
  assert out.getvalue().splitlines() == ["step 1/10 (10%) | a 0.5", "hello"]


def test_wandb_disabled_does_nothing(tmp_path):
  w = WandbWriter("proj", mode="disabled", dir=tmp_path)
  w.write(1, {"a": 1.0})
  w.close()
  assert list(tmp_path.iterdir()) == []
  with pytest.raises(ValueError, match="mode"):
    WandbWriter("proj", mode="cloud")


def test_wandb_offline_run(tmp_path, monkeypatch):
  for var, sub in (("WANDB_DIR", "wb"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                   ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
    monkeypatch.setenv(var, str(tmp_path / sub))
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.chdir(tmp_path)
  w = WandbWriter("rl_lm-test", name="unit", mode="offline", dir=tmp_path / "wb", config={"algo": "grpo", "lr": 1e-6})
  for step in range(3):
    w.write(step, {"rollout/reward_mean": jnp.float32(0.1 * step), "train/loss": float("nan"), "stage": "rl"})
  w.close()
  w.close()  # idempotent
  runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
  assert len(runs) == 1
  files = list(runs[0].glob("*.wandb"))
  assert len(files) == 1 and files[0].stat().st_size > 0
  assert b"rollout/reward_mean" in files[0].read_bytes()


def test_run_info(tmp_path):
  class FakeConfigDict:
    def to_dict(self):
      return {"algo": "grpo", "model": {"preset": "tiny"}, "stages": ("sft", "rl")}

  path = metrics.write_run_info(tmp_path / "run", FakeConfigDict())
  info = json.loads(path.read_text())
  assert path.name == "run_info.json"
  assert {"config", "git_commit", "jax_version", "devices", "process_count", "hostname", "start_time"} <= set(info)
  assert info["config"] == {"algo": "grpo", "model": {"preset": "tiny"}, "stages": ["sft", "rl"]}
  assert info["git_commit"] == "unknown" or len(info["git_commit"]) == 40
  assert info["process_count"] == 1 and info["devices"] and all(isinstance(d, str) for d in info["devices"])
  assert metrics.git_commit(tmp_path) == "unknown"  # not a repository
  assert metrics.run_info({"x": 1})["config"] == {"x": 1}


def test_plot_curves(tmp_path):
  path = tmp_path / "metrics.jsonl"
  with JsonlWriter(path) as w:
    for step in range(1, 21):
      w.write(step, {"rollout/reward_mean": step / 20, "policy/kl_ref_k3": 0.001 * step,
                     "train/loss": float("nan") if step == 5 else 1.0 / step})
  out = metrics.plot_curves(path, ["rollout/reward_mean", "policy/kl_ref_k3", "train/loss", "missing/key"],
                            tmp_path / "plots" / "curves.png", title="run")
  data = out.read_bytes()
  assert data[:8] == PNG_SIGNATURE and len(data) > 1000
