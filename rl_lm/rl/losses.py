"""Losses: aggregation modes, PPO's clipped policy loss, value loss, entropy, SFT (importance weights:
rl/correction.py; the policy losses by name, PPO's among them: rl/policy_losses.py).

All functions take [B, T] token arrays with an explicit mask, compute in float32, and return a
scalar loss (to minimise) plus a dict of float32 scalar metrics with namespaced keys. Every
denominator that can be zero is guarded: an all-masked batch gives loss 0, metrics 0, gradient 0.

Aggregation modes (`aggregate`), as verl's `loss_agg_mode`, with one deliberate difference:
  "token-mean"               sum over all valid tokens / number of valid tokens (DAPO)
  "seq-mean-token-mean"      mean over each row's valid tokens, then mean over rows with >= 1 valid token (GRPO)
  "seq-mean-token-sum"       sum over each row's valid tokens, then mean over rows with >= 1 valid token
  "seq-mean-token-sum-norm"  sum over each row's valid tokens / norm_constant (default T), then mean over
                             all B rows, empty ones included (Dr. GRPO, Liu et al. 2025: a true constant
                             normaliser, independent of how many rows are empty or how long responses are)
verl averages the two "seq-mean" modes over all rows, empty ones included; here an empty row is
left out of the mean so that padding rows do not dilute the loss. verl's "seq-mean-token-sum-norm"
divides by norm_constant only, i.e. it is B times the value here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_lm.rl.masked import as_bool, masked_count, masked_max, masked_mean, masked_sum

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")  # config.rl.loss_mode
Metrics = dict[str, jax.Array]
MAX_LOG_RATIO = 20.0  # every log-ratio is clamped to +-this, as verl: exp(20) ~ 5e8 keeps ratios and gradients finite


def _f32(x: jax.Array) -> jax.Array:
  return jnp.asarray(x, jnp.float32)


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {MODES}")


def aggregate(values: jax.Array, mask: jax.Array, mode: str, norm_constant: float | None = None) -> jax.Array:
  """Reduces per-token values [B, T] over the valid tokens to a scalar, by `mode` (module docstring).

  A fully masked row contributes nothing; an all-masked batch gives 0. `norm_constant` is used by
  "seq-mean-token-sum-norm" only (default T, the padded response length).
  """
  _check_mode(mode)
  x = _f32(values)  # [B, T]
  m = jnp.broadcast_to(as_bool(mask), x.shape)  # [B, T]
  if mode == "token-mean":
    return masked_mean(x, m)
  B, T = x.shape
  row_sum = masked_sum(x, m, axis=-1)  # [B]
  if mode == "seq-mean-token-sum-norm":
    c = T if norm_constant is None else norm_constant
    if not isinstance(c, jax.Array) and c <= 0:
      raise ValueError(f"norm_constant must be positive, got {c}")
    return jnp.sum(row_sum) / (jnp.asarray(c, jnp.float32) * max(B, 1))
  row_n = masked_count(m, axis=-1)  # [B]
  per_row = row_sum / jnp.maximum(row_n, 1.0) if mode == "seq-mean-token-mean" else row_sum  # [B]
  return masked_mean(per_row, row_n > 0)


def policy_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  clip_low: float = 0.2,
  clip_high: float = 0.2,
  dual_clip: float | None = None,
  mode: str = "token-mean",
  is_weights: jax.Array | None = None,
  norm_constant: float | None = None,
) -> tuple[jax.Array, Metrics]:
  """PPO clipped surrogate with asymmetric clip (clip-higher, DAPO) and optional dual clip. -> (loss, metrics).

  logp, old_logp, mask: [B, T]; advantages: [B] (broadcast to every token) or [B, T].
  ratio = exp(logp - old_logp) (log-ratio clamped to +-20 as verl, and 0 at masked positions);
  per-token loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high));
  dual clip (Ye et al. 2020), where A < 0 only: min(that, -A * dual_clip), dual_clip > 1.
  `is_weights` [B, T] (truncated IS weights) multiply the per-token loss. old_logp, advantages and
  is_weights are constants (stop_gradient). Aggregated by `aggregate(mode, norm_constant)`.

  Metrics, masked means over valid tokens (the gradient is exactly zero on the counted tokens):
    policy/clip_frac_low   A < 0 and ratio < 1 - clip_low
    policy/clip_frac_high  A > 0 and ratio > 1 + clip_high
    policy/clip_frac       their sum
    policy/dual_clip_frac  A < 0 and ratio > dual_clip (0 without dual clip)
    policy/approx_kl       k3 estimate of KL(pi_old || pi): ratio - 1 - log ratio
    policy/ratio_mean, policy/ratio_max (0 on an empty batch)
  """
  _check_mode(mode)
  if dual_clip is not None and not dual_clip > 1.0:
    raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
  m = as_bool(mask)  # [B, T]
  logp = _f32(logp)
  old_logp = jax.lax.stop_gradient(_f32(old_logp))
  adv = jax.lax.stop_gradient(_f32(advantages))
  if adv.ndim == 1:
    adv = adv[:, None]
  adv = jnp.where(m, jnp.broadcast_to(adv, m.shape), 0.0)  # [B, T]

  log_ratio = jnp.where(m, jnp.clip(logp - old_logp, -MAX_LOG_RATIO, MAX_LOG_RATIO), 0.0)  # [B, T]
  ratio = jnp.exp(log_ratio)
  loss_unclipped = -adv * ratio
  loss_clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  loss_tok = jnp.maximum(loss_unclipped, loss_clipped)  # [B, T]
  if dual_clip is not None:
    loss_tok = jnp.where(adv < 0, jnp.minimum(loss_tok, -adv * dual_clip), loss_tok)
  if is_weights is not None:
    loss_tok = loss_tok * jax.lax.stop_gradient(_f32(is_weights))
  loss = aggregate(loss_tok, m, mode, norm_constant)

  r = jax.lax.stop_gradient(ratio)
  low = (adv < 0) & (r < 1.0 - clip_low)
  high = (adv > 0) & (r > 1.0 + clip_high)
  dual = (adv < 0) & (r > dual_clip) if dual_clip is not None else jnp.zeros_like(m)
  lr = jax.lax.stop_gradient(log_ratio)
  metrics = {
    "policy/clip_frac_low": masked_mean(low, m),
    "policy/clip_frac_high": masked_mean(high, m),
    "policy/clip_frac": masked_mean(low | high, m),
    "policy/dual_clip_frac": masked_mean(dual, m),
    "policy/approx_kl": masked_mean(jnp.expm1(lr) - lr, m),
    "policy/ratio_mean": masked_mean(r, m),
    "policy/ratio_max": masked_max(r, m),
  }
  return loss, metrics


def value_loss(
  values: jax.Array,
  old_values: jax.Array,
  returns: jax.Array,
  mask: jax.Array,
  clip: float | None = 0.2,
  mode: str = "token-mean",
  norm_constant: float | None = None,
) -> tuple[jax.Array, Metrics]:
  """Clipped value loss (PPO, as verl). [B, T] each -> (loss, metrics).

  0.5 * max((v - R)^2, (old + clip(v - old, -clip, clip) - R)^2), aggregated by `mode`;
  `clip=None` gives 0.5 * (v - R)^2. old_values and returns are constants.
  Metrics: value/clip_frac (valid tokens where the clipped term is strictly larger, so the gradient
  is zero), value/mean (mean predicted value), value/error (mean (v - R)^2, unclipped).
  """
  _check_mode(mode)
  m = as_bool(mask)  # [B, T]
  v = jnp.where(m, _f32(values), 0.0)
  old = jnp.where(m, jax.lax.stop_gradient(_f32(old_values)), 0.0)
  ret = jnp.where(m, jax.lax.stop_gradient(_f32(returns)), 0.0)
  err_unclipped = jnp.square(v - ret)  # [B, T]
  if clip is None:
    loss_tok = 0.5 * err_unclipped
    clipped = jnp.zeros_like(m)
  else:
    v_clipped = old + jnp.clip(v - old, -clip, clip)
    err_clipped = jnp.square(v_clipped - ret)
    loss_tok = 0.5 * jnp.maximum(err_unclipped, err_clipped)
    clipped = jax.lax.stop_gradient(err_clipped > err_unclipped)
  metrics = {
    "value/clip_frac": masked_mean(clipped, m),
    "value/mean": masked_mean(jax.lax.stop_gradient(v), m),
    "value/error": masked_mean(jax.lax.stop_gradient(err_unclipped), m),
  }
  return aggregate(loss_tok, m, mode, norm_constant), metrics


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Entropy of softmax(logits) in nats, float32. [B, T, V] -> [B, T].

  Stable for large logits and for -inf logits (filtered tokens contribute 0, gradient finite).
  """
  logp = jax.nn.log_softmax(_f32(logits), axis=-1)  # [B, T, V]
  p = jnp.exp(logp)
  return -jnp.sum(p * jnp.where(p > 0, logp, 0.0), axis=-1)


def entropy_bonus(
  entropy: jax.Array, mask: jax.Array, coef: float | jax.Array, mode: str = "token-mean",
  norm_constant: float | None = None,
) -> jax.Array:
  """coef * aggregate(entropy [B, T]): a scalar to subtract from the loss to encourage exploration."""
  return jnp.asarray(coef, jnp.float32) * aggregate(entropy, mask, mode, norm_constant)


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log softmax(logits)[target], float32. logits [B, T, V], targets [B, T] int -> [B, T]."""
  logits = _f32(logits)
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]  # [B, T]
  return picked - jax.nn.logsumexp(logits, axis=-1)


def next_token_logprobs(logits: jax.Array, tokens: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Log-prob of each token given the ones before it, from a forward pass over the same tokens.

  logits [B, T, V] (logits[:, t] predicts tokens[:, t + 1]), tokens [B, T] -> [B, T] float32, aligned
  with `tokens`: out[:, t] = log softmax(logits[:, t - 1] / temperature)[tokens[:, t]]; out[:, 0] = 0
  (nothing predicts the first token). The sampler, the RL trainer and DPO all score tokens with this.
  """
  lp = token_logprobs(logits[:, :-1] / temperature, tokens[:, 1:])  # [B, T-1]
  return jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)


def token_nll(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> tuple[jax.Array, Metrics]:
  """SFT loss: mean negative log-likelihood over the target tokens selected by mask. -> (loss, metrics).

  logits [B, T, V] predict targets [B, T] (already shifted: logits[:, t] scores targets[:, t]).
  Metrics: sft/nll (= loss), sft/accuracy (argmax hits), sft/tokens (number of counted tokens).
  """
  return nll_from_scores(token_logprobs(logits, targets), jnp.argmax(logits, axis=-1) == targets, mask)


def nll_from_scores(logp: jax.Array, hits: jax.Array, mask: jax.Array) -> tuple[jax.Array, Metrics]:
  """`token_nll` from per-token log-probs and argmax hits [B, T] (rl_lm.models.scoring gives both)."""
  m = as_bool(mask)  # [B, T]
  loss = masked_mean(-logp, m)
  metrics = {
    "sft/nll": jax.lax.stop_gradient(loss),
    "sft/accuracy": masked_mean(hits, m),
    "sft/tokens": masked_count(m),
  }
  return loss, metrics
