"""Bradley-Terry, DPO, cDPO and IPO losses, sequence log-probs and RM calibration, against hand-computed numbers.

softplus(x) = log(1 + e^x), so -log sigmoid(x) = softplus(-x); sigmoid(x) = 1 / (1 + e^-x).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm.rl import preference as pref
from rl_lm.rl.losses import next_token_logprobs

T, F = True, False


def close(a, b, atol=1e-6):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float64), atol=atol, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Bradley-Terry


def test_bt_loss_and_metrics():
  rc, rr = jnp.array([1.0, 0.0]), jnp.array([0.0, 2.0])  # r_c - r_r = [1, -2]
  loss, met = pref.bradley_terry_loss(rc, rr)
  # log(1 + e^-1) = log 1.36787944 = 0.31326169; log(1 + e^2) = log 8.38905610 = 2.12692801
  # mean = (0.31326169 + 2.12692801) / 2 = 1.22009485
  close(loss, 1.22009485)
  close(met["rm/loss"], 1.22009485)
  close(met["rm/accuracy"], 0.5)  # pair 0 right, pair 1 wrong
  close(met["rm/margin_mean"], -0.5)  # (1 - 2) / 2
  close(met["rm/chosen_mean"], 0.5)
  close(met["rm/rejected_mean"], 1.0)


def test_bt_margin_is_subtracted_inside():
  rc, rr = jnp.array([1.0, 0.0]), jnp.array([0.0, 2.0])
  loss, met = pref.bradley_terry_loss(rc, rr, margin=jnp.array([0.5, 0.0]))
  # pair 0: -log sigmoid(1 - 0.5) = log(1 + e^-0.5) = log 1.60653066 = 0.47407698; pair 1 unchanged 2.12692801
  close(loss, (0.47407698 + 2.12692801) / 2)  # 1.30050250
  close(met["rm/accuracy"], 0.5)  # accuracy and margin_mean ignore the label margin
  close(met["rm/margin_mean"], -0.5)


def test_bt_ties_count_half():
  rc, rr = jnp.array([1.0, 1.0, 0.0]), jnp.array([1.0, 0.0, 3.0])  # differences [0, 1, -3]
  loss, met = pref.bradley_terry_loss(rc, rr)
  close(met["rm/accuracy"], 0.5)  # (1/2 + 1 + 0) / 3
  # (log 2 + log(1 + e^-1) + log(1 + e^3)) / 3 = (0.69314718 + 0.31326169 + 3.04858735) / 3
  close(loss, 1.35166541)


def test_bt_mask_excludes_a_garbage_pair():
  rc, rr = jnp.array([1.0, 0.0, jnp.nan]), jnp.array([0.0, 2.0, jnp.inf])
  m = jnp.array([T, T, F])
  loss, met = pref.bradley_terry_loss(rc, rr, mask=m, margin=jnp.array([0.0, 0.0, jnp.nan]))
  close(loss, 1.22009485)  # as the unmasked two-pair case
  close(met["rm/chosen_mean"], 0.5)
  g = jax.grad(lambda a, b: pref.bradley_terry_loss(a, b, mask=m)[0], argnums=(0, 1))(rc, rr)
  assert np.all(np.isfinite(np.asarray(g[0]))) and np.all(np.isfinite(np.asarray(g[1])))
  close(g[0][2], 0.0)
  close(g[1][2], 0.0)
  # a float 0/1 mask does the same
  close(pref.bradley_terry_loss(rc, rr, mask=jnp.array([1.0, 1.0, 0.0]))[0], 1.22009485)


def test_bt_gradient_matches_hand_formula():
  rc, rr = jnp.array([1.0, 0.0]), jnp.array([0.0, 2.0])
  g_c, g_r = jax.grad(lambda a, b: pref.bradley_terry_loss(a, b)[0], argnums=(0, 1))(rc, rr)
  # d/dr_c = -(1 - sigmoid(r_c - r_r)) / B: sigmoid(1) = 0.73105858, sigmoid(-2) = 0.11920292
  # -> [-0.26894142 / 2, -0.88079708 / 2] = [-0.13447071, -0.44039854]; d/dr_r is its negative
  d = np.array([1.0, -2.0])
  hand = -(1.0 - 1.0 / (1.0 + np.exp(-d))) / 2
  close(hand, [-0.13447071, -0.44039854])
  close(g_c, hand)
  close(g_r, -hand)


def test_bt_all_masked_is_zero():
  rc, rr = jnp.array([1.0, 0.0]), jnp.array([0.0, 2.0])
  m = jnp.array([F, F])
  loss, met = pref.bradley_terry_loss(rc, rr, mask=m)
  close(loss, 0.0)
  for v in met.values():
    close(v, 0.0)
  close(jax.grad(lambda a: pref.bradley_terry_loss(a, rr, mask=m)[0])(rc), [0.0, 0.0])


# ------------------------------------------------------------------------------------------------
# DPO, cDPO, IPO

# h = (pc - rc) - (pr - rr): pair 0: (-1 + 1.5) - (-2 + 1.5) = 0.5 + 0.5 = 1; pair 1: (-3 + 2) - (-1 + 2) = -1 - 1 = -2
PC, PR = jnp.array([-1.0, -3.0]), jnp.array([-2.0, -1.0])
RC, RR = jnp.array([-1.5, -2.0]), jnp.array([-1.5, -2.0])


def test_dpo_loss_and_metrics():
  loss, met = pref.dpo_loss(PC, PR, RC, RR, beta=0.1)
  # beta h = [0.1, -0.2]: log(1 + e^-0.1) = log 1.90483742 = 0.64439666; log(1 + e^0.2) = log 2.22140276 = 0.79813887
  # mean = 0.72126777
  close(loss, 0.72126777)
  close(met["dpo/loss"], 0.72126777)
  close(met["dpo/reward_chosen"], -0.025)  # 0.1 * mean(0.5, -1)
  close(met["dpo/reward_rejected"], 0.025)  # 0.1 * mean(-0.5, 1)
  close(met["dpo/reward_margin"], -0.05)  # 0.1 * mean(1, -2)
  close(met["dpo/accuracy"], 0.5)  # h > 0 for pair 0 only
  close(met["dpo/logp_chosen"], -2.0)  # mean(-1, -3)
  close(met["dpo/logp_rejected"], -1.5)  # mean(-2, -1)
  close(met["dpo/logratio_chosen"], -0.25)  # mean(0.5, -1)


def test_cdpo_label_smoothing():
  loss, _ = pref.dpo_loss(PC, PR, RC, RR, beta=0.1, label_smoothing=0.1)
  # -(1 - eps) log sigmoid(x) - eps log sigmoid(-x) = 0.9 softplus(-x) + 0.1 softplus(x), x = beta h
  # pair 0, x = 0.1: 0.9 * 0.64439666 + 0.1 * 0.74439666 = 0.65439666
  # pair 1, x = -0.2: 0.9 * 0.79813887 + 0.1 * 0.59813887 = 0.77813887
  close(loss, (0.65439666 + 0.77813887) / 2)  # 0.71626777
  # eps = 0.5 is symmetric: softplus(-x) / 2 + softplus(x) / 2 is the same for h and -h (chosen and rejected swapped)
  l_pos, _ = pref.dpo_loss(PC, PR, RC, RR, beta=0.1, label_smoothing=0.5)
  l_neg, _ = pref.dpo_loss(PR, PC, RR, RC, beta=0.1, label_smoothing=0.5)
  close(l_pos, l_neg)


def test_ipo_loss():
  # (h - 1 / (2 beta))^2, beta = tau of Azar et al.
  # beta = 0.1: target 5; ((1 - 5)^2 + (-2 - 5)^2) / 2 = (16 + 49) / 2 = 32.5
  loss, met = pref.dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="ipo")
  close(loss, 32.5, atol=1e-4)
  close(met["dpo/loss"], 32.5, atol=1e-4)
  close(met["dpo/reward_margin"], -0.05)  # implicit rewards are still beta (logp - ref)
  # beta = 0.5: target 1; (0^2 + (-3)^2) / 2 = 4.5
  close(pref.dpo_loss(PC, PR, RC, RR, beta=0.5, loss_type="ipo")[0], 4.5)


def test_ipo_minimum_at_half_inverse_beta():
  beta = 0.25  # target h* = 1 / (2 * 0.25) = 2
  zero = jnp.zeros((1,))

  def f(pc):
    return pref.dpo_loss(pc, zero, zero, zero, beta=beta, loss_type="ipo")[0]  # h = pc

  close(f(jnp.array([2.0])), 0.0)
  close(jax.grad(f)(jnp.array([2.0])), [0.0])
  # d/dh (h - 2)^2 = 2 (h - 2): -1 at h = 1.5, +1 at h = 2.5; loss 0.25 on both sides
  close(jax.grad(f)(jnp.array([1.5])), [-1.0])
  close(jax.grad(f)(jnp.array([2.5])), [1.0])
  close(f(jnp.array([1.5])), 0.25)
  close(f(jnp.array([2.5])), 0.25)


def test_dpo_gradient_sign_and_value():
  zero = jnp.zeros((2,))
  pc, pr = jnp.array([0.0, 1.0]), jnp.array([0.0, 0.0])  # h = [0, 1]

  def f(pc, pr, rc, rr):
    return pref.dpo_loss(pc, pr, rc, rr, beta=0.1)[0]

  g_pc, g_pr, g_rc, g_rr = jax.grad(f, argnums=(0, 1, 2, 3))(pc, pr, zero, zero)
  # d/dpc = -beta (1 - sigmoid(beta h)) / B: h = 0 -> -0.1 * 0.5 / 2 = -0.025;
  # h = 1 -> -0.1 * (1 - sigmoid(0.1)) / 2 = -0.1 * 0.47502081 / 2 = -0.02375104
  close(g_pc, [-0.025, -0.02375104])
  close(g_pr, [0.025, 0.02375104])
  assert np.all(np.asarray(g_pc) < 0) and np.all(np.asarray(g_pr) > 0)  # descent raises chosen, lowers rejected
  close(g_rc, [0.0, 0.0])  # the reference is a constant
  close(g_rr, [0.0, 0.0])


def test_dpo_mask_excludes_a_pair():
  pc, pr = jnp.append(PC, jnp.nan), jnp.append(PR, -jnp.inf)
  rc, rr = jnp.append(RC, 0.0), jnp.append(RR, jnp.inf)
  m = jnp.array([T, T, F])
  for loss_type, want in (("dpo", 0.72126777), ("ipo", 32.5)):
    loss, met = pref.dpo_loss(pc, pr, rc, rr, beta=0.1, loss_type=loss_type, mask=m)
    close(loss, want, atol=1e-4)
    close(met["dpo/accuracy"], 0.5)
    close(met["dpo/logratio_chosen"], -0.25)
    g = jax.grad(lambda a, lt=loss_type: pref.dpo_loss(a, pr, rc, rr, beta=0.1, loss_type=lt, mask=m)[0])(pc)
    assert np.all(np.isfinite(np.asarray(g)))
    close(g[2], 0.0)
  loss, met = pref.dpo_loss(pc, pr, rc, rr, beta=0.1, mask=jnp.array([F, F, F]))
  close(loss, 0.0)
  for v in met.values():
    close(v, 0.0)


@pytest.mark.parametrize("loss_type,eps", [("dpo", 0.0), ("dpo", 0.1), ("ipo", 0.0)])
@pytest.mark.parametrize("h", [1e4, -1e4])
def test_dpo_stable_at_huge_log_ratio(loss_type, eps, h):
  zero = jnp.zeros((1,))

  def f(pc):
    return pref.dpo_loss(pc, zero, zero, zero, beta=1.0, loss_type=loss_type, label_smoothing=eps)[0]

  x = jnp.array([h])
  loss, g = jax.value_and_grad(f)(x)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
  if loss_type == "dpo" and eps == 0.0:
    # softplus(-h): ~0 with gradient ~0 at h = 1e4; 1e4 with gradient -1 at h = -1e4
    close(loss, 0.0 if h > 0 else 1e4, atol=1e-3)
    close(g, [0.0 if h > 0 else -1.0])


def test_bt_stable_at_huge_gap():
  for d in (1e4, -1e4):
    loss, g = jax.value_and_grad(lambda a: pref.bradley_terry_loss(a, jnp.zeros((1,)))[0])(jnp.array([d]))
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
    close(loss, 0.0 if d > 0 else 1e4, atol=1e-3)


def test_dpo_is_bradley_terry_on_implicit_rewards():
  loss, met = pref.dpo_loss(PC, PR, RC, RR, beta=0.1)
  bt, _ = pref.bradley_terry_loss(0.1 * (PC - RC), 0.1 * (PR - RR))
  close(loss, bt)


def test_jit_and_validation():
  f = jax.jit(pref.dpo_loss, static_argnames=("loss_type",))
  close(f(PC, PR, RC, RR, jnp.float32(0.1))[0], 0.72126777)
  close(f(PC, PR, RC, RR, jnp.float32(0.1), loss_type="ipo")[0], 32.5, atol=1e-4)
  close(jax.jit(pref.bradley_terry_loss)(jnp.array([1.0, 0.0]), jnp.array([0.0, 2.0]))[0], 1.22009485)
  with pytest.raises(ValueError, match="sigmoid"):
    pref.dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="sigmoid")
  with pytest.raises(ValueError, match="beta"):
    pref.dpo_loss(PC, PR, RC, RR, beta=0.0)
  with pytest.raises(ValueError, match="label_smoothing"):
    pref.dpo_loss(PC, PR, RC, RR, beta=0.1, label_smoothing=0.7)
  with pytest.raises(ValueError, match="label_smoothing"):
    pref.dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="ipo", label_smoothing=0.1)


# ------------------------------------------------------------------------------------------------
# sequence log-probs


def test_sequence_logprobs_two_token_example():
  ln3 = math.log(3.0)
  # V = 2. logits[:, 0] = [0, 0] -> p = [1/2, 1/2]; logits[:, 1] = [ln 3, 0] -> p = [3/4, 1/4];
  # logits[:, 2] predicts nothing (garbage allowed)
  logits = jnp.array([[[0.0, 0.0], [ln3, 0.0], [1e9, jnp.nan]]] * 3)  # [3, 3, 2]
  tokens = jnp.array([[1, 0, 1]] * 3)  # [3, 3]: prompt token 1, completion 0, 1
  mask = jnp.array([[F, T, T], [F, F, T], [F, F, F]])
  lp = next_token_logprobs(logits, tokens)  # [3, 3]: the per-token log-probs every trainer scores with
  out = pref.sequence_logprobs(lp, mask)
  # row 0: log p(0 | logits 0) + log p(1 | logits 1) = log 1/2 + log 1/4 = log 1/8 = -2.07944154
  # row 1: log 1/4 = -1.38629436; row 2: no completion -> 0
  close(out, [-2.07944154, -1.38629436, 0.0])
  close(pref.sequence_logprobs(lp, mask, average=True), [-1.03972077, -1.38629436, 0.0])
  # mask[:, 0] is never read (token 0 has no prediction)
  close(pref.sequence_logprobs(lp, jnp.array([[T, T, T]] * 3))[0], -2.07944154)


def test_concat_and_split_pairs():
  ct, cm = jnp.array([[5, 6, 7]]), jnp.array([[F, T, T]])  # [1, 3]
  rt, rm = jnp.array([[5, 8]]), jnp.array([[F, T]])  # [1, 2]
  tokens, mask = pref.concat_pairs(ct, rt, cm, rm, pad_id=0)
  np.testing.assert_array_equal(tokens, [[5, 6, 7], [5, 8, 0]])
  np.testing.assert_array_equal(mask, [[F, T, T], [F, T, F]])
  c, r = pref.split_pairs(jnp.array([1.0, 2.0]))
  close(c, [1.0])
  close(r, [2.0])


# ------------------------------------------------------------------------------------------------
# calibration


def test_calibration_hand_example():
  ln3 = math.log(3.0)
  # p = sigmoid(d) = [3/4, 3/4, 1/4, 1/2]; labels held for pairs 0, 2, 3
  rc, rr = np.array([ln3, ln3, 0.0, 1.0]), np.array([0.0, 0.0, ln3, 1.0])
  agree = np.array([T, F, T, T])
  c = pref.calibration(rc, rr, agree, bins=2, symmetric=False)
  # bin [0, .5): p = 1/4, held -> conf 1/4, acc 1, n 1; bin [.5, 1]: p = 3/4, 3/4, 1/2 -> conf 2/3, acc 2/3, n 3
  close(c["rm/bin_confidence"], [0.25, 2 / 3])
  close(c["rm/bin_accuracy"], [1.0, 2 / 3])
  close(c["rm/bin_count"], [1, 3])
  close(c["rm/bin_edges"], [0.0, 0.5, 1.0])
  close(c["rm/ece"], 0.1875)  # 1/4 * |1 - 1/4| + 3/4 * 0
  # symmetric, first three pairs: (3/4, 1), (3/4, 0), (1/4, 1) plus mirrors (1/4, 0), (1/4, 1), (3/4, 0)
  # bin 0: p = 1/4 three times, 2 held -> |2/3 - 1/4| = 5/12; bin 1: p = 3/4, 1 held -> |1/3 - 3/4| = 5/12
  # ECE = 5/12. The same as the predicted winner's view: confidence 3/4, right once in three.
  c = pref.calibration(rc[:3], rr[:3], agree[:3], bins=2)
  close(c["rm/ece"], 5 / 12)
  close(c["rm/bin_accuracy"], [2 / 3, 1 / 3])
  # empty bins are NaN and do not count; default labels: every labelled preference holds
  c = pref.calibration(np.array([ln3]), np.array([0.0]), bins=10, symmetric=False)
  assert np.isnan(c["rm/bin_accuracy"][0]) and c["rm/bin_count"][7] == 1
  close(c["rm/ece"], 0.25)  # |1 - 3/4|


def test_calibration_synthetic_calibrated_vs_overconfident():
  rng = np.random.default_rng(0)
  n = 20000
  d = rng.normal(scale=2.0, size=n)  # [N] reward gaps r_c - r_r
  p = 1.0 / (1.0 + np.exp(-d))
  agree = rng.random(n) < p  # the labelled preference holds with exactly the predicted probability
  good = pref.calibration(d, np.zeros(n), agree)
  bad = pref.calibration(5.0 * d, np.zeros(n), agree)  # rewards x5: overconfident
  assert good["rm/ece"] < 0.02, good["rm/ece"]
  assert bad["rm/ece"] > good["rm/ece"] + 0.1, (bad["rm/ece"], good["rm/ece"])
  assert pref.calibration(d, np.zeros(n), agree, symmetric=False)["rm/ece"] < 0.02
