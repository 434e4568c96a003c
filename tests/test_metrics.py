"""Metric writers: JSONL round trip, console line and ETA with a fake clock, TensorBoard written and read back,
W&B through a recording fake `wandb` (tests/fake_wandb.py) checked against the real API, the real W&B offline,
per-stage writers with W&B resume, run_info, plots."""

import importlib.util
import inspect
import io
import json
import math
import sys
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from tensorboard.summary.writer.record_writer import RecordWriter

from rl_lm import metrics
from rl_lm.metrics import ConsoleProgress, JsonlWriter, MetricsWriter, MultiWriter, TensorBoardWriter, WandbWriter

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


FAKE_WANDB = Path(__file__).parent / "fake_wandb.py"


@pytest.fixture
def fake_wandb(monkeypatch):
  """The recording stand-in tests/fake_wandb.py as `wandb`, fresh for each test: its calls are in `.calls`."""
  spec = importlib.util.spec_from_file_location("wandb", FAKE_WANDB)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  monkeypatch.setitem(sys.modules, "wandb", module)
  monkeypatch.delenv("RL_LM_FAKE_WANDB_LOG", raising=False)
  return module


def _logged(calls, run_id):
  """`[(step, data), ...]` of the `log` calls of run `run_id`, in call order."""
  return [(c["step"], c["data"]) for c in calls if c["call"] == "log" and c["run"] == run_id]


def test_wandb_disabled_does_nothing(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` would raise: disabled never imports it
  w = WandbWriter("proj", mode="disabled", dir=tmp_path)
  w.write(1, {"a": 1.0})
  w.close()
  assert list(tmp_path.iterdir()) == []
  with pytest.raises(ValueError, match="mode"):
    WandbWriter("proj", mode="cloud")


def test_wandb_writer_logs_numeric_values_at_their_steps(tmp_path, fake_wandb):
  w = WandbWriter("rl_lm-test", name="unit", mode="offline", dir=tmp_path / "wb", config={"algo": "grpo", "lr": 1e-6})
  assert (tmp_path / "wb").is_dir()  # created for W&B
  run_id = w.run.id
  steps = (0, 5, 20)
  for step in steps:
    w.write(step, {"rollout/reward_mean": jnp.float32(0.1 * step), "train/loss": float("nan"), "stage": "rl",
                   "flag": step == 5, "n": np.int64(step)})
  w.close()
  w.close()  # idempotent
  w.write(21, {"a": 1.0})  # after close: nothing
  calls = fake_wandb.calls
  assert [c["call"] for c in calls] == ["init", "log", "log", "log", "finish"]
  assert calls[0]["kwargs"] == {"project": "rl_lm-test", "name": "unit", "mode": "offline", "dir": str(tmp_path / "wb"),
                                "config": {"algo": "grpo", "lr": 1e-6}}
  # Every numeric value at its step, as a plain Python number; strings are not sent.
  logged = _logged(calls, run_id)
  assert [s for s, _ in logged] == list(steps)
  for step, data in logged:
    assert set(data) == {"rollout/reward_mean", "train/loss", "flag", "n"}
    assert data["rollout/reward_mean"] == float(np.float32(0.1 * step)) and type(data["rollout/reward_mean"]) is float
    assert math.isnan(data["train/loss"])
    assert data["flag"] is (step == 5) and data["n"] == step and type(data["n"]) is int


def test_fake_wandb_matches_the_real_api(tmp_path, fake_wandb, monkeypatch):
  """What rl_lm calls on the fake, the real wandb accepts: `init`'s keywords bind to its signature, and a run has
  the same `log` / `finish` parameters and the attributes read (`id`, `name`, `project`, `config`)."""
  for _ in range(2):  # a new run, then a resumed one (id=..., resume="allow")
    (wb,) = metrics.stage_writers(_config(tensorboard=False), tmp_path, "rl")
    wb.write(1, {"a": 1.0})
    wb.close()
  monkeypatch.delitem(sys.modules, "wandb")
  import wandb as real

  inits = [c["kwargs"] for c in fake_wandb.calls if c["call"] == "init"]
  assert len(inits) == 2 and inits[1]["resume"] == "allow"
  for kwargs in inits:
    inspect.signature(real.init).bind(**kwargs)
  for name in ("log", "finish"):
    fake_params = inspect.signature(getattr(fake_wandb.Run, name)).parameters
    assert list(fake_params) == list(inspect.signature(getattr(real.Run, name)).parameters)
  assert all(hasattr(real.Run, a) for a in ("id", "name", "project", "config"))


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
  """The real W&B, offline, its folders (cache, config, ...) inside tmp_path."""
  for var, sub in (("WANDB_DIR", "wb"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                   ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
    monkeypatch.setenv(var, str(tmp_path / sub))
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.chdir(tmp_path)


def test_real_wandb_offline_run_is_resumed_under_its_id(tmp_path, wandb_env):
  """The real wandb, offline: a stage's run is a folder for `wandb sync`, `offline-run-<time>-<id>`; a restart
  resumes the same run id, in a second folder. (What was logged is W&B's to read: see the fake's tests.)"""
  workdir = tmp_path / "run1"
  (wb,) = metrics.stage_writers(_config(tensorboard=False), workdir, "rl")
  assert wb.run.name == "run1-rl" and wb.run.config["algo"] == "grpo"
  run_id = wb.run.id
  wb.write(1, {"rollout/reward_mean": 0.25, "stage": "rl"})
  wb.close()
  (wb,) = metrics.stage_writers(_config(tensorboard=False), workdir, "rl")
  assert wb.run.id == run_id
  wb.write(2, {"rollout/reward_mean": 0.5})
  wb.close()
  runs = sorted((workdir / "wandb").glob("offline-run-*"))  # offline-run-<time>-<id>[-1]: one folder per start
  assert len(runs) == 2 and all(f"-{run_id}" in p.name for p in runs)
  assert all(len(list(p.glob("*.wandb"))) == 1 for p in runs)


def test_tensorboard_round_trip(tmp_path):
  logdir = tmp_path / "tb" / "rl"
  with TensorBoardWriter(logdir) as w:
    assert isinstance(w, MetricsWriter)
    for step in (1, 2, 3):
      w.write(step, {"rollout/reward_mean": 0.25 * step, "eval/pass@1": jnp.float32(0.5), "n": np.int32(7 * step),
                     "flag": step == 2, "stage": "rl", "train/loss": float("nan") if step == 2 else -1.5})
    # Flushed at every write: readable while the writer is open.
    assert metrics.read_tensorboard(logdir)["rollout/reward_mean"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    w.write(4, {"lr": 0.1, "inf": -math.inf})
  got = metrics.read_tensorboard(logdir)
  assert set(got) == {"rollout/reward_mean", "eval/pass@1", "n", "flag", "train/loss", "lr", "inf"}  # no strings
  assert got["rollout/reward_mean"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
  assert got["eval/pass@1"] == [(1, 0.5), (2, 0.5), (3, 0.5)]
  assert got["n"] == [(1, 7.0), (2, 14.0), (3, 21.0)]
  assert got["flag"] == [(1, 0.0), (2, 1.0), (3, 0.0)]
  assert got["train/loss"][0] == (1, -1.5) and math.isnan(got["train/loss"][1][1]) and got["train/loss"][2] == (3, -1.5)
  assert got["lr"] == [(4, float(np.float32(0.1)))]  # TensorBoard scalars are float32
  assert got["inf"] == [(4, -math.inf)]
  with pytest.raises(RuntimeError, match="closed"):
    w.write(5, {"a": 1.0})

  # A resumed run adds a file; a step written again keeps its last value.
  with TensorBoardWriter(logdir) as w2:
    w2.write(3, {"rollout/reward_mean": 2.0})
    w2.write(4, {"rollout/reward_mean": 3.0})
  assert len(list(logdir.glob("events.out.tfevents.*"))) == 2
  assert metrics.read_tensorboard(logdir)["rollout/reward_mean"] == [(1, 0.25), (2, 0.5), (3, 2.0), (4, 3.0)]

  # A record cut short by a killed writer is ignored; a corrupted one ends the reading of its file.
  buf = io.BytesIO()
  RecordWriter(buf).write(b"x" * 100)
  with open(w2.path, "ab") as f:
    f.write(buf.getvalue()[:50])
  assert metrics.read_tensorboard(logdir)["rollout/reward_mean"] == [(1, 0.25), (2, 0.5), (3, 2.0), (4, 3.0)]
  data = bytearray(w.path.read_bytes())
  data[-6] ^= 0xFF  # inside the last event of the first file (step 4)
  w.path.write_bytes(bytes(data))
  assert "lr" not in metrics.read_tensorboard(logdir)
  with pytest.raises(FileNotFoundError):
    metrics.read_tensorboard(tmp_path)


def test_read_tensorboard_tensor_scalars(tmp_path):
  # What tf.summary.scalar writes: a scalar tensor tagged for the scalars plugin.
  from tensorboard.compat.proto import event_pb2, summary_pb2
  from tensorboard.plugins.scalar import metadata
  from tensorboard.util import tensor_util

  def value(tag, x):
    return summary_pb2.Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(tag, ""),
                                     tensor=tensor_util.make_tensor_proto(x))

  w = TensorBoardWriter(tmp_path)
  for step in (1, 2):
    w._write_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[
      value("f", np.float32(0.5 * step)), value("d", np.float64(0.1 * step))])))
  w._write_event(event_pb2.Event(step=3, summary=summary_pb2.Summary(value=[  # not a scalar: left out
    summary_pb2.Summary.Value(tag="text", tensor=tensor_util.make_tensor_proto(np.array([b"x"])))])))
  w.close()
  assert metrics.read_tensorboard(tmp_path) == {"f": [(1, 0.5), (2, 1.0)], "d": [(1, 0.1), (2, 0.2)]}


def _config(tensorboard=True, wandb_mode="offline"):
  return ml_collections.ConfigDict({"algo": "grpo", "logging": {"tensorboard": tensorboard, "wandb_mode": wandb_mode,
                                                                "wandb_project": "rl_lm-test"}})


def test_stage_writers_tensorboard_and_wandb_resume(tmp_path, fake_wandb):
  workdir = tmp_path / "run1"
  writers = metrics.stage_writers(_config(), str(workdir), "rl")
  tb, wb = writers
  assert isinstance(tb, TensorBoardWriter) and isinstance(wb, WandbWriter)
  assert tb.logdir == workdir / "tensorboard" / "rl"
  assert wb.run.name == "run1-rl" and wb.run.config["algo"] == "grpo"
  run_id = wb.run.id
  assert (workdir / "wandb_run_id_rl.txt").read_text().strip() == run_id
  multi = MultiWriter(writers)
  for step in (1, 2):
    multi.write(step, {"rollout/reward_mean": 0.25 * step, "stage": "rl"})
  multi.close()

  # Restarted run: the same W&B run id is resumed; TensorBoard adds a file to the same folder.
  writers = metrics.stage_writers(_config(), workdir, "rl")
  assert writers[1].run.id == run_id
  MultiWriter(writers).write(3, {"rollout/reward_mean": 0.75})
  MultiWriter(writers).close()

  assert metrics.read_tensorboard(workdir / "tensorboard" / "rl") == {
    "rollout/reward_mean": [(1, 0.25), (2, 0.5), (3, 0.75)]}
  calls = fake_wandb.calls
  assert [c["call"] for c in calls] == ["init", "log", "log", "finish", "init", "log", "finish"]
  first, resumed = (c["kwargs"] for c in calls if c["call"] == "init")
  assert first["project"] == "rl_lm-test" and first["mode"] == "offline" and first["dir"] == str(workdir)
  assert "id" not in first and "resume" not in first
  assert resumed["id"] == run_id and resumed["resume"] == "allow"
  assert _logged(calls, run_id) == [(1, {"rollout/reward_mean": 0.25}), (2, {"rollout/reward_mean": 0.5}),
                                    (3, {"rollout/reward_mean": 0.75})]
  # Another stage gets its own W&B run.
  (sft_wb,) = metrics.stage_writers(_config(tensorboard=False), workdir, "sft")
  assert sft_wb.run.id != run_id and (workdir / "wandb_run_id_sft.txt").read_text().strip() == sft_wb.run.id
  assert "id" not in fake_wandb.calls[-1]["kwargs"]
  sft_wb.close()


def test_stage_writers_optional(tmp_path, fake_wandb, monkeypatch, capsys):
  assert metrics.stage_writers(_config(tensorboard=False, wandb_mode="disabled"), tmp_path, "rl") == []
  assert list(tmp_path.iterdir()) == [] and fake_wandb.calls == []

  def broken_init(**kwargs):
    raise RuntimeError("no network\nsecond line")

  monkeypatch.setattr(fake_wandb, "init", broken_init)
  (tb,) = metrics.stage_writers(_config(wandb_mode="online"), tmp_path, "rl")
  tb.close()
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "W&B did not start" in err and "RuntimeError: no network second line" in err
  assert isinstance(tb, TensorBoardWriter) and not (tmp_path / "wandb_run_id_rl.txt").exists()


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
