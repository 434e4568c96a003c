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

Both log-probs are of the temperature-scaled distributions the student samples from (`sampling.temperature`), so
the teacher is compared on the student's terms. The teacher must share the student's vocabulary (checked when it
is loaded, rl_lm/train/teacher.py): token t means the same string to both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_rewards(student_logp: jax.Array, teacher_logp: jax.Array, mask: jax.Array) -> jax.Array:
  """log pi_teacher - log pi_student on `mask`, 0 elsewhere. All [B, T]."""
  return jnp.where(mask, teacher_logp - student_logp, 0.0)


def advantages(verifier_adv: jax.Array, student_logp: jax.Array, teacher_logp: jax.Array, mask: jax.Array,
               coef: float, verifier: float) -> jax.Array:
  """verifier * verifier_adv + coef * token_rewards on `mask` (the completion tokens of rows that train), 0
  elsewhere. All [B, T]."""
  adv = verifier * verifier_adv + coef * token_rewards(student_logp, teacher_logp, mask)
  return jnp.where(mask, adv, 0.0)


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
