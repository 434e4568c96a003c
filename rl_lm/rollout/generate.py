"""Two drivers of the decode engine for single-turn prompts: the static batch and continuous batching.

Both take right-padded prompts [Q, P] and return the same `Rollout` (layout: `rl_lm.rollout.types`), draw the same
tokens for the same key (`rl_lm.rollout.engine`: request q's token j from fold_in(fold_in(rng, q), j)), and run the
engine's one decode loop.
- Static (`slots` 0): all Q prompts prefilled at once, right-aligned so every completion starts at slot P, then
  decoded in lockstep until the longest row ends.
- Continuous batching (`slots` > 0): `slots` cache rows read the prompts one token a step, batched with the other
  rows' decoding, and a row whose prompt ended takes the next queued one. With long-tailed completion lengths a
  static batch spends most of its steps on padding; this spends them on queued prompts.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rl_lm import keys as keys_lib
from rl_lm import mesh as mesh_lib
from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.rollout import engine
from rl_lm.rollout.types import Rollout, SamplingConfig


def right_align(prompts: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Right-padded prompts [B, P] -> the same prompts pushed to the right edge, and their mask."""
  P = prompts.shape[1]
  src = jnp.arange(P)[None, :] - (P - lengths)[:, None]  # [B, P]
  valid = src >= 0
  aligned = jnp.take_along_axis(prompts, jnp.maximum(src, 0), axis=1)
  return jnp.where(valid, aligned, 0), valid


def requests(prompts: jax.Array, lengths: jax.Array, rng: jax.Array, stop_tokens: jax.Array,
             max_new_tokens: jax.Array) -> engine.Requests:
  """A call's prompts [Q, P] as the engine's requests, request q drawing from fold_in(rng, q)."""
  rng = keys_lib.as_key(rng)
  Q = prompts.shape[0]
  keys = jax.vmap(lambda q: jax.random.fold_in(rng, q))(jnp.arange(Q))
  return engine.Requests(prompts.astype(jnp.int32), lengths.astype(jnp.int32), keys, stop_tokens, max_new_tokens)


def new_cache(model_cfg: ModelConfig, cfg: SamplingConfig, rows: int, length: int) -> transformer.KVCache:
  """An empty cache of `rows` rows and `length` slots, in `cfg`'s dtype and key layout."""
  dtype = jnp.dtype(cfg.cache_dtype) if cfg.cache_dtype else model_cfg.compute_dtype
  return transformer.init_cache(model_cfg, rows, length, dtype, transformer.keys_by_slot(cfg.key_layout))


def prefill(model_cfg: ModelConfig, cfg: SamplingConfig, params: Any, prompts: jax.Array, prompt_lengths: jax.Array,
            rng: jax.Array, stop_tokens: jax.Array, max_new_tokens: jax.Array
            ) -> tuple[engine.Requests, engine.State]:
  """The static batch's PREFILL: every prompt right-aligned in slots [0, P) of a fresh cache, token 0 drawn from the
  last slot's logits. -> the engine's requests (the aligned prompts) and state, each row feeding token 0 at P."""
  B, P = prompts.shape
  N = cfg.max_new_tokens
  lengths = prompt_lengths.astype(jnp.int32)
  aligned, prompt_mask = right_align(prompts.astype(jnp.int32), lengths)
  aligned = mesh_lib.constrain(aligned, ("batch", "length"))
  reqs = requests(aligned, lengths, rng, stop_tokens, max_new_tokens)
  state = engine.start(cfg, new_cache(model_cfg, cfg, B, P + N), reqs, N)
  state = state._replace(start=P - lengths, prompt_end=jnp.full((B,), P, jnp.int32))
  kv_mask = jnp.concatenate([prompt_mask, jnp.zeros((B, N), bool)], axis=1)  # [B, P + N]
  return reqs, engine.prefill(model_cfg, cfg, params, reqs, state, aligned, jnp.int32(0),
                              jnp.full((B,), P - 1, jnp.int32), kv_mask, window=P, lockstep=True)


def _rollout(cfg: SamplingConfig, prompts: jax.Array, lengths: jax.Array, state: engine.State) -> Rollout:
  """The engine's results as a `Rollout` of right-padded prompts [Q, P] (aligned here)."""
  Q, P = prompts.shape
  N = cfg.max_new_tokens
  aligned, prompt_mask = right_align(prompts.astype(jnp.int32), lengths.astype(jnp.int32))
  zeros = jnp.zeros((Q, P), bool)
  return Rollout(
    tokens=jnp.concatenate([aligned, state.tokens], axis=1),
    prompt_mask=jnp.concatenate([prompt_mask, jnp.zeros((Q, N), bool)], axis=1),
    completion_mask=jnp.concatenate([zeros, state.valid], axis=1),
    logprobs=jnp.concatenate([jnp.zeros((Q, P), jnp.float32), state.logp], axis=1),
    lengths=jnp.sum(state.valid, axis=1).astype(jnp.int32),
    finished=state.stopped,
  )


def static(model_cfg: ModelConfig, cfg: SamplingConfig, params: Any, prompts: jax.Array, prompt_lengths: jax.Array,
           rng: jax.Array, stop_tokens: jax.Array, max_new_tokens: jax.Array) -> Rollout:
  """The static batch: prefill, then decode in lockstep until every row ended (P + w, P + 2w, ... windows)."""
  P = prompts.shape[1]
  reqs, state = prefill(model_cfg, cfg, params, prompts, prompt_lengths, rng, stop_tokens, max_new_tokens)
  segments = engine.windows(P, P + cfg.max_new_tokens, cfg.window)
  state = engine.decode(model_cfg, cfg, params, reqs, state, segments, lockstep=True)
  return _rollout(cfg, prompts, prompt_lengths, state)


def start_queue(model_cfg: ModelConfig, cfg: SamplingConfig, slots: int, prompts: jax.Array,
                prompt_lengths: jax.Array, rng: jax.Array, stop_tokens: jax.Array, max_new_tokens: jax.Array
                ) -> tuple[engine.Requests, engine.State]:
  """Continuous batching's first state: the first min(slots, Q) prompts in the rows, an empty cache."""
  Q, P = prompts.shape
  reqs = requests(prompts, prompt_lengths, rng, stop_tokens, max_new_tokens)
  cache = new_cache(model_cfg, cfg, min(slots, Q), P + cfg.max_new_tokens)
  return reqs, engine.start(cfg, cache, reqs, cfg.max_new_tokens)


def continuous(model_cfg: ModelConfig, cfg: SamplingConfig, slots: int, params: Any, prompts: jax.Array,
               prompt_lengths: jax.Array, rng: jax.Array, stop_tokens: jax.Array, max_new_tokens: jax.Array
               ) -> Rollout:
  """Continuous batching over `slots` cache rows: the same call and result as `static`."""
  reqs, state = start_queue(model_cfg, cfg, slots, prompts, prompt_lengths, rng, stop_tokens, max_new_tokens)
  segments = engine.windows(0, prompts.shape[1] + cfg.max_new_tokens, cfg.window)
  return _rollout(cfg, prompts, prompt_lengths, engine.decode(model_cfg, cfg, params, reqs, state, segments))


def jit_generate(model_cfg: ModelConfig, cfg: SamplingConfig, mesh: jax.sharding.Mesh | None = None,
                 rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES, slots: int | None = None) -> Any:
  """The jitted `(params, prompts [Q, P], prompt_lengths [Q], rng, stop_tokens [Q, K], max_new_tokens [Q]) ->
  Rollout` of the driver `slots` asks for (default `cfg.slots`; 0: the static batch). Ahead-of-time compilation
  (rl_lm/aot) lowers it with abstract arguments."""
  slots = cfg.slots if slots is None else slots
  if slots < 0:
    raise ValueError(f"slots must be >= 0, got {slots}")
  fn = functools.partial(continuous, model_cfg, cfg, slots) if slots else functools.partial(static, model_cfg, cfg)
  return jax.jit(mesh_lib.bind(fn, mesh, rules))
