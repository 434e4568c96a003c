"""GSPO, CISPO, GMPO, Clip-Cov, KL-Cov and the rollout corrections, against values computed by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm.rl import correction, policy_losses

# Two rows of three slots: row 0 has two valid tokens with log-ratios 0.2 and -0.1, row 1 three with ratio exactly 1.
LOGP = jnp.asarray([[-1.0, -2.0, 0.0], [-0.5, -1.5, -2.5]])
OLD = jnp.asarray([[-1.2, -1.9, 0.0], [-0.5, -1.5, -2.5]])
MASK = jnp.asarray([[True, True, False], [True, True, True]])


def _grad(fn, logp=LOGP):
  return np.asarray(jax.grad(lambda lp: fn(lp)[0])(logp))


def test_gspo_clips_whole_sequences_by_their_length_normalised_ratio():
  adv = jnp.asarray([1.0, -0.5])
  fn = lambda lp: policy_losses.gspo_loss(lp, OLD, adv, MASK, 0.04, 0.04)
  loss, metrics = fn(LOGP)
  # Row 0: s = exp((0.2 - 0.1) / 2) = 1.0513 > 1.04 with A > 0: clipped, each token -1.04, no gradient.
  # Row 1: s = 1, each token -A * 1 = 0.5. seq-mean-token-mean: (-1.04 + 0.5) / 2.
  np.testing.assert_allclose(float(loss), (-1.04 + 0.5) / 2, rtol=1e-6)
  g = _grad(fn)
  np.testing.assert_allclose(g[0], 0.0, atol=1e-7)
  # Row 1, token t: d/dlogp_t of (1/2) * (1/3) * sum_t (-A s_t), ds_t/dlogp_t = s = 1.
  np.testing.assert_allclose(g[1], [0.5 / 6] * 3, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["policy/clip_frac"]), 2 / 5, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["policy/ratio_max"]), math.exp(0.05), rtol=1e-6)


def test_cispo_keeps_every_tokens_gradient_under_a_clipped_constant_weight():
  adv = jnp.asarray([1.0, 0.0])
  fn = lambda lp: policy_losses.cispo_loss(lp, OLD, adv, MASK, 10.0, 0.2)  # clip above only, as the paper
  loss, metrics = fn(LOGP)
  w = [1.2, math.exp(-0.1)]  # min(e^0.2 = 1.2214, 1.2), e^-0.1 untouched
  # token-mean over 5 valid tokens; row 1 has A = 0.
  np.testing.assert_allclose(float(loss), (-w[0] * -1.0 - w[1] * -2.0) / 5, rtol=1e-6)
  g = _grad(fn)
  np.testing.assert_allclose(g[0, :2], [-w[0] / 5, -w[1] / 5], rtol=1e-6)  # the clipped token keeps its gradient
  np.testing.assert_allclose(g[:, 2:], 0.0)
  np.testing.assert_allclose(float(metrics["policy/clip_frac_high"]), 1 / 5, rtol=1e-6)


def test_gmpo_takes_the_pessimistic_clipped_log_ratio_by_the_sign_of_the_advantage():
  mask = jnp.asarray([[True, True, False]])
  for a, expected_mean, expected_grad in [
    # min(d, clip(d)) = [0.15, -0.1]: r = e^0.025, L = -r; token 0 clipped (no gradient)
    (1.0, 0.025, [0.0, -0.5 * math.exp(0.025)]),
    (-1.0, 0.05, [0.5 * math.exp(0.05), 0.5 * math.exp(0.05)]),  # max(d, clip(d)) = [0.2, -0.1]: L = e^0.05
  ]:
    fn = lambda lp, a=a: policy_losses.gmpo_loss(lp, OLD[:1], jnp.asarray([a]), mask, 0.15, 0.15)
    loss, _ = fn(LOGP[:1])
    np.testing.assert_allclose(float(loss), -a * math.exp(expected_mean), rtol=1e-6)
    np.testing.assert_allclose(_grad(fn, LOGP[:1])[0, :2], expected_grad, rtol=1e-5, atol=1e-7)


def _cov_case():
  # A = +2 on row 0, -2 on row 1 (mean 0); logp centred at -1.775: cov = 2.55, -2.45, 2.65, -2.55.
  logp = jnp.asarray([[-0.5, -3.0], [-3.1, -0.5]])
  adv = jnp.asarray([2.0, -2.0])
  mask = jnp.ones((2, 2), bool)
  return logp, adv, mask


def test_clip_cov_cuts_the_gradient_of_the_highest_covariance_token_in_the_band():
  logp, adv, mask = _cov_case()
  old = logp - jnp.asarray([[0.0, 0.0], [0.3, 0.0]])  # only token (1, 0) moved
  fn = lambda lp: policy_losses.clip_cov_loss(lp, old, adv, mask, 0.2, 0.2)
  loss, metrics = fn(logp)
  g = _grad(fn, logp)
  assert g[1, 0] == 0.0 and np.all(g.reshape(-1)[[0, 1, 3]] != 0.0)
  np.testing.assert_allclose(float(metrics["policy/cov_clip_frac"]), 0.25)
  # The other three tokens keep PPO's loss with ratio 1: -A each; token-mean over 4 tokens.
  np.testing.assert_allclose(float(loss), (-2.0 - 2.0 + 2.0) / 4, rtol=1e-6)


def test_kl_cov_penalises_the_highest_covariance_token_by_its_absolute_log_ratio():
  logp, adv, mask = _cov_case()
  old = logp - jnp.asarray([[0.0, 0.0], [0.3, 0.0]])
  loss, metrics = policy_losses.kl_cov_loss(logp, old, adv, mask, 0.2, 0.2, kl_coef=0.1)
  surrogate = -2.0 - 2.0 + 2.0 * math.exp(0.3) + 2.0  # -A * ratio; token (1, 0) has ratio e^0.3
  np.testing.assert_allclose(float(loss), (surrogate + 0.1 * 0.3) / 4, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["policy/kl_cov_frac"]), 0.25)


@pytest.mark.parametrize("name", policy_losses.LOSSES)
def test_every_loss_is_finite_on_extreme_ratios_and_ignores_empty_rows(name):
  logp = jnp.asarray([[0.0, -60.0, -1.0], [-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
  old = jnp.asarray([[-60.0, 0.0, -1.0], [-1.0, -1.0, -1.0], [5.0, 5.0, 5.0]])  # log-ratios +-60, 0; row 2 junk
  mask = jnp.asarray([[True, True, True], [True, True, False], [False, False, False]])  # row 2 empty
  adv = jnp.asarray([1.0, -1.0, 123.0])
  mode = "seq-mean-token-mean"
  fn = lambda lp: policy_losses.compute(name, lp, old, adv, mask, 0.2, 0.2, mode=mode)
  loss, metrics = fn(logp)
  g = _grad(fn, logp)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(g)) and np.all(g[2] == 0.0)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  # Without the empty row the loss is the same (it is left out of the mean).
  np.testing.assert_allclose(float(loss), float(policy_losses.compute(
    name, logp[:2], old[:2], adv[:2], mask[:2], 0.2, 0.2, mode=mode)[0]), rtol=1e-6)
  # An all-masked batch gives 0 and no gradient.
  zero = policy_losses.compute(name, logp, old, adv, jnp.zeros_like(mask), 0.2, 0.2, mode=mode)[0]
  assert float(zero) == 0.0


@pytest.mark.parametrize("name", policy_losses.LOSSES)
def test_every_loss_at_ratio_one_is_the_policy_gradient(name):
  # At logp == old every loss has the gradient of -mean(A * logp) (KL-Cov's penalty |0| has none; GMPO's and
  # GSPO's sequence means give the same token weights here, rows of equal length).
  logp = jnp.asarray([[-1.0, -2.0], [-0.5, -0.7]])
  adv = jnp.asarray([1.5, -0.5])
  mask = jnp.ones((2, 2), bool)
  g = _grad(lambda lp: policy_losses.compute(name, lp, logp, adv, mask, 0.2, 0.2, mode="seq-mean-token-mean"), logp)
  np.testing.assert_allclose(g, [[-1.5 / 4] * 2, [0.5 / 4] * 2], rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Rollout correction

SAMPLER = jnp.asarray([[-1.5, -1.5, -4.0, 0.0], [-1.0, -1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
TRAINER = jnp.asarray([[-1.0, -2.0, -1.0, 0.0], [-1.0, -1.0, -1.0, -1.0], [99.0, 99.0, 99.0, 99.0]])
CMASK = jnp.asarray([[True, True, True, False], [True, True, True, True], [False] * 4])  # row 2 empty
# Row 0 log-ratios (old - sampler): 0.5, -0.5, 3.0; row 1: exactly 0.


def test_token_truncated_and_two_sided_weights():
  w, m = correction.importance_weights(TRAINER, SAMPLER, CMASK, "token", cap=2.0)
  np.testing.assert_allclose(np.asarray(w[0, :3]), [math.exp(0.5), math.exp(-0.5), 2.0], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(w[1]), 1.0)
  assert np.all(np.asarray(w[0, 3:]) == 0) and np.all(np.asarray(w[2]) == 0)
  np.testing.assert_allclose(float(m["offpolicy/is_truncated_frac"]), 1 / 7, rtol=1e-6)
  ice, m = correction.importance_weights(TRAINER, SAMPLER, CMASK, "token", cap=2.0, lower=0.7)
  np.testing.assert_allclose(np.asarray(ice[0, :3]), [math.exp(0.5), 0.0, 0.0], rtol=1e-6)  # 0.61 < 0.7, 20 > 2
  np.testing.assert_allclose(float(m["offpolicy/is_masked_frac"]), 2 / 7, rtol=1e-6)
  ws = np.asarray([math.exp(0.5), 0, 0, 1, 1, 1, 1])
  np.testing.assert_allclose(float(m["offpolicy/is_ess"]), ws.sum() ** 2 / (7 * (ws**2).sum()), rtol=1e-5)


def test_sequence_and_geometric_weights():
  w, _ = correction.importance_weights(TRAINER, SAMPLER, CMASK, "sequence", cap=30.0)
  np.testing.assert_allclose(np.asarray(w[0, :3]), math.exp(3.0), rtol=1e-6)  # product: e^(0.5 - 0.5 + 3)
  w, _ = correction.importance_weights(TRAINER, SAMPLER, CMASK, "geometric", cap=30.0)
  np.testing.assert_allclose(np.asarray(w[0, :3]), math.exp(1.0), rtol=1e-6)  # e^(3 / 3)
  np.testing.assert_allclose(np.asarray(w[1]), 1.0)
  far = correction.importance_weights(TRAINER + 100.0 * CMASK, SAMPLER, CMASK, "sequence", cap=1e30)[0]
  np.testing.assert_allclose(np.asarray(far[0, :3]), math.exp(20.0), rtol=1e-6)  # clamped at e^20


def test_rejection_drops_tokens_or_whole_rows_outside_the_band():
  keep, m = correction.rejection_mask(TRAINER, SAMPLER, CMASK, "token", 0.5, 2.0)
  assert np.asarray(keep).tolist() == [[True, True, False, False], [True] * 4, [False] * 4]
  np.testing.assert_allclose(float(m["offpolicy/rejected_frac"]), 1 / 7, rtol=1e-6)
  keep, m = correction.rejection_mask(TRAINER, SAMPLER, CMASK, "geometric", 0.5, 2.0)  # e^1 > 2: row 0 goes
  assert np.asarray(keep).tolist() == [[False] * 4, [True] * 4, [False] * 4]
  np.testing.assert_allclose(float(m["offpolicy/rejected_rows_frac"]), 0.5)
  # A rejected token gets no gradient in the loss built on the new mask.
  g = jax.grad(lambda lp: policy_losses.compute("ppo", lp, SAMPLER, jnp.ones(3), keep, 0.2, 0.2)[0])(TRAINER)
  assert np.all(np.asarray(g)[0] == 0) and np.all(np.asarray(g)[1] != 0)
