"""Advantage estimators: GAE (PPO), GRPO, Dr. GRPO, RLOO, REINFORCE++. Pure jnp, masks explicit, jittable.

By name. `config.rl.algorithm` selects an estimator from `ESTIMATORS`, where each is registered with a decorator
(the built-ins at the end of this file) as a function of the step's `Inputs` and `config.rl`:

  @advantages.register("my_algo", group=True)   # group: compares the samples of a group, scores whole sequences
  def my_algo(x: advantages.Inputs, rl) -> tuple[jax.Array, jax.Array | None]: ...   # (adv [B, T], returns)

`rl_lm.train.rl_update.advantages` calls it inside the jitted `prepare`; the config takes its allowed algorithms,
and which of them need a group (group_size >= 2, no KL in the reward), from the registry.

Layout. Token arrays are [B, T]; `mask[b, t]` marks the response tokens of row b (contiguous,
possibly after masked prompt positions and before masked padding). Rows of a group are adjacent:
B = n_prompts * group_size and row i belongs to group i // group_size. `group_size` is a static
Python int.

Invalid episodes. Every estimator takes `valid: [B] bool` (default all valid): an excluded row
(e.g. its verifier errored) gets advantage 0 and is left out of every statistic (group means and
standard deviations, batch whitening). A group with fewer than two valid members carries no
learning signal and gets 0 for all its rows.

Conventions (verl / TRL): the group standard deviation is the unbiased one (N - 1) with eps added
to it; a group whose valid rewards are all equal gets exactly 0 (not merely 0 up to rounding);
sequence advantages reach the tokens through `broadcast_to_tokens`. Results are float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm.registry import Registry
from rl_lm.rl.masked import as_bool, masked_mean, masked_var, whiten


def _valid_rows(valid: jax.Array | None, B: int) -> jax.Array:
  """[B] bool: the rows that take part (all of them when `valid` is None)."""
  return jnp.ones((B,), jnp.bool_) if valid is None else as_bool(valid).reshape(B)


def _grouped(scores: jax.Array, group_size: int, valid: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """Scores and validity [B] -> [n_groups, G] each, scores as float32."""
  scores = jnp.asarray(scores, jnp.float32)
  if scores.ndim != 1:
    raise ValueError(f"scores must be [B], got shape {scores.shape}")
  B = scores.shape[0]
  if group_size < 1 or B % group_size:
    raise ValueError(f"group_size must be a positive divisor of the batch size {B}, got {group_size}")
  v = _valid_rows(valid, B)
  return scores.reshape(-1, group_size), v.reshape(-1, group_size)


def _no_signal(s: jax.Array, v: jax.Array) -> jax.Array:
  """[n, G] scores and validity -> [n, 1] bool: the group's valid scores are all equal (or < 2 valid)."""
  hi = jnp.max(jnp.where(v, s, -jnp.inf), axis=1, keepdims=True)
  lo = jnp.min(jnp.where(v, s, jnp.inf), axis=1, keepdims=True)
  n = jnp.sum(v, axis=1, keepdims=True)
  return (n < 2) | (hi == lo)


def group_zero_variance(scores: jax.Array, group_size: int, valid: jax.Array | None = None) -> jax.Array:
  """[B] scores -> [n_groups] bool: True where all valid rewards of the group are equal.

  A group with fewer than two valid members counts as zero-variance (vacuously equal): like an
  all-equal group it gets advantage 0 and contributes no gradient.
  """
  s, v = _grouped(scores, group_size, valid)
  return _no_signal(s, v)[:, 0]


def group_zero_variance_host(scores: np.ndarray, group_size: int, valid: np.ndarray) -> np.ndarray:
  """`group_zero_variance` in numpy, for the host's statistics between steps (no device round trip)."""
  s = np.asarray(scores, np.float32).reshape(-1, group_size)
  v = np.asarray(valid, bool).reshape(-1, group_size)
  hi = np.max(np.where(v, s, -np.inf), axis=1)
  lo = np.min(np.where(v, s, np.inf), axis=1)
  return (np.sum(v, axis=1) < 2) | (hi == lo)


def grpo(
  scores: jax.Array, group_size: int, scale_by_std: bool = True, eps: float = 1e-6, valid: jax.Array | None = None
) -> jax.Array:
  """Group-relative advantages (Shao et al. 2024). [B] -> [B].

  (s - group mean) / (group std + eps) with the unbiased std over the group's valid members;
  `scale_by_std=False` is Dr. GRPO (Liu et al. 2025): s - group mean. Zero-variance groups,
  groups with fewer than two valid members, and invalid rows get exactly 0.
  """
  s, v = _grouped(scores, group_size, valid)  # [n, G]
  flat = _no_signal(s, v)  # [n, 1]
  adv = s - masked_mean(s, v, axis=1, keepdims=True)
  if scale_by_std:
    std = jnp.sqrt(masked_var(s, v, unbiased=True, axis=1, keepdims=True))  # [n, 1]
    adv = adv / jnp.where(flat, 1.0, std + eps)
  return jnp.where(v & ~flat, adv, 0.0).reshape(-1)


def dr_grpo(scores: jax.Array, group_size: int, valid: jax.Array | None = None) -> jax.Array:
  """Dr. GRPO advantages: s - group mean, no std scaling. [B] -> [B]."""
  return grpo(scores, group_size, scale_by_std=False, valid=valid)


def rloo(scores: jax.Array, group_size: int, valid: jax.Array | None = None) -> jax.Array:
  """REINFORCE leave-one-out (Ahmadian et al. 2024). [B] -> [B].

  s_i minus the mean of the other valid members of its group, i.e. n / (n - 1) * (s_i - mean)
  with n the group's valid count. Groups with n < 2 and invalid rows get 0.
  """
  s, v = _grouped(scores, group_size, valid)  # [n, G]
  flat = _no_signal(s, v)  # [n, 1]
  n = jnp.sum(v, axis=1, keepdims=True, dtype=jnp.float32)
  adv = (s - masked_mean(s, v, axis=1, keepdims=True)) * n / jnp.maximum(n - 1.0, 1.0)
  return jnp.where(v & ~flat, adv, 0.0).reshape(-1)


def broadcast_to_tokens(adv: jax.Array, mask: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """Sequence advantages [B] -> [B, T]: the row's advantage on each of its valid tokens, 0 elsewhere."""
  adv = jnp.asarray(adv, jnp.float32)
  m = as_bool(mask) & _valid_rows(valid, adv.shape[0])[:, None]  # [B, T]
  return jnp.where(m, adv[:, None], 0.0)


def _token_mask(mask: jax.Array, valid: jax.Array | None) -> jax.Array:
  m = as_bool(mask)  # [B, T]
  return m & _valid_rows(valid, m.shape[0])[:, None]


def gae(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  gamma: float,
  lam: float,
  bootstrap: jax.Array | None = None,
  whiten_advantages: bool = False,
  valid: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation (Schulman et al. 2016) over the valid tokens of each row.

  rewards, values, mask: [B, T]; bootstrap: [B] or None.
  delta_t = r_t + gamma * V_next - V_t, where V_next is the value of the row's next valid token,
  or `bootstrap[b]` after its last one (default 0: the episode terminated; pass a value estimate
  for a truncated one). A_t = delta_t + gamma * lam * A_next over valid tokens. Masked positions
  are skipped by the recursion and get advantage 0 and return 0. Returns = A + V on valid tokens,
  taken before the optional whitening (as verl), which then normalises A over all valid tokens.
  Returns (advantages [B, T], returns [B, T]), float32.
  """
  m = _token_mask(mask, valid)  # [B, T]
  r = jnp.where(m, jnp.asarray(rewards, jnp.float32), 0.0)  # [B, T]
  v = jnp.where(m, jnp.asarray(values, jnp.float32), 0.0)  # [B, T]
  B = m.shape[0]
  boot = jnp.zeros((B,), jnp.float32) if bootstrap is None else jnp.asarray(bootstrap, jnp.float32).reshape(B)

  def step(carry, xs):
    next_value, next_adv = carry  # [B], [B]
    r_t, v_t, m_t = xs  # [B] each
    a_t = r_t + gamma * next_value - v_t + gamma * lam * next_adv
    carry = (jnp.where(m_t, v_t, next_value), jnp.where(m_t, a_t, next_adv))
    return carry, jnp.where(m_t, a_t, 0.0)

  init = (boot, jnp.zeros((B,), jnp.float32))
  _, adv = jax.lax.scan(step, init, (r.T, v.T, m.T), reverse=True)  # [T, B]
  adv = adv.T  # [B, T]
  returns = jnp.where(m, adv + v, 0.0)
  if whiten_advantages:
    adv = whiten(adv, m)
  return adv, returns


def reinforce_pp(
  token_rewards: jax.Array, mask: jax.Array, gamma: float = 1.0, valid: jax.Array | None = None
) -> jax.Array:
  """REINFORCE++ (Hu 2025): discounted return-to-go whitened over the batch. [B, T] -> [B, T].

  G_t = r_t + gamma * G_next over the valid tokens of each row (masked positions are skipped and
  their rewards ignored; nothing follows the last valid token), then whitened (unbiased variance,
  mean shifted) over all valid tokens of all valid rows. Token rewards usually carry the KL
  penalty already (`kl.penalised_rewards`). Masked positions get 0.
  """
  m = _token_mask(mask, valid)  # [B, T]
  r = jnp.where(m, jnp.asarray(token_rewards, jnp.float32), 0.0)  # [B, T]

  def step(g_next, xs):
    r_t, m_t = xs  # [B] each
    g_t = jnp.where(m_t, r_t + gamma * g_next, g_next)
    return g_t, jnp.where(m_t, g_t, 0.0)

  _, returns = jax.lax.scan(step, jnp.zeros((m.shape[0],), jnp.float32), (r.T, m.T), reverse=True)  # [T, B]
  return whiten(returns.T, m)


# ------------------------------------------------------------------------------------------------
# By name: config.rl.algorithm


class Inputs(NamedTuple):
  """What an estimator may read: one step's rollout, on device."""

  scores: jax.Array  # [B] float32: each episode's score
  trains: jax.Array  # [B] bool: the rows that train (the others must get advantage 0)
  completion_mask: jax.Array  # [B, T] bool: completion tokens
  token_rewards: jax.Array | None  # [B, T]: the score on the last token, minus the KL penalty when it is placed in
  #                                  the reward (kl.penalised_rewards); None for the group estimators
  values: jax.Array | None  # [B, T]: the value head's values, for "ppo"; else None


EstimatorFn = Callable[[Inputs, Any], tuple[jax.Array, jax.Array | None]]  # (inputs, config.rl) -> (adv, returns)


class Estimator(NamedTuple):
  """A registered advantage estimator."""

  fn: EstimatorFn  # advantages [B, T] (rows that do not train are zeroed after it) and returns [B, T] or None
  group: bool  # compares the samples of a group and scores whole sequences: needs group_size >= 2, and has no
  #              per-token rewards for a KL penalty to go into


ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register(name: str, group: bool) -> Callable[[EstimatorFn], EstimatorFn]:
  """Decorator: `config.rl.algorithm = name` computes advantages with the decorated function (see `Estimator`)."""

  def wrap(fn: EstimatorFn) -> EstimatorFn:
    ESTIMATORS.add(name, Estimator(fn, group))
    return fn

  return wrap


@register("grpo", group=True)
def _grpo(x: Inputs, rl: Any) -> tuple[jax.Array, None]:
  adv = grpo(x.scores, rl.group_size, scale_by_std=rl.scale_by_std, valid=x.trains)
  return broadcast_to_tokens(adv, x.completion_mask), None


@register("dr_grpo", group=True)
def _dr_grpo(x: Inputs, rl: Any) -> tuple[jax.Array, None]:
  return broadcast_to_tokens(dr_grpo(x.scores, rl.group_size, valid=x.trains), x.completion_mask), None


@register("rloo", group=True)
def _rloo(x: Inputs, rl: Any) -> tuple[jax.Array, None]:
  return broadcast_to_tokens(rloo(x.scores, rl.group_size, valid=x.trains), x.completion_mask), None


@register("reinforce_pp", group=False)
def _reinforce_pp(x: Inputs, rl: Any) -> tuple[jax.Array, None]:
  return reinforce_pp(x.token_rewards, x.completion_mask & x.trains[:, None], gamma=rl.value.gamma), None


@register("ppo", group=False)
def _gae(x: Inputs, rl: Any) -> tuple[jax.Array, jax.Array]:
  adv, returns = gae(x.token_rewards, x.values, x.completion_mask, rl.value.gamma, rl.value.lam)
  if rl.value.whiten_advantages:  # over the rows that train only, after the returns are taken
    adv = whiten(adv, x.completion_mask & x.trains[:, None])
  return adv, returns
