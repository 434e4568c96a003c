"""Advantage estimators and masked helpers against hand-computed numbers, edge cases and jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm.rl import advantages, masked

T, F = True, False


def close(a, b, atol=1e-5):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float64), atol=atol, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# masked helpers


def test_masked_reductions_by_hand():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  m = jnp.array([[T, T, F], [F, T, F]])  # valid: 1, 2, 5
  close(masked.masked_sum(x, m), 8.0)
  close(masked.masked_mean(x, m), 8.0 / 3)
  close(masked.masked_mean(x, m, axis=1), [1.5, 5.0])
  close(masked.masked_sum(x, m, axis=0), [1.0, 7.0, 0.0])
  close(masked.masked_mean(x, m, axis=0), [1.0, 3.5, 0.0])  # empty column: 0
  close(masked.masked_var(x, m), 26.0 / 9)  # deviations -5/3, -2/3, 7/3
  close(masked.masked_var(x, m, unbiased=True), 13.0 / 3)
  close(masked.masked_max(x, m), 5.0)
  close(masked.masked_mean(x, m.astype(jnp.float32)), 8.0 / 3)  # 0/1 float masks work too
  w = masked.whiten(x, m)
  close(w, np.array([[-5 / 3, -2 / 3, 0], [0, 7 / 3, 0]]) / np.sqrt(13 / 3))
  w_scale = masked.whiten(x, m, shift_mean=False)
  close(w_scale, np.array([[-5 / 3, -2 / 3, 0], [0, 7 / 3, 0]]) / np.sqrt(13 / 3) + np.array([[8 / 3, 8 / 3, 0],
                                                                                              [0, 8 / 3, 0]]))


def test_masked_helpers_empty_and_garbage():
  x = jnp.array([[jnp.inf, jnp.nan, 3.0]])
  empty = jnp.zeros((1, 3), bool)
  for f in (masked.masked_sum, masked.masked_mean, masked.masked_var, masked.masked_max, masked.whiten):
    out = np.asarray(f(x, empty))
    assert np.all(out == 0), f.__name__
  one = jnp.array([[F, F, T]])  # inf / nan in masked slots never leak
  close(masked.masked_mean(x, one), 3.0)
  close(masked.masked_var(x, one, unbiased=True), 0.0)
  close(masked.whiten(x, one), [[0.0, 0.0, 0.0]])


# ------------------------------------------------------------------------------------------------
# group estimators


def test_grpo_dr_grpo_rloo_by_hand():
  s = jnp.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
  # group 0: mean 0.5, unbiased std sqrt(1/3) = 0.577350; group 1 all equal -> 0
  close(advantages.grpo(s, 4), [0.866024, -0.866024, -0.866024, 0.866024, 0, 0, 0, 0])
  close(advantages.grpo(s, 4, eps=0.1), np.array([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / (0.577350 + 0.1))
  close(advantages.grpo(s, 4, scale_by_std=False), [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
  close(advantages.dr_grpo(s, 4), [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
  # leave-one-out: 1 - (0 + 0 + 1) / 3 = 2/3
  close(advantages.rloo(s, 4), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0])


def test_equal_rewards_give_exactly_zero():
  s = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7])  # 3 * 0.1 / 3 != 0.1 in floating point
  for f in (advantages.grpo, advantages.dr_grpo, advantages.rloo):
    out = np.asarray(f(s, 3))
    assert np.array_equal(out, np.zeros(6)), f.__name__
  assert np.asarray(advantages.group_zero_variance(s, 3)).tolist() == [True, True]
  zv = advantages.group_zero_variance(jnp.array([1.0, 0.0, 3.0, 3.0]), 2)
  assert np.asarray(zv).tolist() == [False, True]


def test_group_size_one():
  s = jnp.array([1.0, 2.0, 3.0])
  for f in (advantages.grpo, advantages.dr_grpo, advantages.rloo):
    out = np.asarray(f(s, 1))
    assert np.array_equal(out, np.zeros(3)), f.__name__
  assert np.all(np.asarray(advantages.group_zero_variance(s, 1)))


def test_invalid_episodes_excluded_from_group_stats():
  s = jnp.array([1.0, 0.0, 5.0, 0.0, 3.0, 1.0, 7.0, 7.0])
  valid = jnp.array([T, T, F, T, T, F, F, F])
  # group 0 over {1, 0, 0}: mean 1/3, unbiased var (4/9 + 1/9 + 1/9) / 2 = 1/3; row 2 excluded
  sd = np.sqrt(1 / 3) + 1e-6
  close(advantages.grpo(s, 4, valid=valid), [(2 / 3) / sd, (-1 / 3) / sd, 0, (-1 / 3) / sd, 0, 0, 0, 0])
  close(advantages.dr_grpo(s, 4, valid=valid), [2 / 3, -1 / 3, 0, -1 / 3, 0, 0, 0, 0])
  # leave-one-out over valid members: 1 - (0 + 0) / 2 = 1; 0 - (1 + 0) / 2 = -0.5
  close(advantages.rloo(s, 4, valid=valid), [1, -0.5, 0, -0.5, 0, 0, 0, 0])
  # group 1 has one valid member: no signal
  assert np.asarray(advantages.group_zero_variance(s, 4, valid)).tolist() == [False, True]
  # an invalid outlier does not break an otherwise all-equal group
  s2, v2 = jnp.array([2.0, 2.0, 9.0]), jnp.array([T, T, F])
  assert np.array_equal(np.asarray(advantages.grpo(s2, 3, valid=v2)), np.zeros(3))
  assert np.asarray(advantages.group_zero_variance(s2, 3, v2)).tolist() == [True]
  # The host's numpy twin (the trainer's statistics between steps) agrees, here and on random groups.
  assert advantages.group_zero_variance_host(np.asarray(s), 4, np.asarray(valid)).tolist() == [False, True]
  assert advantages.group_zero_variance_host(np.asarray(s2), 3, np.asarray(v2)).tolist() == [True]
  rng = np.random.default_rng(0)
  r, m = rng.integers(0, 2, 600).astype(np.float32), rng.random(600) < 0.7
  assert np.array_equal(advantages.group_zero_variance_host(r, 4, m),
                        np.asarray(advantages.group_zero_variance(jnp.asarray(r), 4, jnp.asarray(m))))


def test_group_size_must_divide_batch():
  with pytest.raises(ValueError, match="group_size"):
    advantages.grpo(jnp.zeros(6), 4)


def test_broadcast_to_tokens():
  adv = jnp.array([1.5, -2.0])
  m = jnp.array([[F, T, T], [T, F, F]])
  close(advantages.broadcast_to_tokens(adv, m), [[0, 1.5, 1.5], [-2, 0, 0]])
  close(advantages.broadcast_to_tokens(adv, m, valid=jnp.array([T, F])), [[0, 1.5, 1.5], [0, 0, 0]])


# ------------------------------------------------------------------------------------------------
# GAE


def test_gae_hand_unrolled_with_padding_and_bootstrap():
  # Row 0: left-padded (2 prompt slots), terminal. Row 1: right-padded, truncated with bootstrap 2.
  # Row 2: fully masked. Garbage sits in every masked slot.
  g = 1e3
  rewards = jnp.array([[g, g, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, g, g], [g, g, g, g, g]])
  values = jnp.array([[-g, -g, 0.5, 0.6, 0.7], [0.5, 0.6, 0.7, -g, -g], [g, g, g, g, g]])
  mask = jnp.array([[F, F, T, T, T], [T, T, T, F, F], [F, F, F, F, F]])
  gamma, lam = 0.9, 0.8
  # terminal: delta2 = 1 - 0.7 = 0.3; delta1 = 0.9*0.7 - 0.6 = 0.03; delta0 = 0.9*0.6 - 0.5 = 0.04
  #   A2 = 0.3; A1 = 0.03 + 0.72*0.3 = 0.246; A0 = 0.04 + 0.72*0.246 = 0.21712
  # bootstrap 2: delta2 = 1 + 0.9*2 - 0.7 = 2.1; A1 = 0.03 + 0.72*2.1 = 1.542; A0 = 0.04 + 0.72*1.542 = 1.15024
  adv, ret = advantages.gae(rewards, values, mask, gamma, lam, bootstrap=jnp.array([0.0, 2.0, 5.0]))
  close(adv, [[0, 0, 0.21712, 0.246, 0.3], [1.15024, 1.542, 2.1, 0, 0], [0, 0, 0, 0, 0]])
  close(ret, [[0, 0, 0.71712, 0.846, 1.0], [1.65024, 2.142, 2.8, 0, 0], [0, 0, 0, 0, 0]])
  # default bootstrap is terminal (0)
  adv0, _ = advantages.gae(rewards[1:2], values[1:2], mask[1:2], gamma, lam)
  close(adv0, [[0.21712, 0.246, 0.3, 0, 0]])


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
  rng = np.random.default_rng(0)
  r = rng.normal(size=(3, 6)).astype(np.float32)
  v = rng.normal(size=(3, 6)).astype(np.float32)
  m = np.array([[F, F, T, T, T, T], [T, T, T, T, F, F], [F, T, T, T, T, T]])
  adv, ret = advantages.gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), 1.0, 1.0)
  rtg = np.where(m, np.cumsum(np.where(m, r, 0)[:, ::-1], axis=1)[:, ::-1], 0)
  close(adv, np.where(m, rtg - v, 0))
  close(ret, rtg)


def test_gae_whiten_and_valid():
  rng = np.random.default_rng(1)
  r = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  m = jnp.array([[F, T, T, T, T], [T, T, T, F, F], [T, T, T, T, T]])
  valid = jnp.array([T, T, F])
  adv_raw, ret_raw = advantages.gae(r, v, m, 0.99, 0.95)
  adv, ret = advantages.gae(r, v, m, 0.99, 0.95, whiten_advantages=True, valid=valid)
  keep = np.asarray(m & valid[:, None])
  a = np.asarray(adv)
  assert np.all(a[~keep] == 0) and np.all(np.asarray(ret)[~keep] == 0)
  close(a[keep].mean(), 0.0)
  close(a[keep].std(ddof=1), 1.0, atol=1e-4)
  close(np.asarray(ret)[keep], np.asarray(ret_raw)[keep])  # returns come from the raw advantages
  raw = np.asarray(adv_raw)[keep]
  close(a[keep], (raw - raw.mean()) / raw.std(ddof=1), atol=1e-4)


# ------------------------------------------------------------------------------------------------
# REINFORCE++


def test_reinforce_pp_by_hand():
  rewards = jnp.array([[0.0, 0.0, 1.0], [9.0, 0.0, 2.0]])
  mask = jnp.array([[T, T, T], [F, T, T]])
  # gamma 0.5: returns-to-go row 0 = [0.25, 0.5, 1], row 1 = [-, 1, 2]; mean 0.95, unbiased std sqrt(0.45)
  out = advantages.reinforce_pp(rewards, mask, gamma=0.5)
  close(out, [[-1.0434984, -0.6708204, 0.0745356], [0, 0.0745356, 1.5652476]])
  # an invalid row is excluded from the whitening statistics: row 0 alone is [0.25, 0.5, 1]
  out = advantages.reinforce_pp(rewards, mask, gamma=0.5, valid=jnp.array([T, F]))
  g = np.array([0.25, 0.5, 1.0])
  close(out, [(g - g.mean()) / g.std(ddof=1), [0, 0, 0]], atol=1e-4)


# ------------------------------------------------------------------------------------------------
# jit and the all-masked batch


def test_jittable_and_nan_free_when_all_masked():
  B, Tn, G = 4, 5, 2
  r = jnp.ones((B, Tn))
  v = jnp.full((B, Tn), 0.5)
  m = jnp.zeros((B, Tn), bool)
  s = jnp.arange(B, dtype=jnp.float32)
  none_valid = jnp.zeros((B,), bool)
  outs = [
    jax.jit(advantages.gae, static_argnames="whiten_advantages")(r, v, m, 0.99, 0.95, whiten_advantages=True),
    jax.jit(advantages.reinforce_pp)(r, m, 0.9),
    jax.jit(advantages.grpo, static_argnums=(1, 2))(s, G, True, 1e-6, none_valid),
    jax.jit(advantages.rloo, static_argnums=1)(s, G, none_valid),
    jax.jit(advantages.dr_grpo, static_argnums=1)(s, G, none_valid),
    jax.jit(advantages.group_zero_variance, static_argnums=1)(s, G, none_valid),
    jax.jit(advantages.broadcast_to_tokens)(s, m),
  ]
  for leaf in jax.tree.leaves(outs):
    a = np.asarray(leaf)
    assert not np.any(np.isnan(a))
    if a.dtype != bool:
      assert np.all(a == 0)
  # and a normal batch under jit matches eager
  close(jax.jit(advantages.grpo, static_argnums=1)(s, G), advantages.grpo(s, G))
