"""Failure handling in the training loops: non-finite updates are skipped and counted, K in a row stop the
run with a message naming the metric and leave the last checkpoint from before; non-finite rewards are
masked like verifier faults."""

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
from rl_lm.rewards.registry import RewardResult
from rl_lm.rl import losses
from rl_lm.tasks.arithmetic import ArithmeticTask
from rl_lm.train import rl, sft
from rl_lm.train.context import make_context
from rl_lm.train.stage_run import NonFiniteError


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
