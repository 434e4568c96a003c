"""Loss aggregation, clipped policy and value losses, entropy, truncated IS and SFT, against hand-computed numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm.rl import correction, losses

T, F = True, False


def close(a, b, atol=1e-5):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b, np.float64), atol=atol, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# aggregation


def test_aggregate_2x3_with_empty_row():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  m = jnp.array([[T, T, F], [F, F, F]])
  close(losses.aggregate(x, m, "token-mean"), 1.5)  # (1 + 2) / 2
  close(losses.aggregate(x, m, "seq-mean-token-mean"), 1.5)  # only row 0 counts
  close(losses.aggregate(x, m, "seq-mean-token-sum"), 3.0)
  close(losses.aggregate(x, m, "seq-mean-token-sum-norm"), 0.5)  # 3 / (T=3) / (B=2)
  close(losses.aggregate(x, m, "seq-mean-token-sum-norm", norm_constant=4), 0.375)  # 3 / 4 / 2


def test_aggregate_modes_differ_on_ragged_rows():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
  m = jnp.array([[T, T, F], [F, F, F], [T, T, T]])
  close(losses.aggregate(x, m, "token-mean"), 27 / 5)
  close(losses.aggregate(x, m, "seq-mean-token-mean"), (1.5 + 8) / 2)
  close(losses.aggregate(x, m, "seq-mean-token-sum"), (3 + 24) / 2)
  close(losses.aggregate(x, m, "seq-mean-token-sum-norm"), 27 / 3 / 3)
  close(losses.aggregate(x, m, "seq-mean-token-sum-norm", norm_constant=10), 27 / 10 / 3)


def test_aggregate_all_masked_and_unknown_mode():
  x = jnp.array([[1.0, jnp.inf, 3.0], [4.0, 5.0, jnp.nan]])
  m = jnp.zeros((2, 3), bool)
  for mode in losses.MODES:
    assert float(losses.aggregate(x, m, mode)) == 0.0, mode
    g = jax.grad(lambda v, mode=mode: losses.aggregate(v, m, mode))(jnp.ones((2, 3)))
    assert np.all(np.asarray(g) == 0), mode
  with pytest.raises(ValueError, match="token-avg"):
    losses.aggregate(x, m, "token-avg")


# ------------------------------------------------------------------------------------------------
# policy loss

# Six valid tokens and two masked ones (garbage log-prob). ratio, advantage, expected per-token loss:
#   t0  1.50  +1  clipped high (> 1.28): -1.28, zero gradient
#   t1  1.25  +1  inside clip-higher (would be clipped at a symmetric 0.2): -1.25
#   t2  0.70  -1  clipped low (< 0.8): 0.8, zero gradient
#   t3  1.50  -1  unclipped side for A < 0: 1.5
#   t4  0.50  +2  unclipped side for A > 0: -1.0
#   t5  1.10  -2  inside: 2.2
_RATIO = np.array([[1.5, 1.25, 0.7, 1.5], [0.5, 1.1, 1.0, 1.0]])
_ADV = np.array([[1.0, 1.0, -1.0, -1.0], [2.0, -2.0, 5.0, 5.0]])
_MASK = jnp.array([[T, T, T, T], [T, T, F, F]])
_OLD = jnp.full((2, 4), -1.0)


def _logp(ratio=_RATIO):
  lp = np.log(ratio) - 1.0
  lp[1, 2:] = 1e4  # garbage at masked positions
  return jnp.asarray(lp, jnp.float32)


def test_policy_loss_clip_higher_values_metrics_and_zero_gradients():
  adv = jnp.asarray(_ADV, jnp.float32)

  def f(lp):
    return losses.policy_loss(lp, _OLD, adv, _MASK, clip_low=0.2, clip_high=0.28)

  loss, met = f(_logp())
  close(loss, (-1.28 - 1.25 + 0.8 + 1.5 - 1.0 + 2.2) / 6)
  close(met["policy/clip_frac_low"], 1 / 6)
  close(met["policy/clip_frac_high"], 1 / 6)
  close(met["policy/clip_frac"], 2 / 6)
  close(met["policy/dual_clip_frac"], 0.0)
  close(met["policy/ratio_mean"], 6.55 / 6)
  close(met["policy/ratio_max"], 1.5)
  close(met["policy/approx_kl"], 0.0784064)  # mean of r - 1 - ln r over the six ratios
  # d loss / d logp = -A * ratio / 6 where unclipped, exactly 0 where clipped or masked
  g = np.asarray(jax.grad(lambda lp: f(lp)[0])(_logp()))
  close(g, np.array([[0, -1.25, 0, 1.5], [-1.0, 2.2, 0, 0]]) / 6)
  clipped = np.array([[T, F, T, F], [F, F, F, F]])
  assert np.array_equal(g == 0, clipped | ~np.asarray(_MASK))
  # symmetric clipping also clips t1
  _, met = losses.policy_loss(_logp(), _OLD, adv, _MASK, clip_low=0.2, clip_high=0.2)
  close(met["policy/clip_frac_high"], 2 / 6)


def test_policy_loss_mode_and_sequence_advantages():
  adv = jnp.asarray(_ADV, jnp.float32)
  loss, _ = losses.policy_loss(_logp(), _OLD, adv, _MASK, 0.2, 0.28, mode="seq-mean-token-mean")
  close(loss, ((-1.28 - 1.25 + 0.8 + 1.5) / 4 + (-1.0 + 2.2) / 2) / 2)
  # [B] advantages broadcast to every token
  seq_adv = jnp.array([1.0, -1.0])
  a, ma = losses.policy_loss(_logp(), _OLD, seq_adv, _MASK)
  b, mb = losses.policy_loss(_logp(), _OLD, jnp.broadcast_to(seq_adv[:, None], (2, 4)), _MASK)
  close(a, b)
  close(ma["policy/clip_frac"], mb["policy/clip_frac"])


def test_dual_clip():
  ratio = np.array([[4.0, 2.0, 4.0, 0.5]])
  adv = jnp.array([[-1.0, -1.0, 1.0, -0.5]])
  m = jnp.ones((1, 4), bool)
  old = jnp.full((1, 4), -1.0)
  lp = jnp.asarray(np.log(ratio) - 1.0, jnp.float32)

  def f(lp):
    return losses.policy_loss(lp, old, adv, m, clip_low=0.2, clip_high=0.28, dual_clip=3.0)

  loss, met = f(lp)
  # t0: min(max(4, 1.28), 3) = 3; t1: 2; t2 (A > 0, no dual): -1.28; t3: max(0.25, 0.4) = 0.4
  close(loss, (3.0 + 2.0 - 1.28 + 0.4) / 4)
  close(met["policy/dual_clip_frac"], 0.25)
  close(met["policy/clip_frac_high"], 0.25)
  close(met["policy/clip_frac_low"], 0.25)
  g = np.asarray(jax.grad(lambda x: f(x)[0])(lp))
  close(g, [[0, 2.0 / 4, 0, 0]])
  loss_nodual, _ = losses.policy_loss(lp, old, adv, m, 0.2, 0.28)
  close(loss_nodual, (4.0 + 2.0 - 1.28 + 0.4) / 4)
  with pytest.raises(ValueError, match="dual_clip"):
    losses.policy_loss(lp, old, adv, m, dual_clip=0.9)


# ------------------------------------------------------------------------------------------------
# truncated importance sampling


def test_truncated_is_weights_cap_and_gradient_scaling():
  # exp(old - sampler) = [0.5, 1.5, 4 -> capped at 2, masked]
  old = jnp.zeros((1, 4))
  sampler = -jnp.log(jnp.array([[0.5, 1.5, 4.0, 1.0]]))
  sampler = sampler.at[0, 3].set(-1e4)  # garbage at the masked slot
  m = jnp.array([[T, T, T, F]])
  w, met = correction.importance_weights(old, sampler, m, "token", cap=2.0)
  close(w, [[0.5, 1.5, 2.0, 0.0]])
  close(met["offpolicy/is_weight_mean"], 4 / 3)
  close(met["offpolicy/is_weight_max"], 2.0)
  close(met["offpolicy/is_truncated_frac"], 1 / 3)

  # the weights multiply the per-token loss and its gradient, and get no gradient themselves
  lp = jnp.asarray([[np.log(1.1), np.log(0.9), 0.0, 0.0]], jnp.float32)
  adv = jnp.array([[1.0, -1.0, 2.0, 0.0]])

  def f(lp, w):
    return losses.policy_loss(lp, old, adv, m, is_weights=w)[0]

  g_plain = np.asarray(jax.grad(f)(lp, jnp.ones((1, 4))))
  g_w, g_wrt_w = jax.grad(f, argnums=(0, 1))(lp, w)
  close(g_plain, [[-1.1 / 3, 0.9 / 3, -2.0 / 3, 0]])
  close(g_w, g_plain * np.asarray(w))
  assert np.all(np.asarray(g_wrt_w) == 0)
  close(f(lp, w), (-1.1 * 0.5 + 0.9 * 1.5 - 2.0 * 2.0) / 3)


# ------------------------------------------------------------------------------------------------
# value loss


def test_value_loss_clipping():
  v = jnp.array([[1.5, 1.5, 0.5, 1e4]])
  old = jnp.array([[1.0, 1.0, 0.0, 0.0]])
  ret = jnp.array([[1.2, 2.0, 0.0, 0.0]])
  m = jnp.array([[T, T, T, F]])
  # t0: max(0.09, (1.2 - 1.2)^2 = 0) -> 0.045, grad v - R = 0.3
  # t1: max(0.25, (1.2 - 2.0)^2 = 0.64) -> 0.32, clipped, grad 0
  # t2: max(0.25, 0.2^2 = 0.04) -> 0.125, grad 0.5
  loss, met = losses.value_loss(v, old, ret, m, clip=0.2)
  close(loss, (0.045 + 0.32 + 0.125) / 3)
  close(met["value/clip_frac"], 1 / 3)
  close(met["value/mean"], 3.5 / 3)
  close(met["value/error"], (0.09 + 0.25 + 0.25) / 3)
  g = jax.grad(lambda x: losses.value_loss(x, old, ret, m, clip=0.2)[0])(v)
  close(g, [[0.3 / 3, 0, 0.5 / 3, 0]])
  loss, met = losses.value_loss(v, old, ret, m, clip=None)
  close(loss, 0.5 * (0.09 + 0.25 + 0.25) / 3)
  close(met["value/clip_frac"], 0.0)


# ------------------------------------------------------------------------------------------------
# entropy and SFT


def test_entropy():
  V = 7
  uniform = jnp.zeros((2, 3, V)) + jnp.array([0.0, 1e4])[:, None, None]  # large offsets are fine
  close(losses.entropy_from_logits(uniform), np.full((2, 3), np.log(V)))
  # p = [0.25, 0.75]: 0.25 ln 4 + 0.75 ln(4/3) = 0.5623351; -inf logits contribute nothing
  logits = jnp.array([[[np.log(0.25), np.log(0.75), -jnp.inf], [0.0, -jnp.inf, -jnp.inf]]])
  close(losses.entropy_from_logits(logits), [[0.5623351, 0.0]])
  g = jax.grad(lambda x: jnp.sum(losses.entropy_from_logits(x)))(logits)
  assert np.all(np.isfinite(np.asarray(g)))
  ent = jnp.array([[1.0, 2.0, 3.0]])
  close(losses.entropy_bonus(ent, jnp.array([[T, T, F]]), 0.01), 0.015)


def test_token_nll_and_logprobs():
  ln = np.log
  logits = jnp.array([[[0.0, 0.0, 0.0], [0.0, ln(2), 0.0], [5.0, -5.0, 0.0], [ln(3), 0.0, 0.0]]])
  targets = jnp.array([[1, 1, 0, 2]])
  m = jnp.array([[T, T, F, T]])
  # p(target): 1/3, 1/2, -, 1/5
  lp = losses.token_logprobs(logits, targets)
  assert lp.dtype == jnp.float32
  close(lp[0, [0, 1, 3]], [-ln(3), -ln(2), -ln(5)])
  loss, met = losses.token_nll(logits, targets, m)
  close(loss, (ln(3) + ln(2) + ln(5)) / 3)
  close(met["sft/nll"], (ln(3) + ln(2) + ln(5)) / 3)
  close(met["sft/accuracy"], 1 / 3)  # only t1's argmax is its target
  close(met["sft/tokens"], 3)


# ------------------------------------------------------------------------------------------------
# jit and the all-masked batch


def test_jittable_and_nan_free_when_all_masked():
  B, Tn, V = 2, 3, 5
  m = jnp.zeros((B, Tn), bool)
  lp = jnp.full((B, Tn), 1e4)  # would overflow exp if it leaked
  old = jnp.zeros((B, Tn))
  adv = jnp.ones((B,))
  logits = jnp.zeros((B, Tn, V))
  targets = jnp.zeros((B, Tn), jnp.int32)
  for mode in losses.MODES:
    pl = jax.jit(losses.policy_loss, static_argnames=("dual_clip", "mode"))
    loss, met = pl(lp, old, adv, m, 0.2, 0.28, dual_clip=3.0, mode=mode, is_weights=jnp.ones((B, Tn)))
    g = jax.jit(jax.grad(lambda x, mode=mode: losses.policy_loss(x, old, adv, m, mode=mode)[0]))(lp)
    for leaf in jax.tree.leaves((loss, met, g)):
      assert np.all(np.asarray(leaf) == 0), mode
  outs = [
    jax.jit(losses.value_loss)(lp, old, old, m),
    jax.jit(jax.grad(lambda x: losses.value_loss(x, old, old, m)[0]))(lp),
    jax.jit(lambda a, b, c: correction.importance_weights(a, b, c, "token", 2.0))(lp, old, m),
    jax.jit(losses.token_nll)(logits, targets, m),
    jax.jit(losses.entropy_bonus, static_argnums=3)(jnp.ones((B, Tn)), m, 0.01, "seq-mean-token-mean"),
    jax.jit(losses.aggregate, static_argnums=2)(lp, m, "token-mean"),
  ]
  for leaf in jax.tree.leaves(outs):
    a = np.asarray(leaf)
    assert np.all(np.isfinite(a)) and np.all(a == 0)
  ent = jax.jit(losses.entropy_from_logits)(logits)
  close(ent, np.full((B, Tn), np.log(V)))
  close(jax.jit(losses.token_logprobs)(logits, targets), np.full((B, Tn), -np.log(V)))
