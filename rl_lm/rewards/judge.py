"""An LLM judge's verdicts, read from its next-token distribution, never parsed from free text.

The judge (a frozen model, like the teacher: rl_lm/train/teacher.py) reads a prompt that ends where its answer
begins, and one forward gives its distribution over the next token (`next_token_logprobs`).

Pointwise (a rubric, a score from 1 to K): the score is the expectation of the score values under the next-token
distribution restricted to the score tokens,

  score = sum_k v_k p(t_k) / sum_k p(t_k),    mass = sum_k p(t_k).

The mass says whether the judge answered on the scale at all: below `min_mass` the row is a judge failure (masked
and counted as a verifier fault is, never a score of 0 or of the scale's middle).

Pairwise (which of two answers is better, "1" or "2"): both orders are shown, A first then B first, and

  q1 = p("1" | A, B) / (p("1") + p("2")),   q2 = p("2" | B, A) / (p("1") + p("2")),   P(A > B) = (q1 + q2) / 2.

Swapping A and B swaps the two prompts, so P(B > A) = 1 - P(A > B) exactly: the average cancels the judge's
preference for a position. That preference is measured, not hidden: `first_rate` is how often the judge picks the
answer shown first (0.5: no position bias), `flip_rate` how often its choice changes when the order does.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig


@functools.partial(jax.jit, static_argnums=0)
def next_token_logprobs(cfg: ModelConfig, params: transformer.Params, tokens: jax.Array, lengths: jax.Array
                        ) -> jax.Array:
  """log p(next token | tokens[b, :lengths[b]]) for right-padded prompts tokens [B, L]. -> [B, V] float32."""
  mask = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
  h = transformer.hidden_states(cfg, params, tokens, mask)  # [B, L, D]
  last = jnp.take_along_axis(h, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)  # [B, 1, D]
  logits = transformer.logits_from_hidden(cfg, params, last)[:, 0]  # [B, V]
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


class Pointwise(NamedTuple):
  score: jax.Array  # [B] float32: the expected score (NaN where not valid)
  mass: jax.Array  # [B] float32: the probability of answering with a score token
  valid: jax.Array  # [B] bool: mass >= min_mass


def pointwise(logp: jax.Array, score_ids: jax.Array, values: jax.Array, min_mass: float) -> Pointwise:
  """logp [B, V] next-token log-probs; score_ids [K] the tokens of the scale, values [K] what each means."""
  p = jnp.exp(logp[:, score_ids])  # [B, K]
  mass = jnp.sum(p, axis=1)
  score = jnp.sum(p * values[None, :], axis=1) / jnp.maximum(mass, 1e-30)
  valid = mass >= min_mass
  return Pointwise(jnp.where(valid, score, jnp.nan), mass, valid)


class Pairwise(NamedTuple):
  p_first: jax.Array  # [B] float32: P(A > B), the two orders averaged (NaN where not valid)
  q_a_first: jax.Array  # [B]: P(A > B) when A is shown first
  q_b_first: jax.Array  # [B]: P(A > B) when B is shown first
  valid: jax.Array  # [B] bool: both orders answered "1" or "2" with at least min_mass


def pairwise(logp_a_first: jax.Array, logp_b_first: jax.Array, one: int, two: int, min_mass: float) -> Pairwise:
  """logp_* [B, V]: the judge's next-token log-probs after (A, B) and after (B, A); `one`, `two`: the ids of the
  answer tokens "1" and "2"."""

  def first_wins(logp: jax.Array) -> tuple[jax.Array, jax.Array]:
    p1, p2 = jnp.exp(logp[:, one]), jnp.exp(logp[:, two])
    return p1 / jnp.maximum(p1 + p2, 1e-30), p1 + p2

  q1, m1 = first_wins(logp_a_first)
  b_first, m2 = first_wins(logp_b_first)
  q2 = 1.0 - b_first  # B shown first: A wins when the judge says "2"
  valid = (m1 >= min_mass) & (m2 >= min_mass)
  return Pairwise(jnp.where(valid, (q1 + q2) / 2, jnp.nan), q1, q2, valid)


def position_bias(result: Pairwise) -> dict[str, jax.Array]:
  """judge/first_rate: how often the answer shown first is picked (over both orders of every valid pair; 0.5
  is none), judge/flip_rate: the share of valid pairs whose winner changes with the order."""
  v = result.valid.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(v), 1.0)
  picks_first = ((result.q_a_first > 0.5).astype(jnp.float32) + (result.q_b_first < 0.5).astype(jnp.float32)) / 2
  flips = (result.q_a_first > 0.5) != (result.q_b_first > 0.5)
  return {"judge/first_rate": jnp.sum(picks_first * v) / n, "judge/flip_rate": jnp.sum(flips * v) / n,
          "judge/invalid_frac": 1.0 - jnp.mean(v)}
