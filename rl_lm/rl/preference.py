"""Preference losses: Bradley-Terry reward modelling, DPO / cDPO / IPO, sequence log-probs, RM calibration.

Every pair b has a chosen (preferred) and a rejected response. The losses take one number per pair
([B] arrays), compute in float32, and return a scalar loss (to minimise) plus a dict of float32 scalar
metrics with namespaced keys. `mask` [B] (bool or 0/1) drops pairs; an all-masked batch gives loss 0,
metrics 0 and gradient 0. Garbage (inf, NaN) in a masked pair never reaches the result.

  Bradley-Terry (reward model), with an optional per-pair margin m (Llama 2, Touvron et al. 2023):
    loss = -log sigmoid(r_c - r_r - m)
  DPO (Rafailov et al. 2023), h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r)):
    loss = -log sigmoid(beta h)
  cDPO (conservative DPO, Mitchell 2023): the label is flipped with probability eps (`label_smoothing`):
    loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
  IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human Preferences"):
    loss = (h - 1 / (2 beta))^2

IPO convention. The paper's objective is max E[Psi(p*(y > y'))] - tau KL(pi || ref), and its empirical
IPO loss (Eq. 17 of arXiv:2310.12036v2) is (h - tau^-1 / 2)^2 with tau the strength of the KL
regulariser. DPO's beta is the same coefficient (the RLHF objective is max E[r] - beta KL), so
`beta` here *is* the paper's tau: loss = (h - 1 / (2 beta))^2, with no beta factor outside the square,
as TRL's and OpenRLHF's "ipo". Larger beta means a smaller target log-ratio gap 1 / (2 beta), i.e.
staying closer to the reference. h is whatever log-probs are passed in: TRL length-normalises them for
IPO (mean over completion tokens); `sequence_logprobs(..., average=True)` gives that, the default sum
gives the paper's sequence log-likelihoods.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm.rl.masked import as_bool, masked_count, masked_mean, masked_sum

LOSS_TYPES = ("dpo", "ipo")
Metrics = dict[str, jax.Array]


def _f32(x: jax.Array) -> jax.Array:
  return jnp.asarray(x, jnp.float32)


def _pair_mask(mask: jax.Array | None, shape: tuple[int, ...]) -> jax.Array:
  """The [B] bool pair mask; all pairs valid when `mask` is None."""
  if mask is None:
    return jnp.ones(shape, jnp.bool_)
  return jnp.broadcast_to(as_bool(mask), shape)


def bradley_terry_loss(
  chosen_rewards: jax.Array,
  rejected_rewards: jax.Array,
  mask: jax.Array | None = None,
  margin: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """Reward-model loss -log sigmoid(r_c - r_r - margin), mean over valid pairs. [B] each -> (loss, metrics).

  `margin` [B] (optional, a constant) is the Llama 2 margin: the chosen reward must beat the rejected
  one by it before the loss flattens. Stable for any reward gap (log_sigmoid, never log(sigmoid)).
  Metrics, means over valid pairs and all independent of `margin`:
    rm/loss           the loss
    rm/accuracy       r_c > r_r, a tie counting 1/2
    rm/margin_mean    r_c - r_r
    rm/chosen_mean, rm/rejected_mean
  """
  rc = _f32(chosen_rewards)  # [B]
  rr = _f32(rejected_rewards)  # [B]
  m = _pair_mask(mask, rc.shape)  # [B]
  rc = jnp.where(m, rc, 0.0)
  rr = jnp.where(m, rr, 0.0)
  diff = rc - rr  # [B]
  logits = diff
  if margin is not None:
    logits = logits - jnp.where(m, jax.lax.stop_gradient(_f32(margin)), 0.0)
  loss = masked_mean(-jax.nn.log_sigmoid(logits), m)

  d = jax.lax.stop_gradient(diff)
  acc = jnp.where(d > 0, 1.0, jnp.where(d == 0, 0.5, 0.0))  # [B]
  metrics = {
    "rm/loss": jax.lax.stop_gradient(loss),
    "rm/accuracy": masked_mean(acc, m),
    "rm/margin_mean": masked_mean(d, m),
    "rm/chosen_mean": masked_mean(jax.lax.stop_gradient(rc), m),
    "rm/rejected_mean": masked_mean(jax.lax.stop_gradient(rr), m),
  }
  return loss, metrics


def dpo_loss(
  policy_chosen_logp: jax.Array,
  policy_rejected_logp: jax.Array,
  ref_chosen_logp: jax.Array,
  ref_rejected_logp: jax.Array,
  beta: float | jax.Array,
  loss_type: str = "dpo",
  label_smoothing: float = 0.0,
  mask: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """DPO, cDPO or IPO loss on sequence log-probs [B] each -> (loss, metrics). See the module docstring.

  h = (pc - rc) - (pr - rr); "dpo": -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h) with
  eps = `label_smoothing` in [0, 0.5] (0 is plain DPO); "ipo": (h - 1 / (2 beta))^2, beta being the
  IPO paper's tau. The reference log-probs are constants (stop_gradient). Mean over valid pairs.
  Metrics, means over valid pairs (constants):
    dpo/loss
    dpo/reward_chosen, dpo/reward_rejected   implicit rewards beta (pc - rc), beta (pr - rr)
    dpo/reward_margin                       their difference, beta h
    dpo/accuracy                            implicit reward of chosen > rejected (strict, as TRL: 0 at h = 0)
    dpo/logp_chosen, dpo/logp_rejected      policy sequence log-probs
    dpo/logratio_chosen                     pc - rc on the dataset's chosen responses (not a KL: the data are not
                                            sampled from pi; DPO often drives it negative)
  """
  if loss_type not in LOSS_TYPES:
    raise ValueError(f"unknown preference loss type {loss_type!r}; expected one of {LOSS_TYPES}")
  if not isinstance(beta, jax.Array) and not beta > 0:
    raise ValueError(f"beta must be positive, got {beta}")
  if not isinstance(label_smoothing, jax.Array):
    if not 0.0 <= label_smoothing <= 0.5:
      raise ValueError(f"label_smoothing must be in [0, 0.5], got {label_smoothing}")
    if loss_type == "ipo" and label_smoothing != 0.0:
      raise ValueError("label_smoothing applies to loss_type='dpo' only")
  pc = _f32(policy_chosen_logp)  # [B]
  m = _pair_mask(mask, pc.shape)  # [B]
  pc = jnp.where(m, pc, 0.0)
  pr = jnp.where(m, _f32(policy_rejected_logp), 0.0)  # [B]
  rc = jnp.where(m, jax.lax.stop_gradient(_f32(ref_chosen_logp)), 0.0)  # [B]
  rr = jnp.where(m, jax.lax.stop_gradient(_f32(ref_rejected_logp)), 0.0)  # [B]
  beta = _f32(beta)
  h = (pc - rc) - (pr - rr)  # [B]

  if loss_type == "dpo":
    eps = _f32(label_smoothing)
    per_pair = -(1.0 - eps) * jax.nn.log_sigmoid(beta * h) - eps * jax.nn.log_sigmoid(-beta * h)  # [B]
  else:
    per_pair = jnp.square(h - 1.0 / (2.0 * beta))  # [B]
  loss = masked_mean(per_pair, m)

  sg = jax.lax.stop_gradient
  reward_c = sg(beta * (pc - rc))  # [B]
  reward_r = sg(beta * (pr - rr))  # [B]
  metrics = {
    "dpo/loss": sg(loss),
    "dpo/reward_chosen": masked_mean(reward_c, m),
    "dpo/reward_rejected": masked_mean(reward_r, m),
    "dpo/reward_margin": masked_mean(reward_c - reward_r, m),
    "dpo/accuracy": masked_mean(reward_c > reward_r, m),
    "dpo/logp_chosen": masked_mean(sg(pc), m),
    "dpo/logp_rejected": masked_mean(sg(pr), m),
    "dpo/logratio_chosen": masked_mean(sg(pc - rc), m),
  }
  return loss, metrics


def sequence_logprobs(token_logp: jax.Array, mask: jax.Array, average: bool = False) -> jax.Array:
  """Log-probability of each row's completion. token_logp, mask [B, T] -> [B] float32.

  token_logp[:, t] is log p(tokens[:, t] | tokens[:, :t]) (`losses.next_token_logprobs` of the logits, or
  `rl_lm.models.scoring.score_tokens(...).logp`); `mask[:, t]` marks tokens[:, t] as a completion token
  (prompt and padding False). Returns the sum over t >= 1 of token_logp[:, t] where mask[:, t]; with
  `average=True`, the mean over those tokens (0 for a row with none).
  """
  lp = token_logp[:, 1:]  # [B, T-1]
  m = as_bool(mask)[:, 1:]  # [B, T-1]
  total = masked_sum(lp, m, axis=-1)  # [B]
  if average:
    return total / jnp.maximum(masked_count(m, axis=-1), 1.0)
  return total


def concat_pairs(
  chosen_tokens: jax.Array, rejected_tokens: jax.Array, chosen_mask: jax.Array, rejected_mask: jax.Array,
  pad_id: int = 0,
) -> tuple[jax.Array, jax.Array]:
  """Stacks chosen [B, Tc] over rejected [B, Tr], right-padded to T = max(Tc, Tr). -> tokens, mask [2B, T].

  One forward pass over the result scores both halves; `split_pairs` undoes the stacking of its [2B] output.
  Padding gets token `pad_id` and mask False.
  """
  T = max(chosen_tokens.shape[1], rejected_tokens.shape[1])

  def pad(x: jax.Array, value: int | bool) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, T - x.shape[1])), constant_values=value)

  tokens = jnp.concatenate([pad(chosen_tokens, pad_id), pad(rejected_tokens, pad_id)], axis=0)  # [2B, T]
  mask = jnp.concatenate([pad(as_bool(chosen_mask), False), pad(as_bool(rejected_mask), False)], axis=0)  # [2B, T]
  return tokens, mask


def split_pairs(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """[2B, ...] from a `concat_pairs` batch -> (chosen [B, ...], rejected [B, ...])."""
  B = x.shape[0] // 2
  return x[:B], x[B:]


def calibration(
  chosen_rewards: np.ndarray | jax.Array,
  rejected_rewards: np.ndarray | jax.Array,
  labels_agree: np.ndarray | jax.Array | None = None,
  bins: int = 10,
  symmetric: bool = True,
) -> dict[str, np.ndarray | float]:
  """Reward-model calibration: predicted preference probability against how often it comes true. NumPy, eager.

  p = sigmoid(r_c - r_r) [N] is the model's probability that the labelled preference (chosen over
  rejected) holds; `labels_agree` [N] bool says whether it did (e.g. a held-out annotator agreed), by
  default always. p is cut into `bins` equal-width bins on [0, 1]; per bin the mean p is compared with
  the fraction of pairs whose label held. With `symmetric` (default) every pair is also counted from the
  other side, as (1 - p, not agree): the diagram then does not depend on which side was listed first, is
  informative even when every label holds, and its upper half is the usual confidence-vs-accuracy
  diagram of the predicted winner (max(p, 1 - p) against whether the predicted winner was the labelled one).

  Returns (bin arrays [bins], NaN in an empty bin):
    rm/ece             expected calibration error, sum over bins of count / total * |accuracy - confidence|
    rm/bin_edges       [bins + 1]
    rm/bin_confidence  mean predicted probability
    rm/bin_accuracy    empirical frequency of the predicted event
    rm/bin_count       number of (counted) pairs
  """
  if bins < 1:
    raise ValueError(f"bins must be >= 1, got {bins}")
  d = np.asarray(chosen_rewards, np.float64) - np.asarray(rejected_rewards, np.float64)  # [N]
  p = 0.5 * (1.0 + np.tanh(0.5 * d))  # [N], sigmoid without overflow
  y = np.ones_like(p) if labels_agree is None else np.asarray(labels_agree, np.float64).reshape(p.shape)  # [N]
  if symmetric:
    p = np.concatenate([p, 1.0 - p])  # [2N]
    y = np.concatenate([y, 1.0 - y])
  edges = np.linspace(0.0, 1.0, bins + 1)
  idx = np.clip(np.floor(p * bins).astype(np.int64), 0, bins - 1)  # p = 1 goes in the last bin
  count = np.bincount(idx, minlength=bins).astype(np.float64)  # [bins]
  with np.errstate(invalid="ignore", divide="ignore"):
    conf = np.bincount(idx, weights=p, minlength=bins) / count  # [bins]
    acc = np.bincount(idx, weights=y, minlength=bins) / count  # [bins]
  full = count > 0
  total = max(float(count.sum()), 1.0)
  ece = float(np.sum(count[full] / total * np.abs(acc[full] - conf[full])))
  return {
    "rm/ece": ece,
    "rm/bin_edges": edges,
    "rm/bin_confidence": conf,
    "rm/bin_accuracy": acc,
    "rm/bin_count": count,
  }


__all__ = [
  "LOSS_TYPES", "bradley_terry_loss", "calibration", "concat_pairs", "dpo_loss", "sequence_logprobs", "split_pairs",
]
