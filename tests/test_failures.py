"""Failure handling in the training loops: non-finite updates (a NaN loss or gradient, or parameters and
optimizer state an update would leave non-finite) are skipped and counted, K in a row stop the run with a
message naming the metric and leave the last checkpoint from before; non-finite rewards are masked like
verifier faults; a completed stage refuses a changed step count."""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from rl_lm.checkpoint import restore_item
from rl_lm.config import ConfigError
from rl_lm.rewards.registry import RewardResult
from rl_lm.rl import losses
from rl_lm.tasks.arithmetic import ArithmeticTask
from rl_lm.train import rl, sft
from rl_lm.train.context import make_context
from rl_lm.train.stage_run import COMPLETE, NonFiniteError, StageRun

pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")  # the trainers share executables


def _config(**overrides):
  config = default.get_config("smoke")
  config.stop_after_nonfinite = 3
  config.checkpoint.every = 2
  config.checkpoint.async_save = False
  config.logging.wandb_mode = "disabled"
  for key, value in overrides.items():
    node = config
    *path, last = key.split(".")
    for part in path:
      node = node[part]
    node[last] = value
  return config


def test_nonfinite_score_is_a_masked_fault():
  assert not RewardResult(float("nan"), "ok").valid and not RewardResult(math.inf, "ok").valid
  assert RewardResult(0.0, "ok").valid


@pytest.mark.parametrize("log_every", [1, 10])  # 10: each flag is read one step late, while the next update runs
def test_sft_stops_after_k_skipped_updates_and_keeps_the_checkpoint_before(tmp_path, monkeypatch, log_every):
  real = sft.sft_loss

  def poisoned(model_cfg):
    loss_fn = real(model_cfg)
    return lambda params, batch, rng: jax.tree.map(lambda x: x * jnp.nan, loss_fn(params, batch, rng))

  monkeypatch.setattr(sft, "sft_loss", poisoned)
  config = _config(**{"sft.steps": 10, "sft.log_every": log_every})
  ctx = make_context(config, str(tmp_path))
  initial = jax.device_get(ctx.policy)
  with pytest.raises(NonFiniteError, match=r"sft stopped at step 3: 3 updates in a row .*train/loss=nan.*"
                                           r"stop_after_nonfinite=3.*step 2"):
    sft.train(ctx, ArithmeticTask(levels=(1,)), config.sft, log=lambda _: None)
  folder = tmp_path / "checkpoints" / "sft"
  assert sorted(p.name for p in folder.iterdir()) == ["2"]  # nothing saved at the failing step, not complete
  saved, extra = restore_item(str(folder), "params", None)
  assert extra["nonfinite_streak"] == 2
  # Skipped updates left the parameters as they were: the checkpoint holds the last good state.
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), saved, initial)
  rows = [json.loads(line) for line in open(tmp_path / "sft_metrics.jsonl")] if log_every == 1 else []
  assert [r["train/skipped"] for r in rows] == ([1.0, 1.0] if log_every == 1 else [])  # counted, step by step


def test_rl_stops_after_k_skipped_updates(tmp_path, monkeypatch):
  real = losses.policy_loss

  def poisoned(*args, **kwargs):
    loss, metrics = real(*args, **kwargs)
    return loss * jnp.nan, metrics

  monkeypatch.setattr(losses, "policy_loss", poisoned)
  config = _config(**{"rl.steps": 6, "stages": ("rl",)})
  ctx = make_context(config, str(tmp_path))
  with pytest.raises(NonFiniteError, match=r"rl stopped at step 3: 3 updates in a row .*train/loss=nan"):
    rl.RLTrainer(ctx, log=lambda _: None).run()
  assert sorted(p.name for p in (tmp_path / "checkpoints" / "rl").iterdir()) == ["2"]
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r.get("train/skipped") for r in rows[1:]] == [1.0, 1.0]  # after the step-0 evaluation
  assert not os.path.exists(tmp_path / "rl_summary.json")


@pytest.mark.parametrize("stage, key", [("sft", "sft.learning_rate"), ("rl", "rl.learning_rate"),
                                        ("ppo", "rl.value.learning_rate")])
def test_an_update_that_would_leave_non_finite_parameters_is_skipped(tmp_path, stage, key):
  # An inf learning rate (validation refuses it; here the trainers run without it) turns finite gradients into
  # NaN parameters: each such step is skipped inside jit, K in a row stop the run, and nothing non-finite is
  # saved or marked complete.
  folder = "rl" if stage == "ppo" else stage
  config = _config(**{key: math.inf, "stages": (folder,), "sft.steps": 10, "rl.steps": 6})
  if stage == "ppo":
    config.rl.algorithm, config.rl.kl.placement = "ppo", "reward"
  ctx = make_context(config, str(tmp_path))
  initial = jax.device_get(ctx.policy)
  with pytest.raises(NonFiniteError, match=rf"{folder} stopped at step 3: 3 updates in a row were skipped for a "
                                           r"non-finite loss, gradient or updated state \(.*update_norm=(nan|inf)"):
    if stage == "sft":
      sft.train(ctx, ArithmeticTask(levels=(1,)), config.sft, log=lambda _: None)
    else:
      rl.RLTrainer(ctx, log=lambda _: None).run()
  directory = tmp_path / "checkpoints" / folder
  assert not (directory / COMPLETE).exists()
  assert sorted(p.name for p in directory.iterdir()) == ["2"]
  saved, _ = restore_item(str(directory), "params", None)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), saved, initial)  # finite: the start


def test_a_stage_refuses_a_changed_step_count(tmp_path):
  # The learning-rate schedule spans the stage's steps: a completed or started stage is not stretched.
  config = _config()
  run = StageRun(config, str(tmp_path), "sft", 6, "sft_metrics.jsonl")
  for step in (4, 6):
    run.save(step, {"params": {"w": jnp.full(2, float(step))}})
  run.finish()
  run.close()
  folder = tmp_path / "checkpoints" / "sft"
  for steps in (10, 4):
    with pytest.raises(ConfigError, match=rf"config.sft.steps: {steps}, but the sft stage in {folder} completed at "
                                          rf"step 6: set it back to 6, or train on in a new --workdir with "
                                          rf"--config.sft.init_from={folder}"):
      StageRun(config, str(tmp_path), "sft", steps, "sft_metrics.jsonl")
  run = StageRun(config, str(tmp_path), "sft", 6, "sft_metrics.jsonl")  # unchanged: loads as before
  assert run.complete and run.start_step == 6
  run.close()
  os.rename(folder / "6", tmp_path / "6.corrupt")  # its last checkpoint moved aside: not complete, resumes at 4
  run = StageRun(config, str(tmp_path), "sft", 6, "sft_metrics.jsonl")
  assert not run.complete and run.start_step == 4
  run.close()
  with pytest.raises(ConfigError, match=rf"config.sft.steps: 8, but the sft stage in {folder} was started with "
                                        r"6 steps \(its checkpoint at step 4\): set it back to 6, or use a new "
                                        r"--workdir"):
    StageRun(config, str(tmp_path), "sft", 8, "sft_metrics.jsonl")
