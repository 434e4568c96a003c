"""Metric writers: JSONL round trip, console line and ETA with a fake clock, TensorBoard and W&B offline written
and read back, per-stage writers with W&B resume, run_info, plots."""

import io
import json
import math

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


def test_wandb_disabled_does_nothing(tmp_path):
  w = WandbWriter("proj", mode="disabled", dir=tmp_path)
  w.write(1, {"a": 1.0})
  w.close()
  assert list(tmp_path.iterdir()) == []
  with pytest.raises(ValueError, match="mode"):
    WandbWriter("proj", mode="cloud")


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
  """W&B offline, its folders (cache, config, ...) inside tmp_path."""
  for var, sub in (("WANDB_DIR", "wb"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                   ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
    monkeypatch.setenv(var, str(tmp_path / sub))
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.chdir(tmp_path)


def test_wandb_offline_run(tmp_path, wandb_env):
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
  # Read back from the transaction log: numeric values at their steps, strings and W&B's own keys left out.
  history = metrics.read_wandb_offline(runs[0])
  assert set(history) == {"rollout/reward_mean", "train/loss"}
  assert history["rollout/reward_mean"] == [(s, float(np.float32(0.1 * s))) for s in range(3)]
  assert [s for s, _ in history["train/loss"]] == [0, 1, 2] and all(math.isnan(v) for _, v in history["train/loss"])
  assert metrics.read_wandb_offline(files[0]) == history  # the .wandb file itself works too


def test_wandb_offline_read_back_large_rows(tmp_path, wandb_env):
  # Rows of ~40 KB do not fit one 32 KiB block of the log: they are split into FIRST/MIDDLE/LAST chunks.
  keys = [f"group{j:03d}/a_rather_long_metric_name_{j}" for j in range(700)]
  w = WandbWriter("rl_lm-test", name="large", mode="offline", dir=tmp_path / "wb")
  for step in (0, 5, 10, 20):
    w.write(step, {k: step + j / 1000 for j, k in enumerate(keys)} | {"flag": step == 10, "n": np.int64(step)})
  w.close()
  (run,) = (tmp_path / "wb" / "wandb").glob("offline-run-*")
  assert next(run.glob("*.wandb")).stat().st_size > 4 * 32768
  history = metrics.read_wandb_offline(run)
  assert set(history) == set(keys) | {"flag", "n"}
  for j, k in enumerate(keys):
    assert history[k] == [(s, s + j / 1000) for s in (0, 5, 10, 20)]
  assert history["flag"] == [(0, 0.0), (5, 0.0), (10, 1.0), (20, 0.0)]
  assert history["n"] == [(s, float(s)) for s in (0, 5, 10, 20)]
  with pytest.raises(FileNotFoundError):
    metrics.read_wandb_offline(tmp_path)


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


def test_stage_writers_tensorboard_and_wandb_resume(tmp_path, wandb_env):
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
  runs = sorted((workdir / "wandb").glob("offline-run-*"))  # offline-run-<time>-<id>[-1]: one folder per start
  assert len(runs) == 2 and all(f"-{run_id}" in p.name for p in runs)
  assert metrics.read_wandb_offline(runs[0]) == {"rollout/reward_mean": [(1, 0.25), (2, 0.5)]}
  assert metrics.read_wandb_offline(runs[1]) == {"rollout/reward_mean": [(3, 0.75)]}
  # Another stage gets its own W&B run.
  (sft_wb,) = metrics.stage_writers(_config(tensorboard=False), workdir, "sft")
  assert sft_wb.run.id != run_id and (workdir / "wandb_run_id_sft.txt").read_text().strip() == sft_wb.run.id
  sft_wb.close()


def test_stage_writers_optional(tmp_path, monkeypatch, capsys):
  assert metrics.stage_writers(_config(tensorboard=False, wandb_mode="disabled"), tmp_path, "rl") == []
  assert list(tmp_path.iterdir()) == []

  import wandb

  def broken_init(**kwargs):
    raise RuntimeError("no network\nsecond line")

  monkeypatch.setattr(wandb, "init", broken_init)
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
