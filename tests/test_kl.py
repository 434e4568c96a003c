"""KL estimators, KL-in-reward and the KL controllers against hand-computed numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm.rl import kl

T, F = True, False


def close(a, b, atol=1e-6):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float64), atol=atol, rtol=1e-5)


def test_estimators_on_concrete_numbers():
  logp = jnp.array([[-1.0, -2.0, -0.5]])
  ref = jnp.array([[-1.5, -1.0, -0.5]])  # log r = ref - logp = [-0.5, 1, 0]
  close(kl.estimate(logp, ref, "k1"), [[0.5, -1.0, 0.0]])
  close(kl.estimate(logp, ref, "k2"), [[0.125, 0.5, 0.0]])
  # exp(-0.5) - 1 + 0.5 = 0.10653066; e - 1 - 1 = 0.71828183
  close(kl.estimate(logp, ref, "k3"), [[0.10653066, 0.71828183, 0.0]])
  # masked positions are 0 even when their log-probs are garbage
  bad = jnp.array([[-1.0, 1e4, -0.5]])
  out = kl.estimate(bad, ref, "k3", mask=jnp.array([[T, F, T]]))
  close(out, [[0.10653066, 0.0, 0.0]])


def test_unknown_kind_is_named():
  with pytest.raises(ValueError, match="k4"):
    kl.estimate(jnp.zeros((1, 1)), jnp.zeros((1, 1)), "k4")


def test_k3_nonnegative():
  rng = np.random.default_rng(0)
  logp = jnp.asarray(rng.normal(scale=3.0, size=(64, 64)), jnp.float32)
  ref = jnp.asarray(rng.normal(scale=3.0, size=(64, 64)), jnp.float32)
  assert np.all(np.asarray(kl.estimate(logp, ref, "k3")) >= 0)
  assert np.all(np.asarray(kl.estimate(logp, ref, "k2")) >= 0)


def test_k1_k3_unbiased_by_monte_carlo():
  p = np.array([0.5, 0.3, 0.2])
  q = np.array([0.2, 0.3, 0.5])
  true_kl = 0.3 * np.log(2.5)  # 0.5 ln 2.5 + 0.3 ln 1 + 0.2 ln 0.4 = 0.27488721
  close(true_kl, 0.27488721)
  x = jax.random.categorical(jax.random.key(0), jnp.log(jnp.asarray(p)), shape=(200_000,))
  logp = jnp.log(jnp.asarray(p, jnp.float32))[x][None]  # [1, N], samples from the policy p
  logq = jnp.log(jnp.asarray(q, jnp.float32))[x][None]
  for kind in ("k1", "k3"):
    est = float(jnp.mean(kl.estimate(logp, logq, kind)))
    assert abs(est - true_kl) < 0.02 * true_kl, (kind, est)
  # k2 is biased here: E[k2] = 0.5 * 0.7 * ln(2.5)^2 = 0.29386
  est = float(jnp.mean(kl.estimate(logp, logq, "k2")))
  assert abs(est - 0.29386) < 0.02 * 0.29386 and abs(est - true_kl) > 0.05 * true_kl


def test_penalised_rewards():
  scores = jnp.array([1.0, 2.0, 3.0])
  kls = jnp.array([[0.1, 0.2, 0.3, 0.4], [0.2, 0.0, -0.2, 0.4], [9.0, 9.0, 9.0, 9.0]])
  mask = jnp.array([[F, T, T, F], [T, T, T, T], [F, F, F, F]])
  out = kl.penalised_rewards(scores, kls, mask, 0.5)
  close(out, [[0, -0.1, -0.15 + 1.0, 0], [-0.1, 0, 0.1, -0.2 + 2.0], [0, 0, 0, 0]])


def test_adaptive_controller_multiplier_and_clipping():
  s = kl.init_kl_state(0.1)
  assert s.coef.dtype == jnp.float32
  # error 0.22/0.2 - 1 = 0.1: mult 1 + 0.1 * 64 / 1e4 = 1.00064
  close(kl.adaptive_update(s, 0.22, 64, 0.2, 1e4).coef, 0.1 * 1.00064)
  # error 0.19/0.2 - 1 = -0.05: mult 0.99968
  close(kl.adaptive_update(s, 0.19, 64, 0.2, 1e4).coef, 0.1 * 0.99968)
  # n_steps == horizon makes the multiplier 1 + error: clipped to 1.2 and 0.8
  close(kl.adaptive_update(s, 1.0, 1000, 0.2, 1000).coef, 0.12)  # error 4 -> 0.2
  close(kl.adaptive_update(s, 0.0, 1000, 0.2, 1000).coef, 0.08)  # error -1 -> -0.2
  close(kl.adaptive_update(s, 0.24, 1000, 0.2, 1000).coef, 0.12)  # error exactly 0.2
  close(kl.adaptive_update(s, 0.21, 1000, 0.2, 1000).coef, 0.105)  # inside the clip


def test_update_kl_state_fixed_adaptive_and_jit():
  s = kl.fixed_controller(0.05)
  same = kl.update_kl_state(s, 10.0, 64, adaptive=False)
  assert float(same.coef) == pytest.approx(0.05)
  step = jax.jit(lambda st, cur: kl.update_kl_state(st, cur, 1000, adaptive=True, target=0.2, horizon=1000))
  s2 = step(kl.init_kl_state(0.1), jnp.float32(1.0))
  assert isinstance(s2, kl.KLState)
  close(s2.coef, 0.12)
  with pytest.raises(ValueError, match="target"):
    kl.update_kl_state(s, 0.1, 64, adaptive=True)
  with pytest.raises(ValueError, match="target"):
    kl.adaptive_update(s, 0.1, 64, 0.0, 1000)


def test_jittable_and_nan_free_when_all_masked():
  logp = jnp.full((2, 3), -1e4)
  ref = jnp.zeros((2, 3))
  m = jnp.zeros((2, 3), bool)
  for kind in kl.KINDS:
    out = jax.jit(kl.estimate, static_argnums=2)(logp, ref, kind, m)
    assert np.all(np.asarray(out) == 0)
  out = jax.jit(kl.penalised_rewards)(jnp.ones(2), jnp.ones((2, 3)), m, 0.1)
  assert np.all(np.asarray(out) == 0)
