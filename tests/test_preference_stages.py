"""The reward-model and DPO stages, and PPO against a learned reward: the losses they build are the
Bradley-Terry / DPO formulas on the models' own scores, training moves them the right way, and the
stages run end to end through the entry point with the gold reward measured beside the proxy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import dpo as dpo_config
from rl_lm import mesh as mesh_lib
from rl_lm.models import heads
from rl_lm.tasks.preferences import SyntheticPreferences
from rl_lm.train import dpo, reward_model
from rl_lm.train import pairs as pairs_lib
from rl_lm.train import state as state_lib
from rl_lm.train.context import make_context

pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")  # the in-process tests share executables

ROOT = Path(__file__).resolve().parents[1]


def _ctx(tmp_path):
  return make_context(dpo_config.get_config("smoke"), str(tmp_path))


def _data(ctx, n: int = 16):
  task = SyntheticPreferences(seed=0)
  pairs = task.pairs("train", n, seed=0)
  data = pairs_lib.encode(ctx.tokenizer, pairs, ctx.config.preferences.max_len)
  data.pop("truncated")
  return pairs, data


def _put(ctx, batch):
  return {k: mesh_lib.put(v, mesh_lib.batch_sharding(ctx.mesh, ctx.rules, v.shape)) for k, v in batch.items()}


def test_reward_model_loss_is_bradley_terry_on_last_token_scores(tmp_path):
  ctx = _ctx(tmp_path)
  params = heads.init(ctx.model_cfg, jax.random.key(0), backbone=ctx.policy)
  params["head"]["w"] = jax.random.normal(jax.random.key(1), params["head"]["w"].shape) * 0.5  # scores differ
  _, data = _data(ctx, 8)
  loss, metrics = reward_model.pair_loss(ctx.model_cfg)(params, _put(ctx, data), None)
  rc = np.asarray(heads.last_token_score(ctx.model_cfg, params, jnp.asarray(data["chosen_tokens"]),
                                         jnp.asarray(data["chosen_mask"])))
  rr = np.asarray(heads.last_token_score(ctx.model_cfg, params, jnp.asarray(data["rejected_tokens"]),
                                         jnp.asarray(data["rejected_mask"])))
  expected = np.mean(np.log1p(np.exp(-(rc - rr))))  # -log sigmoid(d) = log(1 + e^-d)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["rm/accuracy"]), np.mean((rc > rr) + 0.5 * (rc == rr)), rtol=1e-6)
  # The last real token is the eos ending each side: scores do not depend on the padding after it.
  padded = {k: np.concatenate([v, np.zeros_like(v[:, :4])], axis=1) for k, v in data.items()}
  rc_padded = np.asarray(heads.last_token_score(ctx.model_cfg, params, jnp.asarray(padded["chosen_tokens"]),
                                                jnp.asarray(padded["chosen_mask"])))
  np.testing.assert_allclose(rc_padded, rc, atol=1e-5)


def test_a_rollout_scored_in_row_chunks_gets_each_rows_own_reward(tmp_path):
  ctx = _ctx(tmp_path)
  params = heads.init(ctx.model_cfg, jax.random.key(0), backbone=ctx.policy)
  params["head"]["w"] = jax.random.normal(jax.random.key(1), params["head"]["w"].shape) * 0.5
  _, data = _data(ctx, 8)
  tokens, mask = jnp.asarray(data["chosen_tokens"]), jnp.asarray(data["chosen_mask"])  # [8, T]
  whole = np.asarray(heads.last_token_score(ctx.model_cfg, params, tokens, mask))  # [8]
  assert np.ptp(whole) > 1e-3  # the rows' rewards differ: a row given another's would show
  for chunks in (1, 2, 4):  # chunk i holds rows i, i + c, ...: each put back in its place
    got = np.asarray(reward_model.score_fn(ctx.model_cfg, chunks)(params, tokens, mask))
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)


def test_dpo_starts_at_log2_and_training_separates_the_pairs(tmp_path):
  ctx = _ctx(tmp_path)
  cfg = ctx.config.dpo
  cfg.nll_coef = 0.0  # the plain DPO loss (configs/dpo.py adds the RPO term)
  _, data = _data(ctx, 16)
  data.update(dpo.reference_logprobs(ctx, ctx.policy, data, 16))
  loss_fn = dpo.dpo_loss_fn(ctx.model_cfg, cfg)
  loss, metrics = loss_fn(ctx.policy, _put(ctx, data), None)
  np.testing.assert_allclose(float(loss), np.log(2.0), rtol=1e-5)  # policy == reference: h = 0
  assert abs(float(metrics["dpo/reward_margin"])) < 1e-5
  optimizer = state_lib.make_optimizer(1e-3)
  shardings = state_lib.state_shardings(optimizer, jax.eval_shape(lambda: ctx.policy), ctx.param_shardings, ctx.mesh)
  state = state_lib.create(ctx.policy, optimizer, ctx.mesh, ctx.param_shardings)
  update = state_lib.make_update_fn(loss_fn, optimizer, shardings, ctx.mesh, ctx.rules)
  batch = _put(ctx, data)
  for step in range(15):
    state, m = update(state, batch, jax.random.key(step))
  m = jax.device_get(m)
  assert m["train/loss"] < 0.6 and m["dpo/reward_margin"] > 0.3 and m["dpo/accuracy"] > 0.8, m
  # Chosen log-probs rise relative to rejected ones: the implicit rewards move apart.
  assert m["dpo/reward_chosen"] > m["dpo/reward_rejected"]


def test_rpo_term_adds_the_per_token_nll_of_the_chosen_side(tmp_path):
  ctx = _ctx(tmp_path)
  cfg = ctx.config.dpo
  cfg.nll_coef = 0.5
  _, data = _data(ctx, 8)
  data.update(dpo.reference_logprobs(ctx, ctx.policy, data, 8))
  loss, metrics = dpo.dpo_loss_fn(ctx.model_cfg, cfg)(ctx.policy, _put(ctx, data), None)
  pc = data["ref_chosen_logp"]  # the policy is the reference here
  tokens = data["chosen_loss_mask"][:, 1:].sum(axis=1)  # completion tokens and eos
  nll = np.mean(-pc / tokens)
  np.testing.assert_allclose(float(metrics["dpo/nll_chosen"]), nll, rtol=1e-5)
  np.testing.assert_allclose(float(loss), np.log(2.0) + 0.5 * nll, rtol=1e-5)


def test_step_indices_cover_each_epoch_once_and_are_reproducible():
  seen = np.concatenate([pairs_lib.step_indices(10, 3, s, seed=0) for s in range(3)])
  assert len(set(seen.tolist())) == 9  # three steps of an epoch: disjoint slices of one permutation
  np.testing.assert_array_equal(pairs_lib.step_indices(10, 3, 4, seed=0), pairs_lib.step_indices(10, 3, 4, seed=0))
  assert not np.array_equal(pairs_lib.step_indices(10, 3, 0, seed=0), pairs_lib.step_indices(10, 3, 3, seed=0))


def _main(config: str, workdir: Path, cache: dict[str, str]) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(ROOT), **cache)
  return subprocess.run([sys.executable, "-m", "rl_lm.main", f"--config={config}", f"--workdir={workdir}",
                         "--config.logging.wandb_mode=disabled"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)


@pytest.mark.slow
def test_rlhf_and_dpo_stages_end_to_end(tmp_path, jax_cache_env):
  """The two runs share the session's compilation cache (tests/conftest.py): the SFT stage they have in common
  compiles once."""
  run = _main("configs/rlhf_ppo.py:smoke", tmp_path / "rlhf", jax_cache_env)
  assert run.returncode == 0, run.stderr[-3000:]
  summary = json.loads((tmp_path / "rlhf" / "reward_model_summary.json").read_text())
  assert 0.0 <= summary["after"]["rm_eval/accuracy"] <= 1.0 and "rm_eval/gold_accuracy" in summary["after"]
  rows = [json.loads(line) for line in (tmp_path / "rlhf" / "metrics.jsonl").read_text().splitlines()]
  steps = [r for r in rows if "rollout/proxy_mean" in r]
  assert len(steps) == 3 and all(np.isfinite(r["rollout/gold_mean"]) and "policy/kl_ref_seq" in r for r in steps)
  # The proxy is what PPO trains on: the reported reward is the learned one, centred on the SFT policy.
  assert all(r["rollout/reward_mean"] == r["rollout/proxy_mean"] for r in steps)
  assert (tmp_path / "rlhf" / "checkpoints" / "reward_model" / "complete.json").exists()
  # The reward model comes back from its checkpoint with its offset (what reward.model_checkpoint reads).
  ctx = make_context(dpo_config.get_config("smoke"), str(tmp_path / "probe"))
  loaded = reward_model.load(ctx, str(tmp_path / "rlhf" / "checkpoints" / "reward_model"))
  assert loaded.offset == pytest.approx(summary["reward_offset"])

  run = _main("configs/dpo.py:smoke", tmp_path / "dpo", jax_cache_env)
  assert run.returncode == 0, run.stderr[-3000:]
  dpo_summary = json.loads((tmp_path / "dpo" / "dpo_summary.json").read_text())
  assert 0.0 <= dpo_summary["eval"]["dpo_eval/gold_win_rate"] <= 1.0
  assert (tmp_path / "dpo" / "dpo_metrics.jsonl").exists()


@pytest.mark.slow
def test_overoptimization_experiment_runs_end_to_end(tmp_path, jax_cache_env):
  """The experiment's one command, shrunk: base stages, best-of-n, one PPO run, the table, JSON and plot. Its
  runs follow one another and share the session's compilation cache (tests/conftest.py)."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), **jax_cache_env)
  run = subprocess.run([sys.executable, "-m", "experiments.overoptimization.run", f"--workdir={tmp_path}",
                        "--variant=smoke", "--coefs=0.05", "--rl_steps=2", "--window=1", "--prompts=8", "--max_n=4"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
  results = json.loads((tmp_path / "overoptimization.json").read_text())
  bon = results["curves"]["best-of-n"]
  assert [p["n"] for p in bon] == [1, 2, 4]
  np.testing.assert_allclose([p["kl"] for p in bon], [0.0, np.log(2) - 0.5, np.log(4) - 0.75])
  assert all(bon[i + 1]["proxy"] >= bon[i]["proxy"] - 1e-6 for i in range(2))  # picking by the proxy raises it
  assert len(results["curves"]["PPO, KL coef 0.05"]) == 2
  assert (tmp_path / "overoptimization.png").stat().st_size > 10_000
