"""The "dpo" stage: DPO (Rafailov et al. 2023) or IPO (Azar et al. 2023) on preference pairs, no sampling.

  h    = [log pi(y_c|x) - log ref(y_c|x)] - [log pi(y_r|x) - log ref(y_r|x)]      sequence log-probs
  dpo: -log sigmoid(beta h)   (cDPO with label_smoothing)      ipo: (h - 1/(2 beta))^2
  + nll_coef * mean(-log pi(y_c|x) / |y_c|)                      optional (RPO): keeps chosen responses likely

The reference is the frozen policy the stage starts from (the SFT model); its log-probs of every pair
are computed once. Metrics: implicit reward margins and accuracy, chosen/rejected log-probs and the
log-ratio on the chosen responses. With the synthetic task, the stage samples one completion per
held-out prompt from the reference and from the trained policy (same key) and reports the gold win
rate of the policy over the reference, both gold means, and KL(policy || reference) estimated on the
policy's samples.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.models import scoring
from rl_lm.rl import kl as kl_lib
from rl_lm.rl import preference
from rl_lm.tasks.preferences import SyntheticPreferences, gold_score
from rl_lm.train import loop, stage_run
from rl_lm.train import pairs as pairs_lib
from rl_lm.train import state as state_lib
from rl_lm.train.context import Context
from rl_lm.train.rollout import Sampler, in_batches


def _stacked(batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
  tokens = jnp.concatenate([batch["chosen_tokens"], batch["rejected_tokens"]], axis=0)  # [2B, T]
  mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]], axis=0)  # [2B, T]
  loss_mask = jnp.concatenate([batch["chosen_loss_mask"], batch["rejected_loss_mask"]], axis=0)  # [2B, T]
  return tokens, mask, loss_mask


def pair_logprobs(model_cfg: Any, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
  """Sequence log-probs of the completions, chosen rows then rejected rows, in one forward. -> [2B]"""
  tokens, mask, loss_mask = _stacked(batch)
  logp = scoring.score_tokens(model_cfg, params, tokens, mask).logp  # [2B, T]
  return preference.sequence_logprobs(logp, loss_mask)


def dpo_loss_fn(model_cfg: Any, cfg: Any):
  """loss_fn(params, batch, rng) for `state.make_update_fn`; the batch carries the reference log-probs."""

  def loss_fn(params, batch, rng):
    del rng
    pc, pr = preference.split_pairs(pair_logprobs(model_cfg, params, batch))
    loss, metrics = preference.dpo_loss(pc, pr, batch["ref_chosen_logp"], batch["ref_rejected_logp"], cfg.beta,
                                        loss_type=cfg.loss_type, label_smoothing=cfg.label_smoothing)
    if cfg.nll_coef:  # RPO (Pang et al. 2024): keep the chosen responses likely, per token
      tokens = jnp.maximum(batch["chosen_loss_mask"][:, 1:].sum(axis=1), 1)  # [B]
      nll = jnp.mean(-pc / tokens)
      loss = loss + cfg.nll_coef * nll
      metrics = dict(metrics, **{"dpo/nll_chosen": nll})
    return loss, metrics

  return loss_fn


def reference_logprobs_fn(model_cfg: Any) -> Any:
  """jit(params, batch) -> (chosen, rejected) sequence log-probs [B] each: the reference's, computed once."""
  return jax.jit(lambda p, b: preference.split_pairs(pair_logprobs(model_cfg, p, b)))


def reference_logprobs(ctx: Context, params: Any, data: dict[str, np.ndarray], batch_size: int
                       ) -> dict[str, np.ndarray]:
  """ref_chosen_logp / ref_rejected_logp [n] for every pair, in fixed-shape batches."""
  fn = reference_logprobs_fn(ctx.model_cfg)
  pairs = {k: v for k, v in data.items() if k != "truncated"}
  chosen, rejected = in_batches(lambda _, b: fn(params, b), pairs, batch_size, ctx.mesh, ctx.rules)
  return {"ref_chosen_logp": chosen, "ref_rejected_logp": rejected}


def gold_win_rate(ctx: Context, policy: Any, reference: Any, task: SyntheticPreferences, n: int
                  ) -> dict[str, float]:
  """One sample per held-out prompt from each model (same key); P(gold policy > gold reference), ties half."""
  tok, config = ctx.tokenizer, ctx.config
  problems = task.test_problems(n, seed=config.seed)
  rows = len(problems) + (-len(problems)) % max(jax.device_count(), 1)
  prompt_len = max(len(tok.encode_prompt(p.prompt)) for p in problems)
  scfg = sampling.config_from(config.sampling, tok)
  sampler = Sampler(ctx.model_cfg, scfg, tok, ctx.mesh, ctx.rules, prompt_len, rows)
  key = jax.random.fold_in(ctx.key, 9)
  prompts = [p.prompt for p in problems]
  out = sampler.sample(policy, prompts, key)
  ours, ref = out["texts"], sampler.sample(reference, prompts, key)["texts"]
  g_ours = np.asarray([gold_score(p, c) for p, c in zip(problems, ours, strict=True)])
  g_ref = np.asarray([gold_score(p, c) for p, c in zip(problems, ref, strict=True)])
  return {"dpo_eval/gold_win_rate": float(np.mean((g_ours > g_ref) + 0.5 * (g_ours == g_ref))),
          "dpo_eval/gold_mean": float(g_ours.mean()), "dpo_eval/gold_mean_reference": float(g_ref.mean()),
          "dpo_eval/kl_ref_seq": sampled_kl(ctx, policy, reference, out, config.sampling.temperature),
          "dpo_eval/prompts": float(len(problems))}


def sampled_kl(ctx: Context, policy: Any, reference: Any, out: dict[str, np.ndarray], temperature: float) -> float:
  """KL(policy || reference) per completion, estimated on the policy's own samples `out` (k1 summed over
  each completion's tokens, both log-probs from the trainer's forward at the sampling temperature)."""
  rollout = sampling.Rollout(**{k: out[k] for k in sampling.Rollout._fields})
  rollout = rollout._replace(**{k: mesh_lib.put(v, mesh_lib.batch_sharding(ctx.mesh, ctx.rules, v.shape))
                                for k, v in rollout._asdict().items()})

  def seq_kl(p, r, rollout):  # [B]
    logp = sampling.completion_logprobs(ctx.model_cfg, p, rollout, temperature)  # [B, P + N]
    ref_logp = sampling.completion_logprobs(ctx.model_cfg, r, rollout, temperature)
    return jnp.sum(kl_lib.estimate(logp, ref_logp, "k1", rollout.completion_mask), axis=1)

  return float(np.mean(mesh_lib.fetch(jax.jit(seq_kl)(policy, reference, rollout))))


def train(ctx: Context, task: Any, log: Any = print) -> dict[str, float]:
  """Runs the stage (resuming, or loading when complete) and leaves the trained policy in `ctx.policy`."""
  cfg, config = ctx.config.dpo, ctx.config
  optimizer = state_lib.make_optimizer(cfg.learning_rate, weight_decay=cfg.weight_decay,
                                       warmup_steps=cfg.warmup_steps, total_steps=cfg.steps)
  params_abstract = jax.eval_shape(lambda: ctx.policy)
  state_sh = state_lib.state_shardings(optimizer, params_abstract, ctx.param_shardings, ctx.mesh)
  targets = stage_run.state_targets(optimizer, params_abstract, state_sh)
  create = lambda p: state_lib.create(p, optimizer, ctx.mesh, ctx.param_shardings)
  with stage_run.StageRun(config, ctx.workdir, "dpo", cfg.steps, "dpo_metrics.jsonl", log=log) as run:
    state, ctx.policy, _ = run.start(ctx, targets, create, cfg.init_from)
    if run.complete:
      return {}
    reference = stage_run.frozen_copy(ctx.policy)
    train_pairs, _ = pairs_lib.load_for_stage(ctx, task, "dpo", run.log)
    data = pairs_lib.encode(ctx.tokenizer, train_pairs, config.preferences.max_len)
    data.pop("truncated")
    data.update(reference_logprobs(ctx, reference, data, cfg.batch_size))
    update = state_lib.make_update_fn(dpo_loss_fn(ctx.model_cfg, cfg), optimizer, state_sh, ctx.mesh, ctx.rules)
    n = len(data["chosen_tokens"])
    spec = loop.LoopSpec(
      "dpo", cfg.steps, cfg.log_every,
      lambda step: pairs_lib.take(data, pairs_lib.step_indices(n, cfg.batch_size, step, config.seed)),
      console=(("dpo/accuracy", "accuracy"), ("dpo/reward_margin", "margin"), ("dpo/logratio_chosen", "logratio")),
      curves=("train/loss", "dpo/accuracy", "dpo/reward_margin", "dpo/logratio_chosen", "dpo/reward_chosen",
              "dpo/reward_rejected"))
    state, last = loop.run_steps(ctx, run, state, update, spec, jax.random.fold_in(ctx.key, 10), run.log)
    summary: dict[str, Any] = {"train_last": last}
    if isinstance(task, SyntheticPreferences) and cfg.eval_prompts:
      summary["eval"] = gold_win_rate(ctx, state.params, reference, task, cfg.eval_prompts)
      run.log("dpo: held-out " + " | ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in summary["eval"].items()))
    run.finish(summary)
  ctx.policy = state.params
  return summary
