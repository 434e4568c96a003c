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
from rl_lm.rl import losses


class TokenScores(NamedTuple):
  """Aligned with the tokens: entry [b, t] is about tokens[b, t] given tokens[b, :t]; column 0 is 0 / False."""

  logp: jax.Array  # [B, T] float32: log softmax(logits[t - 1] / temperature)[tokens[t]]
  entropy: jax.Array  # [B, T] float32: entropy of that distribution (nats)
  hit: jax.Array  # [B, T] bool: the most likely token at t - 1 was tokens[t]


def _chunk_scores(cfg: ModelConfig, params: transformer.Params, h: jax.Array, targets: jax.Array,
                  temperature: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """h [B, c, D], targets [B, c] -> logp, entropy [B, c] float32 and hit [B, c] bool."""
  logits = transformer.logits_from_hidden(cfg, params, h) / temperature  # [B, c, V] float32
  hit = jnp.argmax(logits, axis=-1) == targets
  return losses.token_logprobs(logits, targets), losses.entropy_from_logits(logits), hit


def score_tokens(cfg: ModelConfig, params: transformer.Params, tokens: jax.Array, mask: jax.Array,
                 temperature: float = 1.0) -> TokenScores:
  """The TokenScores of `tokens` [B, T] int32 with real-token `mask` [B, T] bool (see the module docstring)."""
  h = transformer.hidden_states(cfg, params, tokens, mask)[:, :-1]  # [B, T-1, D]: position t - 1 predicts t
  targets = tokens[:, 1:]  # [B, T-1]
  B, n = targets.shape
  c = cfg.logit_chunk
  if c <= 0 or c >= n:
    logp, entropy, hit = _chunk_scores(cfg, params, h, targets, temperature)
  else:
    k = -(-n // c)  # chunks; the last is padded with copies of position 0
    pad = k * c - n
    h = jnp.concatenate([h, jnp.repeat(h[:, :1], pad, axis=1)], axis=1) if pad else h
    targets_p = jnp.concatenate([targets, jnp.repeat(targets[:, :1], pad, axis=1)], axis=1) if pad else targets
    hc = h.reshape(B, k, c, h.shape[-1]).swapaxes(0, 1)  # [k, B, c, D]
    tc = targets_p.reshape(B, k, c).swapaxes(0, 1)  # [k, B, c]
    chunk = jax.checkpoint(lambda xs: _chunk_scores(cfg, params, xs[0], xs[1], temperature))
    outs = jax.lax.map(chunk, (hc, tc))  # 3 x [k, B, c]
    logp, entropy, hit = (o.swapaxes(0, 1).reshape(B, k * c)[:, :n] for o in outs)
  first = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)  # [B, T-1] -> [B, T]
  return TokenScores(first(logp), first(entropy), first(hit))
