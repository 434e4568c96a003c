"""Sweeps: point names and override flags, grids, sweep files, key checks, and two points run end to end."""

import csv
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ml_collections import config_flags

from rl_lm import config as config_lib
from rl_lm import runs, sweep

ROOT = Path(__file__).resolve().parents[1]


def _sweep(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, "-m", "rl_lm.sweep", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_grid_is_the_cartesian_product_first_axis_slowest():
  points = sweep.grid({"rl.learning_rate": (1e-4, 3e-4)}, seed=[0, 1, 2])
  assert len(points) == 6
  assert points[0] == {"rl.learning_rate": 1e-4, "seed": 0}
  assert points[1] == {"rl.learning_rate": 1e-4, "seed": 1}
  assert points[-1] == {"rl.learning_rate": 3e-4, "seed": 2}
  with pytest.raises(sweep.SweepError, match="seed"):
    sweep.grid(seed=())
  with pytest.raises(sweep.SweepError, match="rl.algorithm"):
    sweep.grid({"rl.algorithm": "grpo"})  # a string is not a list of values


def test_names_are_readable_safe_and_bounded():
  assert sweep.point_name({"rl.learning_rate": 1e-4, "seed": 0}) == "rl.learning_rate=0.0001,seed=0"
  assert sweep.point_name({"stages": ("sft", "rl"), "rl.scale_by_std": False}) == "stages=sft_rl,rl.scale_by_std=False"
  assert sweep.point_name({"task.data_dir": "/a b/c"}) == "task.data_dir=a_b_c"
  assert sweep.point_name({}) == "base"
  long = {"rl.algorithm": "x" * 200}
  name = sweep.point_name(long)
  assert len(name) <= sweep.MAX_NAME_LEN and name.startswith("rl.algorithm=xxx")
  assert name != sweep.point_name({"rl.algorithm": "x" * 201})  # the hash tells long names apart
  assert "/" not in name


def test_override_flags_parse_back_through_config_flags():
  import numpy as np
  from absl import flags

  point = {"rl.learning_rate": 3e-5, "seed": np.int64(2), "stages": ["sft", "rl"], "rl.scale_by_std": False,
           "rl.algorithm": "rloo", "task.levels": (1, 2), "model.hf_checkpoint": "", "rl.kl.coef": 0}
  assert sweep.format_value(True) == "True" and sweep.format_value(("sft",)) == "('sft',)"
  argv = ["prog", f"--config={ROOT / 'configs/default.py'}:smoke", *sweep.override_flags(point)]
  fv = flags.FlagValues()  # sys_argv: config_flags defines the override flags it sees there
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True, sys_argv=argv)
  fv(argv)
  config = holder.value
  assert config.rl.learning_rate == 3e-5 and config.seed == 2 and config.stages == ("sft", "rl")
  assert config.rl.scale_by_std is False and config.rl.algorithm == "rloo" and config.task.levels == (1, 2)
  assert config.model.hf_checkpoint == "" and config.rl.kl.coef == 0.0


def test_sweep_file_json_list_and_jsonl(tmp_path):
  as_list = tmp_path / "points.json"
  as_list.write_text(json.dumps([{"config.seed": 0, "stages": ["sft"]}, {"seed": 1}]))
  assert sweep.load_sweep_file(as_list) == [{"seed": 0, "stages": ("sft",)}, {"seed": 1}]
  as_lines = tmp_path / "points.jsonl"
  as_lines.write_text('{"rl.learning_rate": 0.001}\n\n{"rl.learning_rate": 0.0003, "seed": 4}\n')
  assert sweep.load_sweep_file(as_lines) == [{"rl.learning_rate": 1e-3}, {"rl.learning_rate": 3e-4, "seed": 4}]
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"seed": 0}\n{"seed": \n')
  with pytest.raises(sweep.SweepError, match="bad.jsonl:2"):
    sweep.load_sweep_file(bad)
  bad.write_text('[1, 2]')
  with pytest.raises(sweep.SweepError, match="point 1"):
    sweep.load_sweep_file(bad)


def test_check_points_names_the_point_and_the_key():
  from configs import default

  config = default.get_config()
  names = sweep.check_points(config, [{"seed": 0}, {"rl.learning_rate": 1e-3, "rl.kl.coef": 0}])
  assert names == ["seed=0", "rl.learning_rate=0.001,rl.kl.coef=0"]
  for point, match in [({"rl.lr": 1e-3}, "point 2 of 2 .*config.rl.lr: unknown key 'lr' under config.rl"),
                       ({"rll.steps": 1}, "config.rll.steps: unknown key 'rll' under config"),
                       ({"rl.kl": 1}, "config.rl.kl: names a section"),
                       ({"rl.steps": 1.5}, "config.rl.steps"),
                       ({"seed": 0}, "the same directory name as point 1")]:
    with pytest.raises(sweep.SweepError, match=match):
      sweep.check_points(config, [{"seed": 0}, point])
  assert config.seed == 0 and config.rl.learning_rate == 1e-4  # checking changed nothing


def test_every_config_sweep_checks():
  for path in sorted((ROOT / "configs").glob("*.py")):
    module = importlib.import_module(f"configs.{path.stem}")
    if hasattr(module, "sweep"):
      points = sweep.points_from_config(str(path))
      config = module.get_config()
      sweep.check_points(config, points)
      for point in points:  # and each point still validates
        probe = module.get_config()
        for key, value in point.items():
          node = probe
          *parents, leaf = key.split(".")
          for part in parents:
            node = node[part]
          node[leaf] = value
        config_lib.validate(probe, num_devices=1)


def test_unknown_key_exits_2_with_one_line(tmp_path):
  points = tmp_path / "points.jsonl"
  points.write_text('{"seed": 0}\n{"rl.learning_rat": 0.001}\n')
  run = _sweep("--config=configs/default.py:smoke", f"--workdir={tmp_path / 'sweep'}", f"--sweep_file={points}")
  assert run.returncode == 2
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1 and "point 2 of 2" in lines[0] and "config.rl.learning_rat" in lines[0], run.stderr
  assert not (tmp_path / "sweep").exists()  # nothing launched
  run = _sweep("--config=configs/sample.py", f"--workdir={tmp_path / 'sweep'}")  # no sweep() there
  assert run.returncode == 2 and "sweep_file" in run.stderr


def test_dry_run_prints_the_config_sweep(tmp_path):
  run = _sweep("--config=configs/default.py", f"--workdir={tmp_path}", "--dry_run", "--config.rl.steps=7")
  assert run.returncode == 0, run.stderr
  lines = [ln for ln in run.stdout.splitlines() if "rl_lm.main" in ln]
  assert len(lines) == 6 and all("--config.rl.steps=7" in ln for ln in lines)
  assert lines[0].startswith("rl.learning_rate=3e-05,seed=0: ") and "--config.seed=0" in lines[0]
  assert not list(tmp_path.iterdir())


def test_read_metrics_from_the_run_files(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(
    '{"step": 1, "rollout/reward_mean": 0.25, "policy/kl_ref_k3": 0.0}\n'
    '{"step": 2, "rollout/reward_mean": 0.5, "policy/kl_ref_k3": "nan"}\n{"step": 2, "eval/pass@1": 0.7}\n{"ste')
  after = {"n": 4, "pass_at_k": {"1": 0.7, "4": 0.9}, "greedy_accuracy": 0.8}
  (tmp_path / "rl_summary.json").write_text(json.dumps({"before": json.dumps(after), "after": after}))
  values = sweep.read_metrics(tmp_path, (*sweep.DEFAULT_METRICS, "eval/pass@1", "before:pass@4"))
  assert values["after:pass@1"] == 0.7 and values["after:greedy_accuracy"] == 0.8 and values["before:pass@4"] == 0.9
  assert values["rollout/reward_mean"] == 0.5 and values["eval/pass@1"] == 0.7
  assert values["policy/kl_ref_k3"] != values["policy/kl_ref_k3"]  # NaN stays NaN
  assert values["sft:train/loss"] is None  # no sft_metrics.jsonl
  (tmp_path / "sft_metrics.jsonl").write_text('{"step": 10, "train/loss": 1.5}\n{"step": 20, "train/loss": 1.25}\n')
  assert sweep.read_metrics(tmp_path)["sft:train/loss"] == 1.25


def test_plot_numeric_text_and_empty(tmp_path):
  r = sweep.Result
  numeric = [r("a", {"rl.learning_rate": 1e-4, "seed": 0}, metrics={"m": 0.5}),
             r("b", {"rl.learning_rate": 1e-3, "seed": 0}, metrics={"m": 0.7}),
             r("c", {"rl.learning_rate": 1e-4, "seed": 1}, metrics={"m": None})]
  text = [r("a", {"rl.algorithm": "grpo"}, metrics={"m": 0.5}), r("b", {"rl.algorithm": "ppo"}, metrics={"m": 0.6})]
  for i, results in enumerate([numeric, text, numeric[2:]]):  # log x and a line per seed; dots by name; nothing
    assert sweep.plot(results, "m", tmp_path / f"{i}.png").stat().st_size > 0


def test_run_main_returns_the_exit_code_and_wall_time_and_logs(tmp_path):
  code, wall_s = runs.run_main(f"{ROOT / 'configs/default.py'}:smoke", tmp_path / "run",
                               ["--config.sft.learning_rate=-1.0"])  # main refuses it in seconds
  assert code == 2 and wall_s > 0
  lines = (tmp_path / "run" / "log.txt").read_text().splitlines()
  assert lines[0].startswith(runs.LOG_HEADER) and lines[0].endswith("--config.sft.learning_rate=-1.0")
  assert "config.sft.learning_rate" in lines[-1]


@pytest.mark.slow
def test_points_run_in_parallel_tabulate_and_resume(tmp_path):
  points = tmp_path / "points.json"
  points.write_text(json.dumps([{"sft.learning_rate": 3e-3}, {"sft.learning_rate": 1e-2},
                                {"sft.learning_rate": -1.0}]))  # main refuses the last one: it fails in seconds
  out = tmp_path / "sweep"
  args = [f"--config={ROOT / 'configs/default.py'}:smoke", f"--workdir={out}", f"--sweep_file={points}",
          "--parallel=2", "--config.stages=('sft',)", "--config.sft.steps=3", "--config.logging.wandb_mode=disabled",
          "--metrics=sft:train/loss,sft:sft/accuracy,rollout/reward_mean"]
  run = _sweep(*args)
  assert run.returncode == 1, run.stdout + run.stderr  # one point failed, the others finished
  names = ["sft.learning_rate=0.003", "sft.learning_rate=0.01", "sft.learning_rate=-1.0"]
  for name in names[:2]:
    assert (out / name / "done.json").exists()
    assert "--config.sft.steps=3" in (out / name / "log.txt").read_text()
  assert not (out / names[2] / "done.json").exists() and (out / names[2] / "log.txt").exists()
  assert run.stdout.count("sweep: [") == 3 and "[3/3]" in run.stdout and "ETA" in run.stdout

  with open(out / "sweep_results.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["sft.learning_rate"] for r in rows] == ["0.003", "0.01", "-1.0"]
  assert [r["status"] for r in rows] == ["done", "done", "failed (exit 2)"]
  assert "config.sft.learning_rate" in rows[2]["note"] and rows[2]["sft:train/loss"] == ""
  for r in rows[:2]:
    assert float(r["sft:train/loss"]) > 0 and 0 <= float(r["sft:sft/accuracy"]) <= 1 and float(r["wall_s"]) > 0
    assert r["rollout/reward_mean"] == ""  # no RL stage in these runs
  md = (out / "sweep_results.md").read_text().splitlines()
  assert len(md) == 2 + 3 and md[0].startswith("| sft.learning_rate | status | wall_s | sft:train/loss |")
  assert md[0] in run.stdout and "failed (exit 2)" in md[4]
  assert (out / "sweep.png").stat().st_size > 0
  log_mtime = (out / names[0] / "log.txt").stat().st_mtime

  again = _sweep(*args)  # the done points are skipped; the failed one runs (and fails) again
  assert again.returncode == 1
  assert again.stdout.count("skipped (done.json)") == 2 and "failed (exit 2)" in again.stdout
  assert (out / names[0] / "log.txt").stat().st_mtime == log_mtime
  with open(out / "sweep_results.csv") as f:
    rows_again = list(csv.DictReader(f))
  assert [r["status"] for r in rows_again] == ["done", "done", "failed (exit 2)"]
  assert rows_again[0]["sft:train/loss"] == rows[0]["sft:train/loss"] and rows_again[0]["wall_s"] == rows[0]["wall_s"]
