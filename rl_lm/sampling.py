"""In-JAX sampling with a preallocated KV cache: one jit, prefill plus a `lax.while_loop` decode.

Layout. Prompts come in right-padded (`prompts[b, :prompt_lengths[b]]` are real). Inside, each
prompt is moved to the right edge of its P slots, so every row's completion starts at slot P and
one cache index serves the whole batch. The returned `Rollout.tokens` [B, P + N] keeps that
layout: row b's prompt sits in slots [P - len_b, P), its completion in [P, P + lengths[b]).
`prompt_mask | completion_mask` is the attention mask to score the rollout with
`transformer.forward`, which gives the same positions as the sampler used.

Log-probs. `Rollout.logprobs[b, t]` is log softmax(logits / temperature)[token] of the full,
untruncated vocabulary (top-k and top-p change which tokens can be drawn, not the reported
distribution), i.e. exactly what a trainer computes from `forward` logits divided by the same
temperature, so the two can be compared like with like. Greedy decoding reports temperature-1
log-probs. Entries outside the completion are 0.

Stopping. A row stops after emitting one of its stop tokens (kept, counted in `lengths`,
`finished` True) or after its `max_new_tokens` (`finished` False: truncated). The loop ends
when every row has stopped or N tokens were drawn. Slots after a row's end hold `pad_id`.

Cost. The cache is written in place, and decode runs in segments whose attention reads only the first
P + w, P + 2w, P + 4w, ... slots (`decode_windows`, w = `config.sampling.window`), so a step costs about what
the filled part of the cache costs. `rl_lm.refill` serves a long-tailed batch with fewer rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import keys as keys_lib
from rl_lm import mesh as mesh_lib
from rl_lm.config import Sampling
from rl_lm.models import scoring, transformer
from rl_lm.models.presets import ModelConfig


@dataclasses.dataclass(frozen=True)
class SamplingConfig(Sampling):
  """How to draw completions: the `config.sampling` knobs (defaults and checks there), and the tokenizer's tokens."""

  stop_tokens: tuple[int, ...] = ()  # default stop set for every row
  pad_id: int = 0


class Rollout(NamedTuple):
  """Sampled completions in the layout described in the module docstring."""

  tokens: jax.Array  # [B, P + N] int32
  prompt_mask: jax.Array  # [B, P + N] bool
  completion_mask: jax.Array  # [B, P + N] bool
  logprobs: jax.Array  # [B, P + N] float32, sampler log-probs of completion tokens, 0 elsewhere
  lengths: jax.Array  # [B] int32, completion tokens per row (stop token included)
  finished: jax.Array  # [B] bool, stopped on a stop token rather than truncated


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
  cumulative block totals, then the token from the cumulative weights inside that block.
  """
  B, V = weights.shape
  size = 1 << max(0, int(np.ceil(np.log2(np.sqrt(V)))))  # tokens per block
  n = -(-V // size)
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


def decode_windows(prompt_slots: int, new_tokens: int, smallest: int) -> tuple[int, ...]:
  """The attention windows of the decode segments: P + w, P + 2w, P + 4w, ... slots (w = `smallest`), the last
  one the whole cache (P + N). A step attends over at most twice the slots filled so far (and at least P + w)."""
  windows, c = [], smallest
  while c < new_tokens:
    windows.append(prompt_slots + c)
    c *= 2
  return (*windows, prompt_slots + new_tokens)


def right_align(prompts: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Right-padded prompts [B, P] -> the same prompts pushed to the right edge, and their mask."""
  P = prompts.shape[1]
  src = jnp.arange(P)[None, :] - (P - lengths)[:, None]  # [B, P]
  valid = src >= 0
  aligned = jnp.take_along_axis(prompts, jnp.maximum(src, 0), axis=1)
  return jnp.where(valid, aligned, 0), valid


class Batch(NamedTuple):
  """What every decode step of one generate call reads: the right-aligned prompts and the call's settings."""

  prompts: jax.Array  # [B, P] int32, each prompt pushed to the right edge of its P slots
  prompt_mask: jax.Array  # [B, P] bool
  prompt_lengths: jax.Array  # [B] int32
  kv_mask: jax.Array  # [B, P + N] bool: the prompt's cache slots (a step adds the completion's so far)
  rng: jax.Array  # the call's key: token i is drawn with fold_in(rng, i)
  stop_tokens: jax.Array  # [B, K] int32
  max_new_tokens: jax.Array  # [B] int32


class DecodeState(NamedTuple):
  """The decode loop's carry: completion token i - 1 is drawn and is fed next."""

  i: jax.Array  # [] int32: the completion index the next step draws
  cache: transformer.KVCache
  prev: jax.Array  # [B] int32: the token drawn last
  done: jax.Array  # [B] bool: the row draws no more
  stopped: jax.Array  # [B] bool: the row emitted a stop token
  tokens: jax.Array  # [B, N] int32
  logp: jax.Array  # [B, N] float32
  valid: jax.Array  # [B, N] bool


def _is_stop(batch: Batch, tok: jax.Array) -> jax.Array:  # [B] -> [B]
  return jnp.any(tok[:, None] == batch.stop_tokens, axis=-1)


def prefill(
  model_cfg: ModelConfig, cfg: SamplingConfig, params: Any, prompts: jax.Array, prompt_lengths: jax.Array,
  rng: jax.Array, stop_tokens: jax.Array, max_new_tokens: jax.Array,
) -> tuple[Batch, DecodeState]:
  """PREFILL: the whole prompt at slots [0, P) of a fresh cache, token 0 drawn from the last slot's logits."""
  B, P = prompts.shape
  N = cfg.max_new_tokens
  S = P + N
  prompt_lengths = prompt_lengths.astype(jnp.int32)
  rng = keys_lib.as_key(rng)
  prompts, prompt_mask = right_align(prompts.astype(jnp.int32), prompt_lengths)
  prompts = mesh_lib.constrain(prompts, ("batch", "length"))
  cache_dtype = jnp.dtype(cfg.cache_dtype) if cfg.cache_dtype else model_cfg.compute_dtype
  cache = transformer.init_cache(model_cfg, B, S, cache_dtype)
  base_kv_mask = jnp.concatenate([prompt_mask, jnp.zeros((B, N), bool)], axis=1)  # [B, S]
  batch = Batch(prompts, prompt_mask, prompt_lengths, base_kv_mask, rng, stop_tokens, max_new_tokens)

  logits, cache = transformer.forward_cached(
    model_cfg, params, prompts, transformer.positions_from_mask(prompt_mask), cache, 0, base_kv_mask,
    last_only=True, window=P,
  )
  tok, logp = sample_token(logits[:, -1], jax.random.fold_in(rng, 0), cfg)
  out_tokens = jnp.full((B, N), cfg.pad_id, jnp.int32).at[:, 0].set(tok)
  out_logp = jnp.zeros((B, N), jnp.float32).at[:, 0].set(logp)
  out_valid = jnp.zeros((B, N), bool).at[:, 0].set(True)
  stopped = _is_stop(batch, tok)
  done = stopped | (max_new_tokens <= 1)
  return batch, DecodeState(jnp.int32(1), cache, tok, done, stopped, out_tokens, out_logp, out_valid)


def decode_step(model_cfg: ModelConfig, cfg: SamplingConfig, window: int, params: Any, batch: Batch,
                state: DecodeState) -> DecodeState:
  """DECODE, one step: feed token i - 1 at slot P + i - 1 and draw token i, attending over the first `window` slots
  of the cache (static; it must hold slot P + i - 1). Rows already done write padding."""
  P = batch.prompts.shape[1]
  slots = jnp.arange(batch.kv_mask.shape[1])[None, :]
  i = state.i
  kv_mask = batch.kv_mask | ((slots >= P) & (slots < P + i))
  positions = (batch.prompt_lengths + i - 1)[:, None]
  logits, cache = transformer.forward_cached(
    model_cfg, params, state.prev[:, None], positions, state.cache, P + i - 1, kv_mask, window=window
  )
  tok, logp = sample_token(logits[:, 0], jax.random.fold_in(batch.rng, i), cfg)
  live = ~state.done
  tok = jnp.where(live, tok, cfg.pad_id)
  out_tokens = jax.lax.dynamic_update_slice(state.tokens, tok[:, None], (0, i))
  out_logp = jax.lax.dynamic_update_slice(state.logp, jnp.where(live, logp, 0.0)[:, None], (0, i))
  out_valid = jax.lax.dynamic_update_slice(state.valid, live[:, None], (0, i))
  hit = live & _is_stop(batch, tok)
  stopped = state.stopped | hit
  done = state.done | hit | (i + 1 >= batch.max_new_tokens)
  return DecodeState(i + 1, cache, tok, done, stopped, out_tokens, out_logp, out_valid)


def _generate(
  model_cfg: ModelConfig, cfg: SamplingConfig, params: Any, prompts: jax.Array, prompt_lengths: jax.Array,
  rng: jax.Array, stop_tokens: jax.Array, max_new_tokens: jax.Array,
) -> Rollout:
  B, P = prompts.shape
  N = cfg.max_new_tokens
  batch, state = prefill(model_cfg, cfg, params, prompts, prompt_lengths, rng, stop_tokens, max_new_tokens)

  # DECODE: until every row is done or N tokens are drawn. The steps run in segments of growing attention
  # windows (`decode_windows`), so a step attends over about the filled part of the cache rather than all S slots.
  for window in decode_windows(P, N, cfg.window):
    last = min(N, window - P + 1)  # step i reads slots up to P + i - 1, which must lie in the window

    def cond(state: DecodeState, last: int = last) -> jax.Array:
      return (state.i < last) & ~jnp.all(state.done)

    state = jax.lax.while_loop(cond, functools.partial(decode_step, model_cfg, cfg, window, params, batch), state)

  zeros = jnp.zeros((B, P), bool)
  return Rollout(
    tokens=jnp.concatenate([batch.prompts, state.tokens], axis=1),
    prompt_mask=jnp.concatenate([batch.prompt_mask, jnp.zeros((B, N), bool)], axis=1),
    completion_mask=jnp.concatenate([zeros, state.valid], axis=1),
    logprobs=jnp.concatenate([jnp.zeros((B, P), jnp.float32), state.logp], axis=1),
    lengths=jnp.sum(state.valid, axis=1).astype(jnp.int32),
    finished=state.stopped,
  )


def stop_and_budget(cfg: SamplingConfig, batch: int, stop_tokens: Any, max_new_tokens: Any,
                    mesh: jax.sharding.Mesh | None = None, rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES
                    ) -> tuple[jax.Array, jax.Array]:
  """A generate call's optional stop tokens and budgets as [B, K] and [B] int32 device arrays (defaults from
  `cfg`). Host values (None, lists, numpy) are shaped on the host and placed explicitly, with the batch sharding
  when a mesh is given; device arrays stay where they are."""

  def place(x: Any, shape: tuple[int, ...]) -> jax.Array:
    if isinstance(x, jax.Array):
      return jnp.broadcast_to(x.astype(jnp.int32), shape)
    x = np.ascontiguousarray(np.broadcast_to(np.asarray(x, np.int32), shape))
    return jax.device_put(x) if mesh is None else mesh_lib.put(x, mesh_lib.batch_sharding(mesh, rules, shape))

  if stop_tokens is None:
    stop_tokens = cfg.stop_tokens or (-1,)
  if not isinstance(stop_tokens, jax.Array):
    stop_tokens = np.asarray(stop_tokens, np.int32)
  k = stop_tokens.shape[-1]
  if max_new_tokens is None:
    max_new_tokens = cfg.max_new_tokens
  return place(stop_tokens, (batch, k)), place(max_new_tokens, (batch,))


def jit_generate(model_cfg: ModelConfig, cfg: SamplingConfig, mesh: jax.sharding.Mesh | None = None,
                 rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES) -> Callable[..., Rollout]:
  """The jitted `(params, prompts [B, P], prompt_lengths [B], rng, stop_tokens [B, K], max_new_tokens [B]) -> Rollout`
  that `make_generate_fn` calls; ahead-of-time compilation (rl_lm/aot) lowers it with abstract arguments."""
  return jax.jit(mesh_lib.bind(functools.partial(_generate, model_cfg, cfg), mesh, rules))


def make_generate_fn(
  model_cfg: ModelConfig, cfg: SamplingConfig, mesh: jax.sharding.Mesh | None = None,
  rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES,
) -> Callable[..., Rollout]:
  """A jitted `fn(params, prompts, prompt_lengths, rng, stop_tokens=None, max_new_tokens=None) -> Rollout`.

  stop_tokens: [B, K] or [K] int32 (-1 pads rows with fewer), default `cfg.stop_tokens`.
  max_new_tokens: [B] or scalar, at most `cfg.max_new_tokens`, default that.
  With a mesh, activations (and the KV cache) are placed by the logical-axis rules.
  """
  jitted = jit_generate(model_cfg, cfg, mesh, rules)

  def fn(params, prompts, prompt_lengths, rng, stop_tokens=None, max_new_tokens=None) -> Rollout:
    stop_tokens, max_new_tokens = stop_and_budget(cfg, prompts.shape[0], stop_tokens, max_new_tokens, mesh, rules)
    return jitted(params, prompts, prompt_lengths, rng, stop_tokens, max_new_tokens)

  return fn


@functools.lru_cache(maxsize=32)
def _cached_generate_fn(model_cfg: ModelConfig, cfg: SamplingConfig) -> Callable[..., Rollout]:
  return make_generate_fn(model_cfg, cfg)


def generate(
  model_cfg: ModelConfig, params: Any, prompts: jax.Array, prompt_lengths: jax.Array, rng: jax.Array,
  cfg: SamplingConfig, stop_tokens: Any = None, max_new_tokens: Any = None,
) -> Rollout:
  """Samples completions for right-padded `prompts` [B, P] (one jit per (model, sampling) config).

  Every prompt must hold at least one real token. See the module docstring for the layout.
  """
  return _cached_generate_fn(model_cfg, cfg)(params, prompts, prompt_lengths, rng, stop_tokens, max_new_tokens)


def completion_logprobs(model_cfg: ModelConfig, params: Any, rollout: Rollout, temperature: float = 1.0) -> jax.Array:
  """The trainer's log-probs of a rollout's completion tokens under `params`. -> [B, P + N], 0 off-completion.

  Scores the whole sequence with the trainer's own function (`scoring.score_tokens`) at the sampler's temperature.
  """
  attn = rollout.prompt_mask | rollout.completion_mask
  taken = scoring.score_tokens(model_cfg, params, rollout.tokens, attn, temperature).logp  # [B, P + N]
  return jnp.where(rollout.completion_mask, taken, 0.0)


def config_from(sampling: Any, tok: Any) -> SamplingConfig:
  """`config.sampling` -> SamplingConfig, stopping on the tokenizer's stop ids (eos, the chat template's end of turn)
  and padding with its pad id."""
  return SamplingConfig.from_section(sampling, stop_tokens=tuple(tok.stop_ids), pad_id=tok.pad_id)


def pad_prompts(prompts: list[list[int]], pad_id: int, multiple: int = 1) -> tuple[jax.Array, jax.Array]:
  """Token lists -> right-padded [B, P] int32 and lengths [B]; P rounded up to `multiple` (fewer recompiles)."""
  P = max(len(p) for p in prompts)
  P = -(-P // multiple) * multiple
  out = np.full((len(prompts), P), pad_id, np.int32)
  for i, p in enumerate(prompts):
    out[i, : len(p)] = p
  return jnp.asarray(out), jnp.asarray([len(p) for p in prompts], jnp.int32)
