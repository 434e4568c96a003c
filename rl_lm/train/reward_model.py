"""The "reward_model" stage: a Bradley-Terry reward model on preference pairs.

  r(x, y) = head(backbone(x y)[last token])          the scalar head over the policy's backbone
  loss    = -log sigmoid(r(x, y_chosen) - r(x, y_rejected))

The backbone starts from the policy the stage before left (the SFT model), or `reward_model.init_from`.
Held-out pairs measure pairwise accuracy (against their labels and, for synthetic pairs, against the
gold score) and calibration (ECE, reliability plot). At the end the reward is normalised: the mean
reward of completions sampled from the starting policy on training prompts is subtracted, so the
reference policy scores 0 on average; that offset is stored in the checkpoint's extra record.
The reward model is left in `ctx.reward_model` for an RL stage (`config.reward.learned`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from rl_lm import mesh as mesh_lib
from rl_lm import plots, sampling
from rl_lm.checkpoint import restore_item
from rl_lm.models import heads
from rl_lm.rl import preference
from rl_lm.train import loop, rl_update, stage_run
from rl_lm.train import pairs as pairs_lib
from rl_lm.train import state as state_lib
from rl_lm.train.context import Context
from rl_lm.train.rollout import Sampler, in_batches


@dataclasses.dataclass
class RewardModel:
  """A trained reward model: parameters on the mesh and the offset that centres it on the reference policy."""

  params: Any  # {"backbone": ..., "head": ...}
  offset: float


def shardings(ctx: Context) -> tuple[Any, Any]:
  """(abstract reward-model params, their shardings) for this context's model."""
  abstract = jax.eval_shape(lambda: heads.init(ctx.model_cfg, jax.random.key(0), backbone=ctx.policy))
  return abstract, mesh_lib.tree_shardings(ctx.mesh, ctx.rules, abstract, heads.param_axes(ctx.model_cfg))


def load(ctx: Context, path: str) -> RewardModel:
  """A reward model from a reward_model checkpoint folder (or one step in it)."""
  abstract, sh = shardings(ctx)
  params, extra = restore_item(path, "params", stage_run.abstract(abstract, sh))
  return RewardModel(params, float(extra.get("reward_offset", 0.0)))


def pair_loss(model_cfg: Any):
  """loss_fn(params, batch, rng): Bradley-Terry over one forward of chosen and rejected stacked. [2B, T]"""

  def loss_fn(params, batch, rng):
    del rng
    tokens, mask = preference.concat_pairs(batch["chosen_tokens"], batch["rejected_tokens"], batch["chosen_mask"],
                                           batch["rejected_mask"])  # [2B, T]
    scores = heads.last_token_score(model_cfg, params, tokens, mask)  # [2B]
    chosen, rejected = preference.split_pairs(scores)
    return preference.bradley_terry_loss(chosen, rejected)

  return loss_fn


def score(ctx: Context, params: Any, tokens: np.ndarray, mask: np.ndarray, batch_size: int) -> np.ndarray:
  """Reward of each row, in fixed-shape batches (the last one padded with repeated rows). [n, T] -> [n]"""
  fn = score_fn(ctx.model_cfg)
  return in_batches(lambda _, b: fn(params, b["tokens"], b["mask"]), {"tokens": tokens, "mask": mask}, batch_size,
                    ctx.mesh, ctx.rules)


_SCORE_FNS: dict[Any, Any] = {}


def make_score_fn(model_cfg: Any, chunks: int = 1) -> Any:
  """jit(params, tokens [B, T], mask [B, T]) -> the reward of each row [B], the rows scored in `chunks` chunks one
  after another (`rl_update.row_chunks`: peak activations / chunks; B must divide by it). A fresh jit each call."""
  def fn(params: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    return rl_update.row_chunks(lambda t, m: heads.last_token_score(model_cfg, params, t, m), chunks, tokens, mask)
  return jax.jit(fn)


def score_fn(model_cfg: Any, chunks: int = 1) -> Any:
  """`make_score_fn`, one compile per model shape and chunk count."""
  if (model_cfg, chunks) not in _SCORE_FNS:
    _SCORE_FNS[model_cfg, chunks] = make_score_fn(model_cfg, chunks)
  return _SCORE_FNS[model_cfg, chunks]


def evaluate(ctx: Context, params: Any, eval_pairs: list, data: dict[str, np.ndarray], batch_size: int,
             label: str) -> dict[str, float]:
  """Held-out accuracy (labels; gold where known), calibration and its reliability plot."""
  rc = score(ctx, params, data["chosen_tokens"], data["chosen_mask"], batch_size)
  rr = score(ctx, params, data["rejected_tokens"], data["rejected_mask"], batch_size)
  out = {"rm_eval/accuracy": float(np.mean((rc > rr) + 0.5 * (rc == rr))),
         "rm_eval/margin_mean": float(np.mean(rc - rr))}
  gold = np.asarray([q.agrees_with_gold for q in eval_pairs], dtype=object)
  if all(g is not None for g in gold):  # accuracy against the truth, not the noisy labels
    agree = gold.astype(bool)
    out["rm_eval/gold_accuracy"] = float(np.mean(np.where(agree, rc > rr, rr > rc)))
    out["rm_eval/label_agreement_with_gold"] = float(agree.mean())
  cal = preference.calibration(rc, rr)
  out["rm_eval/ece"] = float(cal["rm/ece"])
  if stage_run.is_main_process():
    plots.reliability_plot(cal, os.path.join(ctx.workdir, "eval", f"reward_model_{label}_calibration.png"),
                           title=f"reward model calibration ({label})")
  return out


def reference_offset(ctx: Context, params: Any, task: Any, n: int) -> float:
  """Mean reward of `n` completions sampled from the starting policy (`ctx.policy`) on training prompts.

  `ctx.policy` is the stage's start whether the run is fresh or resumed, so the offset is the same."""
  config, tok = ctx.config, ctx.tokenizer
  problems = [p for p, _ in zip(task.train_problems(None, seed=config.seed + 1), range(n), strict=False)]
  prompt_len = max(len(tok.encode_prompt(p.prompt)) for p in problems)
  rows = n + (-n) % jax.device_count()  # the sampler's batch splits over the devices; padding rows are dropped
  scfg = sampling.config_from(config.sampling, tok)
  sampler = Sampler(ctx.model_cfg, scfg, tok, ctx.mesh, ctx.rules, prompt_len, rows)
  out = sampler.sample(ctx.policy, [p.prompt for p in problems], jax.random.fold_in(ctx.key, 7))
  # The sampled token arrays are scored as they are (prompt right-aligned, then the completion), as the RL
  # loop scores its rollouts; re-encoding the decoded texts could not represent every sampled id.
  return float(np.mean(score(ctx, params, out["tokens"], out["prompt_mask"] | out["completion_mask"], rows)))


def train(ctx: Context, task: Any, log: Any = print) -> RewardModel:
  """Trains (or resumes, or loads when complete) the reward model; leaves it in `ctx.reward_model`."""
  cfg, config = ctx.config.reward_model, ctx.config
  abstract, param_sh = shardings(ctx)
  optimizer = state_lib.make_optimizer(cfg.learning_rate, weight_decay=cfg.weight_decay,
                                       warmup_steps=cfg.warmup_steps, total_steps=cfg.steps)
  state_sh = state_lib.state_shardings(optimizer, abstract, param_sh, ctx.mesh)
  targets = stage_run.state_targets(optimizer, abstract, state_sh)
  init = jax.jit(lambda b: heads.init(ctx.model_cfg, jax.random.key(0), backbone=b), out_shardings=param_sh)
  create = lambda backbone: state_lib.create(init(backbone), optimizer, ctx.mesh, param_sh)
  with stage_run.StageRun(config, ctx.workdir, "reward_model", cfg.steps, "reward_model_metrics.jsonl",
                          log=log) as run:
    state, params, extra = run.start(ctx, targets, create, cfg.init_from)
    if run.complete:
      ctx.reward_model = RewardModel(params, float(extra.get("reward_offset", 0.0)))
      return ctx.reward_model
    train_pairs, eval_pairs = pairs_lib.load_for_stage(ctx, task, "reward_model", run.log)
    max_len = config.preferences.max_len
    train_data, eval_data = pairs_lib.encode(ctx.tokenizer, train_pairs, max_len), pairs_lib.encode(
      ctx.tokenizer, eval_pairs, max_len)
    run.log(f"reward_model: {len(train_pairs)} training pairs, {len(eval_pairs)} held out; "
        f"{int(train_data['truncated'])} sides cut at max_len={max_len}")
    update = state_lib.make_update_fn(pair_loss(ctx.model_cfg), optimizer, state_sh, ctx.mesh, ctx.rules)
    if not run.start_step:
      before = evaluate(ctx, state.params, eval_pairs, eval_data, cfg.batch_size, "before")
    n = len(train_data["chosen_tokens"])
    spec = loop.LoopSpec(
      "reward_model", cfg.steps, cfg.log_every,
      lambda step: pairs_lib.take(train_data, pairs_lib.step_indices(n, cfg.batch_size, step, config.seed)),
      console=(("rm/accuracy", "accuracy"), ("rm/margin_mean", "margin")),
      curves=("train/loss", "rm/accuracy", "rm/margin_mean", "train/grad_norm"), save_last=False)
    state, last = loop.run_steps(ctx, run, state, update, spec, jax.random.fold_in(ctx.key, 8), run.log)
    after = evaluate(ctx, state.params, eval_pairs, eval_data, cfg.batch_size, "after")
    offset = reference_offset(ctx, state.params, task, cfg.normalize_samples) if cfg.normalize_samples else 0.0
    summary = {"after": after, "reward_offset": offset, "train_last": last}
    if not run.start_step:
      summary["before"] = before
    run.log("reward_model: held-out " + " | ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in after.items())
            + f" | offset {offset:+.4f}")
    if run.start_step < cfg.steps:  # else that checkpoint exists: the run stopped before marking the stage done
      run.save(cfg.steps, stage_run.state_items(state), {"reward_offset": offset})
    run.finish(summary)
  ctx.reward_model = RewardModel(state.params, offset)
  return ctx.reward_model
