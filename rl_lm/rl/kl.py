"""KL between the policy and the reference: per-token estimators, KL-in-reward, and KL controllers.

Estimators (Schulman, "Approximating KL divergence", 2020). Tokens are sampled from the policy
pi, so with log r = log ref(x) - log pi(x) the estimators of KL(pi || ref) are
  k1 = -log r                 unbiased, high variance, can be negative
  k2 = (log r)^2 / 2          biased, low variance, >= 0
  k3 = (r - 1) - log r        unbiased, low variance, >= 0
k3 is computed as expm1(log r) - log r, which is exact near r = 1. No clamping is applied.

Controllers are pure functions over a `KLState` NamedTuple (a float32 coefficient), so the state
checkpoints with the rest of the train state and updates inside jit.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_lm.rl.masked import as_bool

KINDS = ("k1", "k2", "k3")


def estimate(logp: jax.Array, ref_logp: jax.Array, kind: str, mask: jax.Array | None = None) -> jax.Array:
  """Per-token KL(pi || ref) estimate. logp, ref_logp [B, T] -> [B, T] float32.

  `kind` is "k1", "k2" or "k3" (see module docstring). With `mask`, masked positions are 0 (and
  their log-probs, which may be garbage, never enter the arithmetic).
  """
  if kind not in KINDS:
    raise ValueError(f"unknown KL estimator kind {kind!r}; expected one of {KINDS}")
  log_r = jnp.asarray(ref_logp, jnp.float32) - jnp.asarray(logp, jnp.float32)  # [B, T]
  if mask is not None:
    log_r = jnp.where(as_bool(mask), log_r, 0.0)
  if kind == "k1":
    return -log_r
  if kind == "k2":
    return 0.5 * jnp.square(log_r)
  return jnp.expm1(log_r) - log_r


def penalised_rewards(scores: jax.Array, kl: jax.Array, mask: jax.Array, coef: float | jax.Array) -> jax.Array:
  """Token rewards for KL in the reward (Ziegler et al. 2019, InstructGPT). -> [B, T] float32.

  scores [B], kl [B, T], mask [B, T]: -coef * kl on every valid token, plus the sequence score on
  the row's last valid token. Masked positions are 0; a row with no valid token gets nothing.
  """
  m = as_bool(mask)  # [B, T]
  T = m.shape[1]
  kl = jnp.where(m, jnp.asarray(kl, jnp.float32), 0.0)
  last = T - 1 - jnp.argmax(m[:, ::-1], axis=1)  # [B], index of the last valid token
  is_last = (jnp.arange(T)[None, :] == last[:, None]) & m  # [B, T]
  score_tok = jnp.where(is_last, jnp.asarray(scores, jnp.float32)[:, None], 0.0)
  return jnp.where(m, -jnp.asarray(coef, jnp.float32) * kl, 0.0) + score_tok


class KLState(NamedTuple):
  """KL controller state: the current penalty coefficient (float32 scalar)."""

  coef: jax.Array


def init_kl_state(coef: float | jax.Array) -> KLState:
  """Controller state starting at `coef`."""
  return KLState(coef=jnp.asarray(coef, jnp.float32))


def fixed_controller(coef: float | jax.Array) -> KLState:
  """State of a fixed controller: `update_kl_state(..., adaptive=False)` leaves it unchanged."""
  return init_kl_state(coef)


def adaptive_update(
  state: KLState, current_kl: float | jax.Array, n_steps: int | jax.Array, target: float, horizon: float
) -> KLState:
  """Adaptive KL controller of Ziegler et al. (2019), as TRL's `AdaptiveKLController.update`.

  error = clip(current_kl / target - 1, -0.2, 0.2); coef *= 1 + error * n_steps / horizon.
  `current_kl` is the measured KL (per sequence, batch mean, as in the paper), `n_steps` the number
  of samples it was measured on (TRL passes the batch size), `horizon` in the same units.
  """
  if not isinstance(target, jax.Array) and target <= 0:
    raise ValueError(f"adaptive KL target must be positive, got {target}")
  if not isinstance(horizon, jax.Array) and horizon <= 0:
    raise ValueError(f"adaptive KL horizon must be positive, got {horizon}")
  error = jnp.clip(jnp.asarray(current_kl, jnp.float32) / target - 1.0, -0.2, 0.2)
  mult = 1.0 + error * jnp.asarray(n_steps, jnp.float32) / horizon
  return KLState(coef=(state.coef * mult).astype(jnp.float32))


def update_kl_state(
  state: KLState,
  current_kl: float | jax.Array,
  n_steps: int | jax.Array,
  *,
  adaptive: bool,
  target: float | None = None,
  horizon: float | None = None,
) -> KLState:
  """One controller step. `adaptive` is static: False keeps the coefficient; True is `adaptive_update`."""
  if not adaptive:
    return state
  if target is None or horizon is None:
    raise ValueError("the adaptive KL controller needs both `target` and `horizon`")
  return adaptive_update(state, current_kl, n_steps, target, horizon)
