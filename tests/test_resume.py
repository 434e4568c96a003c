"""Exact resume: a run killed with SIGKILL (between steps, or in the middle of writing a checkpoint)
and restarted on the same workdir ends with the same metrics files, evaluations and parameters, bit
for bit, as a run that was never interrupted.

Each case runs `python -m rl_lm.main` in subprocesses on `configs/default.py:smoke` (SFT 6 steps, RL 6
steps, a checkpoint every 2, an evaluation every 2). Wall-clock figures (`perf/*`) are the only
fields allowed to differ.

The runs share a JAX persistent compilation cache (`jax_cache_env` in tests/conftest.py): the first run
compiles and the later ones load the same executables (a run then costs 8 s instead of 32 s on 2 cores).
What is tested is unchanged: each run is its own process that restores its state from the checkpoints, and
a cached executable computes what a fresh compilation of the same program does, bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from rl_lm.checkpoint import restore_item

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--config.sft.steps=6", "--config.sft.log_every=1", "--config.rl.steps=6", "--config.checkpoint.every=2",
         "--config.eval.every=2", "--config.logging.wandb_mode=disabled", "--verbosity=-1"]

pytestmark = pytest.mark.slow
_CACHE: dict[str, str] = {}  # JAX_* variables naming the module's compilation cache (set by _jax_cache)


@pytest.fixture(scope="module", autouse=True)
def _jax_cache(jax_cache_env):
  """The session's compilation cache (tests/conftest.py) for every run below: the tests of one xdist worker run
  one at a time and so do the runs of one test, so no two processes write it at once."""
  _CACHE.update(jax_cache_env)
  yield
  _CACHE.clear()


def _cmd(config: str, workdir: Path, *extra: str) -> list[str]:
  return [sys.executable, "-m", "rl_lm.main", f"--config={config}", f"--workdir={workdir}", *FLAGS, *extra]


def _env(fault: str = "") -> dict[str, str]:
  env = dict(os.environ, PYTHONPATH=str(ROOT), **_CACHE)
  env.pop("RL_LM_FAULT", None)
  if fault:
    env["RL_LM_FAULT"] = fault
  return env


def _run(config: str, workdir: Path, fault: str = "", *extra: str) -> subprocess.CompletedProcess:
  return subprocess.run(_cmd(config, workdir, *extra), cwd=ROOT, env=_env(fault), capture_output=True, text=True,
                        timeout=600)


def _tail(run: subprocess.CompletedProcess) -> str:
  """The end of a failed run's stderr, without native stack frames."""
  return "\n".join(ln for ln in run.stderr.splitlines() if not ln.lstrip().startswith("@"))[-3000:]


def _rows(path: Path) -> list[dict]:
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def _params(workdir: Path) -> dict[str, np.ndarray]:
  params, _ = restore_item(str(workdir / "checkpoints" / "rl"), "params", None)
  flat = {}

  def walk(prefix: str, tree) -> None:
    if isinstance(tree, dict):
      for k, v in tree.items():
        walk(f"{prefix}/{k}", v)
    else:
      flat[prefix] = np.asarray(tree)

  walk("", params)
  return flat


def _assert_same_run(a: Path, b: Path) -> None:
  assert _rows(a / "sft_metrics.jsonl") == _rows(b / "sft_metrics.jsonl")
  rows_a, rows_b = _rows(a / "metrics.jsonl"), _rows(b / "metrics.jsonl")
  assert [r["step"] for r in rows_a] == [0, 1, 2, 3, 4, 5, 6, 6]  # before RL, six steps, after RL
  assert rows_a == rows_b
  evals = sorted(p.name for p in (a / "eval").glob("*.json"))
  assert evals == sorted(p.name for p in (b / "eval").glob("*.json")) and len(evals) == 4
  for name in evals:
    assert json.loads((a / "eval" / name).read_text()) == json.loads((b / "eval" / name).read_text())
  pa, pb = _params(a), _params(b)
  assert pa.keys() == pb.keys()
  for k in pa:
    assert pa[k].dtype == pb[k].dtype and pa[k].tobytes() == pb[k].tobytes(), k  # bitwise
  assert (b / "done.json").exists()


def _steps(folder: Path) -> list[int]:
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def test_killed_mid_save_in_sft_then_in_rl_resumes_exactly(tmp_path):
  """RL samples each rollout one update ahead (max_staleness 1); the pipeline drains at every checkpoint, so the
  resumed run samples the rollouts after it from the saved parameters, as the uninterrupted run did."""
  config = "configs/default.py:smoke"
  ahead = "--config.rl.max_staleness=1"
  ref, run = tmp_path / "ref", tmp_path / "run"
  done = _run(config, ref, "", ahead)
  assert done.returncode == 0, _tail(done)
  stale = [r["offpolicy/staleness_max"] for r in _rows(ref / "metrics.jsonl") if "offpolicy/staleness_max" in r]
  assert stale == [0, 1, 0, 1, 0, 1]  # drained at the checkpoints (every 2 steps)

  killed = _run(config, run, "kill_mid_save:sft:4", ahead)
  assert killed.returncode == -signal.SIGKILL
  assert _steps(run / "checkpoints" / "sft") == [2]  # step 4 was being written: not a checkpoint
  assert any(".orbax-checkpoint-tmp" in p.name for p in (run / "checkpoints" / "sft").iterdir())

  killed = _run(config, run, "kill_mid_save:rl:4", ahead)
  assert killed.returncode == -signal.SIGKILL
  assert "sft: resuming from step 2 of 6" in killed.stdout
  assert _steps(run / "checkpoints" / "rl") == [2]

  resumed = _run(config, run, "", ahead)
  assert resumed.returncode == 0, _tail(resumed)
  assert "rl: resuming from step 2 of 6" in resumed.stdout and "sft: complete" in resumed.stdout
  _assert_same_run(ref, run)


def test_ppo_killed_between_steps_resumes_exactly(tmp_path):
  """PPO carries a value model and an adaptive KL coefficient: both must come back."""
  config = "configs/ppo.py:smoke"
  ref, run = tmp_path / "ref", tmp_path / "run"
  done = _run(config, ref)
  assert done.returncode == 0, _tail(done)
  coefs = [r["policy/kl_coef"] for r in _rows(ref / "metrics.jsonl") if "policy/kl_coef" in r]
  assert len(set(coefs)) > 1  # the controller moved: its state matters for the resume

  proc = subprocess.Popen(_cmd(config, run), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 600
  while not (run / "checkpoints" / "rl" / "2").is_dir():  # committed: Orbax renames a finished save
    assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first RL checkpoint"
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (run / "done.json").exists()

  resumed = _run(config, run)
  assert resumed.returncode == 0, _tail(resumed)
  assert "rl: resuming from step" in resumed.stdout
  _assert_same_run(ref, run)


def test_reward_model_and_dpo_stages_resume_exactly(tmp_path):
  """The preference stages share the checkpoint machinery: killed mid-save, they resume to the same end."""
  flags = ["--config.sft.steps=4", "--config.reward_model.steps=6", "--config.dpo.steps=6",
           "--config.reward_model.log_every=1", "--config.dpo.log_every=1", "--config.checkpoint.every=2",
           "--config.stages=('sft','reward_model','dpo')", "--config.logging.wandb_mode=disabled", "--verbosity=-1"]

  def run(workdir: Path, fault: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rl_lm.main", "--config=configs/dpo.py:smoke", f"--workdir={workdir}", *flags]
    return subprocess.run(cmd, cwd=ROOT, env=_env(fault), capture_output=True, text=True, timeout=600)

  ref, resumed = tmp_path / "ref", tmp_path / "run"
  assert (done := run(ref)).returncode == 0, _tail(done)
  assert run(resumed, "kill_mid_save:reward_model:4").returncode == -signal.SIGKILL
  assert run(resumed, "kill_mid_save:dpo:4").returncode == -signal.SIGKILL
  assert (done := run(resumed)).returncode == 0, _tail(done)
  for name in ("reward_model_metrics.jsonl", "dpo_metrics.jsonl"):
    assert _rows(ref / name) == _rows(resumed / name), name
  for stage in ("reward_model", "dpo"):
    a, _ = restore_item(str(ref / "checkpoints" / stage), "params", None)
    b, _ = restore_item(str(resumed / "checkpoints" / stage), "params", None)
    flat_a, flat_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(flat_a, flat_b, strict=True))
  summary = lambda d: json.loads((d / "reward_model_summary.json").read_text())  # noqa: E731
  assert summary(ref)["after"] == summary(resumed)["after"]
  assert summary(ref)["reward_offset"] == summary(resumed)["reward_offset"]
  assert json.loads((ref / "dpo_summary.json").read_text())["eval"] == \
    json.loads((resumed / "dpo_summary.json").read_text())["eval"]
