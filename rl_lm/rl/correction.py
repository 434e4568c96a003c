"""Rollout correction: importance weights and rejection for the gap between the sampler and the trainer.

The tokens were drawn by the sampler (pi_rollout: its own numerics, or parameters some updates old when rollouts
run ahead of training); the loss is built on the trainer's log-probs under the parameters that sampled (pi_old).
Every quantity here starts from the token log-ratio lr_t = clamp(old_logp_t - sampler_logp_t, -20, 20) on the
valid tokens, i.e. log(pi_old / pi_rollout), as verl's `rollout_corr_helper.py` (verl-project/verl 1dda039).

A ratio is taken at one of three levels (`config.rl.correction`):
  token      r_t = exp(lr_t)
  sequence   r_i = exp(clamp(sum_t lr_t, -20, 20)), the product of the row's token ratios, on every token of row i
  geometric  r_i = exp(mean_t lr_t), their geometric mean (length-normalised; verl keeps it only for rejection)

`importance_weights` turns the ratio into a weight that multiplies each token's loss:
  truncated IS (TIS, Yao et al. 2025):  w = min(r, cap)                           (lower = 0)
  IcePop-style masking (two-sided):     w = r if lower <= r <= cap, else 0         (lower > 0)
`rejection_mask` drops tokens (token level) or whole rows (sequence, geometric) whose ratio leaves [low, high]
from the loss mask (masked IS / rejection sampling): they leave the loss and its denominator.

Deliberate deviations from verl: the geometric level is offered for the IS weight too; IcePop's zero weights
stay in the token-mean denominator as in verl, while rejection removes the tokens from it; rejection bounds are
on the ratio pi_old / pi_rollout itself (verl states them on the k1 statistic, pi_rollout / pi_old, which is
the same band when low = 1 / high).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_lm.rl.losses import MAX_LOG_RATIO, Metrics
from rl_lm.rl.masked import as_bool, masked_count, masked_max, masked_mean

LEVELS = ("token", "sequence", "geometric")  # config.rl.correction.level and .reject


def log_ratio(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, level: str) -> jax.Array:
  """log(pi_old / pi_rollout) at `level` (module docstring), on every valid token, 0 elsewhere. [B, T] -> [B, T]."""
  if level not in LEVELS:
    raise ValueError(f"unknown correction level {level!r}; expected one of {LEVELS}")
  m = as_bool(mask)
  lr = jnp.where(m, jnp.clip(jnp.asarray(old_logp, jnp.float32) - jnp.asarray(sampler_logp, jnp.float32),
                             -MAX_LOG_RATIO, MAX_LOG_RATIO), 0.0)
  if level == "sequence":
    lr = jnp.clip(jnp.sum(lr, axis=-1, keepdims=True), -MAX_LOG_RATIO, MAX_LOG_RATIO)
  elif level == "geometric":
    lr = jnp.sum(lr, axis=-1, keepdims=True) / jnp.maximum(masked_count(m, axis=-1, keepdims=True), 1.0)
  return jax.lax.stop_gradient(jnp.where(m, lr, 0.0))


def importance_weights(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, level: str, cap: float,
                       lower: float = 0.0) -> tuple[jax.Array, Metrics]:
  """Per-token IS weights [B, T] (constants; 0 off the mask) and their metrics.

  lower = 0: truncated, w = min(r, cap); lower > 0: two-sided masking, w = r inside [lower, cap] and 0 outside.
  Metrics (means over valid tokens): offpolicy/is_weight_mean, offpolicy/is_weight_max, offpolicy/is_truncated_frac
  (raw ratio above cap: truncated, or masked with lower > 0), offpolicy/is_masked_frac (weight set to 0 by the
  two-sided band), offpolicy/is_ess (effective sample size of the weights over the valid tokens, as a fraction:
  (sum w)^2 / (n sum w^2); 1 when all are equal).
  """
  if not isinstance(cap, jax.Array) and cap <= 0:
    raise ValueError(f"importance-weight cap must be positive, got {cap}")
  if not isinstance(lower, jax.Array) and not 0 <= lower <= cap:
    raise ValueError(f"importance-weight lower bound must lie in [0, cap = {cap}], got {lower}")
  m = as_bool(mask)
  raw = jnp.exp(log_ratio(old_logp, sampler_logp, m, level))  # [B, T]
  above = raw > cap
  if lower > 0:
    outside = above | (raw < lower)
    w = jnp.where(outside, 0.0, raw)
  else:
    outside = jnp.zeros_like(m)
    w = jnp.minimum(raw, cap)
  w = jax.lax.stop_gradient(jnp.where(m, w, 0.0))
  n = masked_count(m)
  ess = jnp.where(n > 0, jnp.square(jnp.sum(w)) / jnp.maximum(n * jnp.sum(jnp.square(w)), 1e-30), 0.0)
  metrics = {
    "offpolicy/is_weight_mean": masked_mean(w, m),
    "offpolicy/is_weight_max": masked_max(w, m),
    "offpolicy/is_truncated_frac": masked_mean(above, m),
    "offpolicy/is_masked_frac": masked_mean(outside, m),
    "offpolicy/is_ess": ess,
  }
  return w, metrics


def rejection_mask(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, level: str, low: float,
                   high: float) -> tuple[jax.Array, Metrics]:
  """The loss mask without the tokens (token level) or rows (sequence, geometric) whose ratio leaves [low, high].
  -> (mask [B, T] bool, metrics). Metrics: offpolicy/rejected_frac (valid tokens dropped),
  offpolicy/rejected_rows_frac (rows with a valid token that lost at least one)."""
  if not 0 <= low <= 1 <= high:
    raise ValueError(f"rejection band must contain 1: 0 <= low <= 1 <= high, got [{low}, {high}]")
  m = as_bool(mask)
  r = jnp.exp(log_ratio(old_logp, sampler_logp, m, level))
  keep = m & (r >= low) & (r <= high)
  dropped = m & ~keep
  rows = jnp.any(m, axis=-1)
  metrics = {
    "offpolicy/rejected_frac": masked_mean(dropped, m),
    "offpolicy/rejected_rows_frac": masked_mean(jnp.any(dropped, axis=-1), rows),
  }
  return keep, metrics
