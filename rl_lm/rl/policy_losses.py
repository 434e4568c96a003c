"""The policy losses by name (`config.rl.policy_loss`): PPO's clipped surrogate, GSPO, CISPO, GMPO, Clip-Cov, KL-Cov.

A loss is registered with a decorator, as verl's `register_policy_loss`, and selected by name through `compute`;
the config takes its allowed values from `LOSSES`, so registering one makes it a valid `config.rl.policy_loss`:

  @policy_losses.register("my_loss", options={"ratio": "cov_ratio"})   # keyword argument <- config.rl field
  def my_loss(logp, old_logp, advantages, mask, clip_low, clip_high, mode="token-mean", is_weights=None,
              norm_constant=None, ratio=2e-4) -> tuple[jax.Array, Metrics]: ...

Every loss takes logp (current policy, with gradient), old_logp (the trainer's log-probs under the parameters that
sampled, or the proximal policy), advantages ([B] or [B, T]), mask [B, T], the clip ranges, the aggregation mode
and optional rollout-correction weights (`is_weights` [B, T], multiplied into the per-token loss after clipping,
as verl does), then its own options, which `options(config.rl)` reads from the config fields it registered. All
return (loss, metrics) with the metric keys of `losses.policy_loss` (PPO's) where they mean the same thing.

Conventions follow verl's `core_algos.py` (verl-project/verl 1dda039, August 2026). Deliberate deviations:
- Aggregation is `losses.aggregate`, which leaves rows with no valid token out of the seq-mean modes (see
  losses.py). GSPO and GMPO are sequence-level objectives (registered `sequence_level`), and verl forces GSPO to
  "seq-mean-token-mean" and gives GMPO a plain mean over sequences; here `config.rl` requires loss_mode
  "seq-mean-token-mean" for both instead of overriding the configured mode silently, and GMPO's per-sequence loss
  is spread over the row's tokens so that mode gives the mean over sequences.
- Every log-ratio is clamped to +-20 (`losses.MAX_LOG_RATIO`) before it is exponentiated or summed (verl leaves
  GSPO's token log-ratios and GMPO's unclamped and clamps GSPO's result at +10 only), so no input gives an inf or
  a NaN.
- Clip-Cov zeroes the loss of a random subset of the in-band tokens in verl (torch.randperm); here the subset is
  the tokens with the largest covariance in the band, so the loss is deterministic under jit (top-k, as KL-Cov).
- The covariances of Clip-Cov and KL-Cov are taken over the micro-batch (as verl: over its local micro-batch).
- GMPO multiplies the sequence loss by the geometric mean of the row's IS weights, as verl.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rl_lm.registry import Registry
from rl_lm.rl import losses
from rl_lm.rl.losses import MAX_LOG_RATIO, Metrics
from rl_lm.rl.masked import as_bool, masked_count, masked_max, masked_mean


class PolicyLoss(NamedTuple):
  """A registered policy loss."""

  fn: Callable[..., tuple[jax.Array, Metrics]]  # (logp, old_logp, advantages, mask, clip_low, clip_high, mode,
  #                                               is_weights, norm_constant, **options) -> (loss, metrics)
  options: Mapping[str, str]  # its own keyword arguments -> the config.rl fields that set them
  sequence_level: bool  # one objective per sequence: needs loss_mode "seq-mean-token-mean"


LOSSES: Registry[PolicyLoss] = Registry("policy loss", "policy losses")


def register(name: str, options: Mapping[str, str] | None = None, sequence_level: bool = False
             ) -> Callable[[Callable], Callable]:
  """Decorator: `config.rl.policy_loss = name` selects the decorated loss, which `compute` calls with the
  config.rl fields named in `options` ({keyword argument: field}). Returns the function unchanged."""

  def wrap(fn: Callable) -> Callable:
    LOSSES.add(name, PolicyLoss(fn, dict(options or {}), sequence_level))
    return fn

  return wrap


@register("ppo", options={"dual_clip": "dual_clip"})
def ppo_loss(logp, old_logp, advantages, mask, clip_low, clip_high, mode="token-mean", is_weights=None,
             norm_constant=None, dual_clip=None) -> tuple[jax.Array, Metrics]:
  """PPO's clipped surrogate, `losses.policy_loss` (there with its formula), in this module's argument order;
  the only loss with a dual clip (`dual_clip` > 1; 0 or None: off, as config.rl.dual_clip)."""
  return losses.policy_loss(logp, old_logp, advantages, mask, clip_low, clip_high, dual_clip or None, mode,
                            is_weights, norm_constant)


def _prepare(logp, old_logp, advantages, mask):
  """Common inputs: (mask bool, logp f32, old_logp const, advantages const [B, T] zero off-mask, clamped log-ratio)."""
  m = as_bool(mask)
  logp = jnp.asarray(logp, jnp.float32)
  old = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
  adv = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
  if adv.ndim == 1:
    adv = adv[:, None]
  adv = jnp.where(m, jnp.broadcast_to(adv, m.shape), 0.0)
  log_ratio = jnp.where(m, jnp.clip(logp - old, -MAX_LOG_RATIO, MAX_LOG_RATIO), 0.0)
  return m, logp, old, adv, log_ratio


def _weighted(loss_tok: jax.Array, is_weights: jax.Array | None) -> jax.Array:
  return loss_tok if is_weights is None else loss_tok * jax.lax.stop_gradient(jnp.asarray(is_weights, jnp.float32))


def _ratio_metrics(log_ratio: jax.Array, m: jax.Array) -> Metrics:
  lr = jax.lax.stop_gradient(log_ratio)
  r = jnp.exp(lr)
  return {
    "policy/approx_kl": masked_mean(jnp.expm1(lr) - lr, m),
    "policy/ratio_mean": masked_mean(r, m),
    "policy/ratio_max": masked_max(r, m),
  }


@register("gspo", sequence_level=True)
def gspo_loss(logp, old_logp, advantages, mask, clip_low, clip_high, mode="seq-mean-token-mean", is_weights=None,
              norm_constant=None) -> tuple[jax.Array, Metrics]:
  """GSPO (Zheng et al. 2025): one length-normalised ratio per sequence, clipped per sequence.

  s_i = exp(mean_t (logp - old)) over row i's valid tokens; per token the ratio is
  s_it = exp(sg(log s_i) + logp_t - sg(logp_t)) (value s_i, gradient s_i * grad logp_t), and the loss is
  max(-A s_it, -A clip(s_it, 1 - clip_low, 1 + clip_high)) (no dual clip). Paper ranges: 3e-4, 4e-4.
  Metrics: policy/clip_frac (tokens whose sequence is clipped, gradient 0), the _low/_high split, ratio stats
  (of s_i, per token), approx_kl (token-level k3).
  """
  m, logp, _, adv, log_ratio = _prepare(logp, old_logp, advantages, mask)
  n = jnp.maximum(masked_count(m, axis=-1), 1.0)  # [B]
  seq_log_ratio = jnp.sum(log_ratio, axis=-1) / n  # [B]
  log_s = jax.lax.stop_gradient(seq_log_ratio)[:, None] + logp - jax.lax.stop_gradient(logp)  # [B, T]
  s = jnp.exp(jnp.where(m, log_s, 0.0))
  loss_tok = jnp.maximum(-adv * s, -adv * jnp.clip(s, 1.0 - clip_low, 1.0 + clip_high))
  loss = losses.aggregate(_weighted(loss_tok, is_weights), m, mode, norm_constant)
  sv = jax.lax.stop_gradient(s)
  low, high = (adv < 0) & (sv < 1.0 - clip_low), (adv > 0) & (sv > 1.0 + clip_high)
  metrics = {
    "policy/clip_frac_low": masked_mean(low, m), "policy/clip_frac_high": masked_mean(high, m),
    "policy/clip_frac": masked_mean(low | high, m), "policy/dual_clip_frac": jnp.zeros((), jnp.float32),
    **_ratio_metrics(log_ratio, m),
  }
  metrics["policy/ratio_mean"], metrics["policy/ratio_max"] = masked_mean(sv, m), masked_max(sv, m)
  return loss, metrics


@register("cispo")
def cispo_loss(logp, old_logp, advantages, mask, clip_low, clip_high, mode="token-mean", is_weights=None,
               norm_constant=None) -> tuple[jax.Array, Metrics]:
  """CISPO (MiniMax-M1, 2025): -sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * A * logp per token.

  The clipped ratio is a constant weight on each token's log-prob gradient, so no token loses its gradient
  (PPO's clip zeroes it). The paper clips above only: pass clip_low >= 1 for that (verl's example uses 10).
  Metrics: policy/clip_frac (tokens whose weight was clipped), its _low/_high split, ratio stats, approx_kl.
  """
  m, logp, _, adv, log_ratio = _prepare(logp, old_logp, advantages, mask)
  r = jnp.exp(log_ratio)
  w = jax.lax.stop_gradient(jnp.clip(r, max(1.0 - clip_low, 0.0), 1.0 + clip_high))
  loss_tok = jnp.where(m, -w * adv * logp, 0.0)
  loss = losses.aggregate(_weighted(loss_tok, is_weights), m, mode, norm_constant)
  rv = jax.lax.stop_gradient(r)
  low, high = rv < 1.0 - clip_low, rv > 1.0 + clip_high
  metrics = {
    "policy/clip_frac_low": masked_mean(low, m), "policy/clip_frac_high": masked_mean(high, m),
    "policy/clip_frac": masked_mean(low | high, m), "policy/dual_clip_frac": jnp.zeros((), jnp.float32),
    **_ratio_metrics(log_ratio, m),
  }
  return loss, metrics


@register("gmpo", sequence_level=True)
def gmpo_loss(logp, old_logp, advantages, mask, clip_low, clip_high, mode="seq-mean-token-mean", is_weights=None,
              norm_constant=None) -> tuple[jax.Array, Metrics]:
  """GMPO (Zhao et al. 2025): the geometric mean of the token ratios, clipped per token in log space.

  d_t = logp - old; dc_t = clip(d_t, -clip_low, clip_high); the pessimistic one for the sign of A:
  d*_t = sgn(A) min(sgn(A) d_t, sgn(A) dc_t); r_i = exp(mean_t d*_t); A_i = mean_t A_t;
  L_i = -A_i r_i (times the geometric mean of the row's IS weights). L_i is spread over the row's valid tokens,
  so "seq-mean-token-mean" gives the mean over sequences. Paper ranges: 0.4, 0.4 (ratios in [e^-0.4, e^0.4]).
  Metrics: policy/clip_frac_high (A > 0, d clipped), policy/clip_frac_low (A < 0, d clipped), their sum,
  ratio stats of r_i per token, approx_kl.
  """
  m, _, _, adv, d = _prepare(logp, old_logp, advantages, mask)  # d [B, T]: the log-ratio, with gradient
  dc = jnp.clip(d, -clip_low, clip_high)
  sign = jnp.sign(adv)
  d_star = sign * jnp.minimum(sign * d, sign * dc)  # A = 0 gives 0
  n = jnp.maximum(masked_count(m, axis=-1), 1.0)  # [B]
  r = jnp.exp(jnp.sum(jnp.where(m, d_star, 0.0), axis=-1) / n)  # [B]
  a_seq = jnp.sum(adv, axis=-1) / n  # [B]
  loss_seq = -a_seq * r
  if is_weights is not None:
    logw = jnp.log(jax.lax.stop_gradient(jnp.asarray(is_weights, jnp.float32)) + 1e-10)
    loss_seq = loss_seq * jnp.exp(jnp.sum(jnp.where(m, logw, 0.0), axis=-1) / n)
  loss = losses.aggregate(jnp.broadcast_to(loss_seq[:, None], m.shape), m, mode, norm_constant)
  clipped = jax.lax.stop_gradient(d != dc)
  rv = jax.lax.stop_gradient(jnp.broadcast_to(r[:, None], m.shape))
  metrics = {
    "policy/clip_frac_low": masked_mean(clipped & (adv < 0), m),
    "policy/clip_frac_high": masked_mean(clipped & (adv > 0), m),
    "policy/clip_frac": masked_mean(clipped & (adv != 0), m), "policy/dual_clip_frac": jnp.zeros((), jnp.float32),
    **_ratio_metrics(d, m),
  }
  metrics["policy/ratio_mean"], metrics["policy/ratio_max"] = masked_mean(rv, m), masked_max(rv, m)
  return loss, metrics


def _covariance(logp: jax.Array, adv: jax.Array, m: jax.Array) -> jax.Array:
  """Per-token centred product (A - mean A)(logp - mean logp) over the valid tokens; -inf elsewhere. [B, T]."""
  lp = jax.lax.stop_gradient(logp)
  cov = (adv - masked_mean(adv, m)) * (lp - masked_mean(lp, m))
  return jnp.where(m, cov, -jnp.inf)


def _top_tokens(score: jax.Array, k: jax.Array) -> jax.Array:
  """The k largest entries of score [B, T] (finite ones only), as a bool mask; k a traced int."""
  flat = score.reshape(-1)
  order = jnp.argsort(-flat)
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(flat.shape[0]))
  return ((rank < k) & jnp.isfinite(flat)).reshape(score.shape)


@register("clip_cov", options={"ratio": "cov_ratio", "cov_low": "cov_low", "cov_high": "cov_high"})
def clip_cov_loss(logp, old_logp, advantages, mask, clip_low, clip_high, mode="token-mean", is_weights=None,
                  norm_constant=None, ratio=2e-4, cov_low=1.0, cov_high=5.0) -> tuple[jax.Array, Metrics]:
  """Clip-Cov (Cui et al. 2025): PPO's clipped loss, with the gradient of a few high-covariance tokens cut.

  cov_t = (A_t - mean A)(logp_t - mean logp) over the valid tokens; among the tokens PPO has not clipped whose
  cov lies in (cov_low, cov_high), the max(1, int(ratio * valid tokens)) largest get loss 0 (verl: a random
  subset of that size). No dual clip, log-ratio clamped to +-20.
  Metrics: policy/cov_clip_frac (tokens cut), the PPO clip fractions, ratio stats, approx_kl.
  """
  m, logp, _, adv, log_ratio = _prepare(logp, old_logp, advantages, mask)
  r = jnp.exp(log_ratio)
  l1, l2 = -adv * r, -adv * jnp.clip(r, 1.0 - clip_low, 1.0 + clip_high)
  cov = _covariance(logp, adv, m)
  band = m & ~jax.lax.stop_gradient(l2 > l1) & (cov > cov_low) & (cov < cov_high)
  k = jnp.maximum((ratio * masked_count(m)).astype(jnp.int32), 1)
  cut = _top_tokens(jnp.where(band, cov, -jnp.inf), k)
  loss_tok = jnp.where(cut, 0.0, jnp.maximum(l1, l2))
  loss = losses.aggregate(_weighted(loss_tok, is_weights), m, mode, norm_constant)
  rv = jax.lax.stop_gradient(r)
  low, high = (adv < 0) & (rv < 1.0 - clip_low), (adv > 0) & (rv > 1.0 + clip_high)
  metrics = {
    "policy/cov_clip_frac": masked_mean(cut, m),
    "policy/clip_frac_low": masked_mean(low, m), "policy/clip_frac_high": masked_mean(high, m),
    "policy/clip_frac": masked_mean(low | high, m), "policy/dual_clip_frac": jnp.zeros((), jnp.float32),
    **_ratio_metrics(log_ratio, m),
  }
  return loss, metrics


@register("kl_cov", options={"ratio": "cov_ratio", "kl_coef": "cov_kl_coef"})
def kl_cov_loss(logp, old_logp, advantages, mask, clip_low, clip_high, mode="token-mean", is_weights=None,
                norm_constant=None, ratio=2e-4, kl_coef=0.1) -> tuple[jax.Array, Metrics]:
  """KL-Cov (Cui et al. 2025): the unclipped surrogate -A * ratio, plus kl_coef * |logp - old| on the
  max(1, int(ratio * valid tokens)) tokens of largest covariance (A - mean A)(logp - mean logp).

  No clipping (clip_low and clip_high are ignored). Metrics: policy/kl_cov_frac (tokens penalised),
  policy/abs_kl (mean |logp - old|), ratio stats, approx_kl; the clip fractions are 0.
  """
  del clip_low, clip_high
  m, logp, _, adv, log_ratio = _prepare(logp, old_logp, advantages, mask)
  r = jnp.exp(log_ratio)
  k = jnp.maximum((ratio * masked_count(m)).astype(jnp.int32), 1)
  top = _top_tokens(_covariance(logp, adv, m), k)
  abs_kl = log_ratio * jnp.sign(jax.lax.stop_gradient(log_ratio))  # |lr|, gradient sign(lr): 0 at 0, as torch
  loss_tok = -adv * r + jnp.where(top, kl_coef * abs_kl, 0.0)
  loss = losses.aggregate(_weighted(loss_tok, is_weights), m, mode, norm_constant)
  zero = jnp.zeros((), jnp.float32)
  metrics = {
    "policy/kl_cov_frac": masked_mean(top, m),
    "policy/abs_kl": masked_mean(jnp.abs(jax.lax.stop_gradient(log_ratio)), m),
    "policy/clip_frac_low": zero, "policy/clip_frac_high": zero, "policy/clip_frac": zero,
    "policy/dual_clip_frac": zero, **_ratio_metrics(log_ratio, m),
  }
  return loss, metrics


def compute(name: str, logp, old_logp, advantages, mask, clip_low, clip_high, mode="token-mean", is_weights=None,
            norm_constant=None, **options) -> tuple[jax.Array, Metrics]:
  """The policy loss registered as `name` (an unknown one raises, listing `LOSSES`); `options` go to the loss
  itself (ppo: dual_clip; clip_cov: ratio, cov_low, cov_high; kl_cov: ratio, kl_coef), see `options`."""
  return LOSSES.get(name).fn(logp, old_logp, advantages, mask, clip_low, clip_high, mode, is_weights, norm_constant,
                             **options)


def options(rl: Any) -> dict[str, Any]:
  """The options `compute` passes to the loss `rl.policy_loss`, read from `config.rl` as it registered them."""
  return {arg: getattr(rl, field) for arg, field in LOSSES.get(rl.policy_loss).options.items()}
