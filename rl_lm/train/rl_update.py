"""The jitted pieces of the RL loop (rl_lm/train/rl.py): scoring a rollout, advantages, the update.

Arrays are aligned per token: `logp[b, t]` is the log-prob of `tokens[b, t]` given the tokens
before it, and `mask[b, t]` marks completion tokens that train. Values follow the same alignment:
`values[b, t]` is the value of the state just before token t.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import mesh as mesh_lib
from rl_lm.models import heads, transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.rl import advantages as adv_lib
from rl_lm.rl import kl as kl_lib
from rl_lm.rl import losses, masked
from rl_lm.train import state as state_lib

GROUP_ALGORITHMS = ("grpo", "dr_grpo", "rloo")


class RLState(NamedTuple):
  policy: state_lib.TrainState
  value: state_lib.TrainState | None  # PPO only
  kl: kl_lib.KLState


# ------------------------------------------------------------------------------------------------
# Per-token quantities


def logprobs_and_entropy(cfg: ModelConfig, params: Any, tokens: jax.Array, mask: jax.Array, temperature: float
                         ) -> tuple[jax.Array, jax.Array]:
  """Log-prob of each token under params (temperature-scaled) and the entropy of the distribution it was
  drawn from. tokens, mask [B, T] -> ([B, T], [B, T]); column 0 is 0 (nothing predicts it)."""
  logits = transformer.forward(cfg, params, tokens, mask)  # [B, T, V]
  ent = losses.entropy_from_logits(logits[:, :-1] / temperature)  # [B, T-1]
  return losses.next_token_logprobs(logits, tokens, temperature), jnp.concatenate([jnp.zeros_like(ent[:, :1]), ent], 1)


def token_values(cfg: ModelConfig, value_params: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """values[b, t]: the value head at position t - 1, the state before token t. -> [B, T]."""
  v = heads.forward(cfg, value_params, tokens, mask)
  return jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], 1)


def make_prepare_fn(cfg: ModelConfig, temperature: float, mesh: Any, rules: mesh_lib.Rules, with_value: bool
                    ) -> Callable[..., dict[str, jax.Array]]:
  """jit(policy, reference, value, tokens, attn_mask) -> old_logp, ref_logp, entropy[, values] (all [B, T])."""

  def prepare(policy, reference, value, tokens, attn_mask):
    old_logp, entropy = logprobs_and_entropy(cfg, policy, tokens, attn_mask, temperature)
    ref_logp, _ = logprobs_and_entropy(cfg, reference, tokens, attn_mask, temperature)
    out = {"old_logp": old_logp, "ref_logp": ref_logp, "entropy": entropy}
    if with_value:
      out["values"] = token_values(cfg, value, tokens, attn_mask)
    return out

  return jax.jit(mesh_lib.bind(prepare, mesh, rules))


# ------------------------------------------------------------------------------------------------
# Advantages


def compute_advantages(rl: Any, scores: np.ndarray, valid: np.ndarray, mask: np.ndarray, prepared: dict,
                       kl_coef: float) -> dict[str, np.ndarray]:
  """Advantages [B, T] (and returns for PPO) for the configured algorithm. Invalid rows get 0."""
  G = rl.group_size
  scores_j, valid_j, mask_j = jnp.asarray(scores, jnp.float32), jnp.asarray(valid), jnp.asarray(mask)
  out: dict[str, Any] = {}
  if rl.algorithm in GROUP_ALGORITHMS:
    if rl.algorithm == "rloo":
      adv = adv_lib.rloo(scores_j, G, valid=valid_j)
    else:
      adv = adv_lib.grpo(scores_j, G, scale_by_std=rl.scale_by_std and rl.algorithm == "grpo", valid=valid_j)
    out["advantages"] = adv_lib.broadcast_to_tokens(adv, mask_j)
  else:
    kl_tok = kl_lib.estimate(prepared["old_logp"], prepared["ref_logp"], rl.kl.estimator, mask=mask_j)
    coef = kl_coef if rl.kl.placement == "reward" else 0.0
    token_rewards = kl_lib.penalised_rewards(scores_j, kl_tok, mask_j, coef)
    if rl.algorithm == "reinforce_pp":
      out["advantages"] = adv_lib.reinforce_pp(token_rewards, mask_j & valid_j[:, None], gamma=rl.value.gamma)
    else:  # ppo
      adv, ret = adv_lib.gae(token_rewards, prepared["values"], mask_j, rl.value.gamma, rl.value.lam)
      if rl.value.whiten_advantages:
        adv = masked.whiten(adv, mask_j & valid_j[:, None])
      out["advantages"], out["returns"] = adv, ret
  out["advantages"] = jnp.where(valid_j[:, None] & mask_j, out["advantages"], 0.0)
  return {k: np.asarray(v) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------
# The update


def is_max_metric(key: str) -> bool:
  """Metrics that combine across micro-batches and minibatches by max rather than by (weighted) mean."""
  return key.endswith("_max")


def micro_weights(mask: np.ndarray, mode: str) -> np.ndarray:
  """Weights of the micro-batches [A, m, T] of one minibatch, so that the weighted sum of their
  aggregated losses is the minibatch's aggregated loss exactly. -> [A]."""
  if mode == "token-mean":
    per = mask.sum(axis=(1, 2)).astype(np.float64)
  elif mode == "seq-mean-token-sum-norm":
    per = np.full(mask.shape[0], mask.shape[1], np.float64)
  else:
    per = mask.any(axis=2).sum(axis=1).astype(np.float64)
  total = per.sum()
  return (per / total if total > 0 else np.zeros_like(per)).astype(np.float32)


def make_update_fn(cfg: ModelConfig, rl: Any, temperature: float, norm_constant: int, optimizers: tuple,
                   shardings: RLState, mesh: Any, rules: mesh_lib.Rules) -> Callable:
  """update_fn(state, minibatch, rng) -> (state, metrics), jitted once with the state donated.

  minibatch: arrays [A, m, T] (A micro-batches accumulated into one optimizer step) and `weight` [A].
  """
  policy_opt, value_opt = optimizers
  kl_in_loss = rl.kl.placement == "loss"
  dual = rl.dual_clip if rl.dual_clip > 0 else None
  is_ppo = rl.algorithm == "ppo"

  def micro_loss(params, mb, kl_coef):
    policy, value = params
    logp, ent = logprobs_and_entropy(cfg, policy, mb["tokens"], mb["attn_mask"], temperature)
    mask = mb["mask"]
    loss, metrics = losses.policy_loss(
      logp, mb["old_logp"], mb["advantages"], mask, clip_low=rl.clip_low, clip_high=rl.clip_high,
      dual_clip=dual, mode=rl.loss_mode, is_weights=mb["is_weights"], norm_constant=norm_constant)
    metrics = dict(metrics)
    metrics["policy/pg_loss"] = loss
    kl_tok = kl_lib.estimate(logp, mb["ref_logp"], rl.kl.estimator, mask=mask)
    kl_term = losses.aggregate(kl_tok, mask, rl.loss_mode, norm_constant)
    metrics["policy/kl_loss"] = kl_term
    if kl_in_loss:
      loss = loss + kl_coef * kl_term
    ent_term = losses.aggregate(ent, mask, rl.loss_mode, norm_constant)
    metrics["policy/entropy_update"] = ent_term
    if rl.entropy_coef:
      loss = loss - rl.entropy_coef * ent_term
    if is_ppo:
      v = token_values(cfg, value, mb["tokens"], mb["attn_mask"])
      vloss, vmetrics = losses.value_loss(v, mb["old_values"], mb["returns"], mask, clip=rl.value.clip or None,
                                          mode=rl.loss_mode, norm_constant=norm_constant)
      loss = loss + rl.value.coef * vloss
      metrics.update(vmetrics)
      metrics["value/loss"] = vloss
    return loss, metrics

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def update(state: RLState, minibatch: dict, rng: jax.Array):
    del rng  # the loss is deterministic; kept for dropout-style extensions
    params = (state.policy.params, state.value.params if state.value is not None else None)
    weights = minibatch.pop("weight")

    def body(acc, xs):
      mb, w = xs
      (loss, metrics), grads = grad_fn(params, mb, state.kl.coef)
      scaled = jax.tree.map(lambda g: g * w, grads)
      acc_grads, acc_metrics = acc
      acc_grads = jax.tree.map(jnp.add, acc_grads, scaled)
      metrics = dict(metrics, **{"train/loss": loss})
      acc_metrics = {k: jnp.maximum(a, metrics[k]) if is_max_metric(k) else a + w * metrics[k]
                     for k, a in acc_metrics.items()}
      return (acc_grads, acc_metrics), None

    zero_grads = jax.tree.map(jnp.zeros_like, params)
    first = jax.tree.map(lambda x: x[0], minibatch)
    metric_shapes = jax.eval_shape(lambda: grad_fn(params, first, state.kl.coef)[0][1])
    zero_metrics = {k: jnp.zeros(s.shape, jnp.float32) for k, s in metric_shapes.items()}
    zero_metrics["train/loss"] = jnp.zeros((), jnp.float32)
    (grads, metrics), _ = jax.lax.scan(body, (zero_grads, zero_metrics), (minibatch, weights))

    # One step for policy and value together: taken only when every gradient and both updated states are
    # finite, else both states are kept as they were.
    policy_grads, value_grads = grads
    ok = jnp.isfinite(state_lib.global_norm(grads))
    metrics["train/grad_norm"] = state_lib.global_norm(policy_grads)
    new_policy, metrics["train/update_norm"] = state_lib.propose(state.policy, policy_grads, policy_opt)
    ok = ok & state_lib.all_finite((new_policy.params, new_policy.opt_state))
    new_value = state.value
    if state.value is not None:
      metrics["value/grad_norm"] = state_lib.global_norm(value_grads)
      new_value, metrics["value/update_norm"] = state_lib.propose(state.value, value_grads, value_opt)
      ok = ok & state_lib.all_finite((new_value.params, new_value.opt_state))
      new_value = state_lib.accept(ok, new_value, state.value)
    metrics["train/skipped"] = (~ok).astype(jnp.float32)
    return RLState(state_lib.accept(ok, new_policy, state.policy), new_value, state.kl), metrics

  return jax.jit(mesh_lib.bind(update, mesh, rules), out_shardings=(shardings, None), donate_argnums=(0,))
