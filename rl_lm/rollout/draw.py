"""Drawing one token per row from logits: top-k / top-p filtering and exact inverse-CDF sampling, no sort.

The log-prob a draw reports is of the temperature-scaled, untruncated distribution (`rl_lm.rollout.types`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import keys as keys_lib
from rl_lm.rollout.types import SamplingConfig

BLOCK_MULTIPLE = 8  # `_inverse_cdf`'s block count is a multiple of this: the tensor axes rl_lm's meshes use divide it


def _sortable(x: jax.Array) -> jax.Array:
  """float32 -> uint32 keys in the same order (-inf lowest), so a threshold can be searched bit by bit."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


def _largest_threshold(keys: jax.Array, enough: Callable[[jax.Array], jax.Array]) -> jax.Array:
  """Per row, the largest key t for which `enough(keys >= t)` holds ([B, V] bool -> [B] bool, monotone: true
  for t = 0). Bisection over the 32 key bits: 32 passes over [B, V] and no sort. keys [B, V] uint32 -> [B, 1]."""
  B = keys.shape[0]

  def body(_, bounds):
    lo, hi = bounds  # enough(lo) holds; the answer lies in [lo, hi]
    gap = hi - lo
    mid = lo + (gap >> 1) + (gap & 1)  # upper midpoint, no overflow
    ok = enough(keys >= mid[:, None])
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

  zero = jnp.zeros((B,), jnp.uint32)
  lo, _ = jax.lax.fori_loop(0, 32, body, (zero, zero + jnp.uint32(0xFFFFFFFF)))
  return lo[:, None]


def filter_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """Sets logits outside the top-k and outside the top-p nucleus to -inf. [B, V] -> [B, V].

  Top-k keeps every logit at least the k-th largest (ties included); top-p keeps the smallest set of most
  probable tokens whose mass reaches p (ties at its least probable included). Both thresholds are found by
  bisection on the values' bits (`_largest_threshold`), exactly, without sorting the vocabulary.
  """
  neg = jnp.asarray(-jnp.inf, logits.dtype)
  if top_k and top_k < logits.shape[-1]:
    keys = _sortable(logits)
    kth = _largest_threshold(keys, lambda kept: jnp.sum(kept, axis=-1) >= top_k)
    logits = jnp.where(keys < kth, neg, logits)
  if top_p < 1.0:
    probs = jax.nn.softmax(logits, axis=-1)
    keys = _sortable(probs)
    least = _largest_threshold(keys, lambda kept: jnp.sum(jnp.where(kept, probs, 0.0), axis=-1) >= top_p)
    logits = jnp.where(keys < least, neg, logits)
  return logits


def _inverse_cdf(weights: jax.Array, u: jax.Array) -> jax.Array:
  """Per row, the first token whose cumulative weight exceeds u times the total. weights [B, V] >= 0 (not all 0),
  u [B] uniform in [0, 1) -> [B] int32, never a token of weight 0.

  In two levels, so no pass runs a cumulative sum over the whole vocabulary (on a CPU, XLA's cumsum over [B, V] costs
  several passes over it): the vocabulary is cut into blocks of about sqrt(V) tokens; the block comes from the
  cumulative block totals, then the token from the cumulative weights inside that block. The blocks are padded (with
  weight 0, never drawn) to a multiple of `BLOCK_MULTIPLE`, so that a vocabulary sharded over the tensor axis (up to
  that many chips) is cut into whole blocks on each chip and the draw stays sharded: with 251 blocks of Llama-3's
  128,256 tokens, XLA gathered the whole vocabulary's logits onto every chip of the axis for the draw (354 MB a step
  on each v5p chip at 512 rows on data 4 x tensor 8; with 256 blocks, 116 MB).
  """
  B, V = weights.shape
  size = 1 << max(0, int(np.ceil(np.log2(np.sqrt(V)))))  # tokens per block
  n = -(-V // (size * BLOCK_MULTIPLE)) * BLOCK_MULTIPLE
  blocks = jnp.pad(weights, ((0, 0), (0, n * size - V))).reshape(B, n, size)  # [B, n, size]
  totals = jnp.sum(blocks, axis=-1)  # [B, n]
  ends = jnp.cumsum(totals, axis=-1)  # [B, n]
  target = jnp.minimum(u * ends[:, -1], jnp.nextafter(ends[:, -1], 0.0))  # [B], strictly below the total
  block = jnp.sum(ends <= target[:, None], axis=-1).astype(jnp.int32)  # < n: ends[block] > target
  block = _last_positive(totals, block)  # a no-op unless rounding left the block empty
  start = jnp.where(block > 0, jnp.take_along_axis(ends, jnp.maximum(block - 1, 0)[:, None], axis=-1)[:, 0], 0.0)
  inside = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]  # [B, size]
  j = jnp.sum(jnp.cumsum(inside, axis=-1) <= (target - start)[:, None], axis=-1).astype(jnp.int32)
  j = _last_positive(inside, jnp.minimum(j, size - 1))  # past the block's end only by rounding
  return block * size + j


def _last_positive(weights: jax.Array, index: jax.Array) -> jax.Array:
  """index [B], moved back to the last positive entry of weights [B, n] at or before it (one must exist)."""
  n = weights.shape[-1]
  positive = (weights > 0) & (jnp.arange(n)[None, :] <= index[:, None])
  return (n - 1 - jnp.argmax(positive[:, ::-1], axis=-1)).astype(jnp.int32)


def sample_token(logits: jax.Array, rng: jax.Array | None, cfg: SamplingConfig, *,
                 row_keys: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row. logits [B, V] float32 -> (tokens [B] int32, log-probs [B] float32). Either `rng`,
  one key (typed or legacy) for the batch, or `row_keys`, [B] keys, one per row, so that a row's draw does not
  depend on which rows share its batch.

  The log-prob is of the temperature-scaled, untruncated distribution (see module docstring).
  Sampling is by inverse CDF with one uniform per row (`_inverse_cdf`), which is exact and cheaper than Gumbel
  noise over the whole vocabulary.
  """
  if cfg.greedy:
    scaled = logits
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  else:
    scaled = logits / cfg.temperature
    filtered = filter_logits(scaled, cfg.top_k, cfg.top_p)
    weights = jnp.exp(filtered - jnp.max(filtered, axis=-1, keepdims=True))  # [B, V], 0 where filtered out
    if (rng is None) == (row_keys is None):
      raise ValueError("sample_token takes one of rng (a key for the batch) and row_keys ([B] keys)")
    if row_keys is not None:
      row_keys = keys_lib.as_row_keys(row_keys, logits.shape[0])
      u = jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(row_keys)
    else:
      u = jax.random.uniform(keys_lib.as_key(rng), (logits.shape[0],), jnp.float32)
    tokens = _inverse_cdf(weights, u)
  chosen = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
  return tokens, chosen - jax.nn.logsumexp(scaled, axis=-1)

