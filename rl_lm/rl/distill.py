"""On-policy distillation: the student samples, a frozen teacher scores every sampled token, and the per-token
reward is the negative reverse KL's sample, log pi_teacher(y_t) - log pi_student(y_t) (Agarwal et al. 2024, GKD
with lambda = 1 and beta = 1 on the student's samples; the form verl, prime-rl and Thinking Machines use).

  A[b, t] = verifier * A_verifier[b, t] + coef * (teacher_logp[b, t] - student_logp[b, t])      on completion tokens

The student's log-probs are the old policy's (`prepare`), so the reward is a constant of the update: the policy
gradient of the surrogate sum_t r_t(theta) * A_t at theta = theta_old is, in expectation over the student's
samples, -coef * grad KL(pi_student || pi_teacher) per token (tests/test_distill.py checks it exactly on a toy
vocabulary), plus the verifier's gradient. Each token's advantage is its own reward (discount 0, as in
Thinking Machines' recipe): the gradient lowers each position's KL given its prefix, not the effect a token has on
the KLs of the positions after it.

The GKD family (`rl.distill.loss = "jsd"`, Agarwal et al. 2024): instead of a sampled reward, the divergence
between the two next-token distributions, over the whole vocabulary, at every completion position, differentiated
directly (the sequences are data, not a sampling decision):

  JSD_beta(T || S) = beta * KL(T || M) + (1 - beta) * KL(S || M),    M = beta * T + (1 - beta) * S

beta = 0 is taken as the forward KL(T || S) itself and beta = 1 as the reverse KL(S || T) (the generalised JSD
shrinks to beta * KL(T || S) and (1 - beta) * KL(S || T) near the two ends, so the ends are the limits' directions
at full scale); 0.5 is the symmetric Jensen-Shannon divergence. With the on-policy fraction lambda
(`rl.distill.on_policy`) < 1, a step's sequences are the teacher's own samples with probability 1 - lambda
(supervised KD) and the student's otherwise.

Both models' distributions are the temperature-scaled ones the student samples from (`sampling.temperature`), so
the teacher is compared on the student's terms. The teacher must share the student's vocabulary (checked when it
is loaded, rl_lm/train/teacher.py): token t means the same string to both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def token_rewards(student_logp: jax.Array, teacher_logp: jax.Array, mask: jax.Array) -> jax.Array:
  """log pi_teacher - log pi_student on `mask`, 0 elsewhere. All [B, T]."""
  return jnp.where(mask, teacher_logp - student_logp, 0.0)


def advantages(verifier_adv: jax.Array, student_logp: jax.Array, teacher_logp: jax.Array, mask: jax.Array,
               coef: float, verifier: float) -> jax.Array:
  """verifier * verifier_adv + coef * token_rewards on `mask` (the completion tokens of rows that train), 0
  elsewhere. All [B, T]."""
  adv = verifier * verifier_adv + coef * token_rewards(student_logp, teacher_logp, mask)
  return jnp.where(mask, adv, 0.0)


def generalized_jsd(student_logits: jax.Array, teacher_logits: jax.Array, beta: float) -> jax.Array:
  """JSD_beta(teacher || student) per position (module docstring), nats. [..., V] logits -> [...] float32.

  `beta` is a Python float (a static choice of divergence). No gradient reaches the teacher's logits."""
  s = jax.nn.log_softmax(student_logits.astype(jnp.float32), axis=-1)
  t = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32), axis=-1)
  kl = lambda log_p, log_q: jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)  # noqa: E731 -- KL(p || q)
  if beta == 0.0:
    return kl(t, s)
  if beta == 1.0:
    return kl(s, t)
  m = jnp.logaddexp(t + jnp.log(beta), s + jnp.log1p(-beta))  # log(beta * T + (1 - beta) * S)
  return beta * kl(t, m) + (1.0 - beta) * kl(s, m)


def teacher_step(seed: int, step: int, on_policy: float) -> bool:
  """Whether step `step` trains on the teacher's samples rather than the student's: a coin of probability
  1 - on_policy, drawn from the seed and the step alone (the same on a resumed run, whatever ran before)."""
  return on_policy < 1.0 and float(np.random.default_rng((seed, 36, step)).random()) >= on_policy


def metrics(student_logp: jax.Array, teacher_logp: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """distill/*: the reverse KL to the teacher per completion token (k1, its sample mean: the quantity the
  distillation reward lowers) and per sequence (the sum over a row's tokens, averaged over rows), and the teacher's
  mean log-prob of the student's tokens."""
  m = mask.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  gap = (student_logp - teacher_logp) * m
  rows = jnp.maximum(jnp.sum(jnp.any(mask, axis=1)), 1)
  return {"distill/reverse_kl": jnp.sum(gap) / n, "distill/reverse_kl_seq": jnp.sum(gap) / rows,
          "distill/teacher_logp_mean": jnp.sum(teacher_logp * m) / n}
