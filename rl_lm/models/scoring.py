"""Per-token scores of a sequence under the model, without the whole [B, T, V] logits at once.

  scores = score_tokens(cfg, params, tokens, mask, temperature)   # TokenScores, [B, T] each

Every trainer scores tokens here: the RL trainer (old, reference and new log-probs, entropy), SFT (the
NLL and token accuracy), DPO (sequence log-probs) and the sampler's check (`sampling.completion_logprobs`).

With a 49k-152k vocabulary the float32 logits of a batch dominate memory: 64 x 512 tokens x 151,936 entries
is 19.9 GB, and the backward pass keeps them (and the softmax) too. With `cfg.logit_chunk = c > 0` the
sequence is cut into chunks of c positions; each chunk's logits are made, reduced to the three [B, c]
scores and dropped, under `jax.checkpoint`, so the backward pass recomputes one chunk's logits at a time
instead of storing them all. Peak memory then grows with B * c * V instead of B * T * V; the values and
gradients are those of the whole-sequence computation (the same formulas per position,
`losses.token_logprobs` and `losses.entropy_from_logits`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.rl import distill, losses


class TokenScores(NamedTuple):
  """Aligned with the tokens: entry [b, t] is about tokens[b, t] given tokens[b, :t]; column 0 is 0 / False."""

  logp: jax.Array  # [B, T] float32: log softmax(logits[t - 1] / temperature)[tokens[t]]
  entropy: jax.Array  # [B, T] float32: entropy of that distribution (nats)
  hit: jax.Array  # [B, T] bool: the most likely token at t - 1 was tokens[t]
  divergence: jax.Array | None = None  # [B, T] float32, with a teacher: JSD_beta(teacher || model) at t - 1


class Teacher(NamedTuple):
  """A frozen model to measure the scored one against, position by position, over the whole vocabulary."""

  cfg: ModelConfig
  params: transformer.Params
  beta: float  # the divergence, rl_lm.rl.distill.generalized_jsd: 0 forward KL, 1 reverse KL
  hidden: jax.Array | None = None  # [B, T-1, D'] its final hidden states when made beforehand: not run again


def _chunk_scores(cfg: ModelConfig, params: transformer.Params, h: jax.Array, targets: jax.Array,
                  temperature: float, teacher: Teacher | None = None, th: jax.Array | None = None
                  ) -> tuple[jax.Array, ...]:
  """h [B, c, D], targets [B, c] -> logp, entropy [B, c] float32 and hit [B, c] bool; with a teacher (its hidden
  states `th` [B, c, D']) the divergence [B, c] float32 too."""
  logits = transformer.logits_from_hidden(cfg, params, h) / temperature  # [B, c, V] float32
  hit = jnp.argmax(logits, axis=-1) == targets
  out = (losses.token_logprobs(logits, targets), losses.entropy_from_logits(logits), hit)
  if teacher is None:
    return out
  t_logits = transformer.logits_from_hidden(teacher.cfg, teacher.params, th) / temperature  # [B, c, V]
  # A non-finite teacher logit is the teacher's failure: prepare masks its row (distill/teacher_invalid_frac); a
  # finite stand-in keeps the masked positions' divergence, and so every gradient, finite (0 * nan is nan).
  t_logits = jnp.where(jnp.isfinite(t_logits), t_logits, 0.0)
  return out + (distill.generalized_jsd(logits, t_logits, teacher.beta),)


def score_tokens(cfg: ModelConfig, params: transformer.Params, tokens: jax.Array, mask: jax.Array,
                 temperature: float = 1.0, teacher: Teacher | None = None) -> TokenScores:
  """The TokenScores of `tokens` [B, T] int32 with real-token `mask` [B, T] bool (see the module docstring).

  With a `teacher` (same vocabulary) the scores carry its divergence from this model at every position, made
  chunk by chunk with the logits (both models' [B, c, V] at a time); no gradient reaches the teacher. Its hidden
  states are the ones it carries, else its forward here."""
  h = transformer.hidden_states(cfg, params, tokens, mask)[:, :-1]  # [B, T-1, D]: position t - 1 predicts t
  th = None
  if teacher is not None:
    th = teacher.hidden
    if th is None:
      th = transformer.hidden_states(teacher.cfg, jax.lax.stop_gradient(teacher.params), tokens, mask)[:, :-1]
    th = jax.lax.stop_gradient(th)
  return scores_from_hidden(cfg, params, h, tokens, temperature, teacher, th)


def scores_from_hidden(cfg: ModelConfig, params: transformer.Params, h: jax.Array, tokens: jax.Array,
                       temperature: float = 1.0, teacher: Teacher | None = None, th: jax.Array | None = None
                       ) -> TokenScores:
  """`score_tokens` from the model's final hidden states h [B, T-1, D] (position t - 1 predicts tokens[:, t]) of
  `tokens` [B, T]; with a teacher, its hidden states `th` [B, T-1, D'] too."""
  hs = (h,) if teacher is None else (h, th)
  targets = tokens[:, 1:]  # [B, T-1]
  B, n = targets.shape
  c = cfg.logit_chunk
  score = lambda hs, t: _chunk_scores(cfg, params, hs[0], t, temperature, teacher, *hs[1:])  # noqa: E731
  if c <= 0 or c >= n:
    outs = score(hs, targets)
  else:
    k = -(-n // c)  # chunks; the last is padded with copies of position 0
    pad = k * c - n
    padded = lambda x: jnp.concatenate([x, jnp.repeat(x[:, :1], pad, axis=1)], axis=1) if pad else x  # noqa: E731
    split = lambda x: padded(x).reshape(B, k, c, *x.shape[2:]).swapaxes(0, 1)  # noqa: E731 -- [k, B, c, ...]
    chunk = jax.checkpoint(lambda xs: score(xs[0], xs[1]))
    outs = jax.lax.map(chunk, (tuple(split(x) for x in hs), split(targets)))  # 3 or 4 x [k, B, c]
    outs = tuple(o.swapaxes(0, 1).reshape(B, k * c)[:, :n] for o in outs)
  first = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)  # [B, T-1] -> [B, T]
  return TokenScores(*(first(o) for o in outs))
