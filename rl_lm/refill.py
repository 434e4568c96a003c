"""Continuous batching: a fixed number of cache slots that take the next queued prompt as soon as a row stops.

A static batch decodes until its longest row stops, so with long-tailed completion lengths most slots spend
most steps on padding. Here Q prompts share `slots` rows of one KV cache inside one `lax.while_loop`. Each
step runs one token per slot through `transformer.forward_cached` with a per-row cache index:
- a slot still reading its prompt feeds the next prompt token (prefill, one token a step, batched with the
  other slots' decoding);
- a slot past its prompt feeds the token it drew.
When a slot's row stops (a stop token, or its budget), the slot starts the next queued prompt at cache slot 0.
Its old entries need no clearing: the row's attention mask covers slots [0, t] only.

The result is the same `sampling.Rollout` as a static batch, one row per prompt, in the same layout (prompt
right-aligned in the first P slots, completion from slot P). Positions and visible tokens are the same, so the
log-probs are the trainer's and greedy decoding gives the static batch's tokens. Random draws come from
fold_in(fold_in(rng, prompt), token index), so a prompt's sample does not depend on which prompts share
its slots or when it started.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rl_lm import keys as keys_lib
from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig


class Queue(NamedTuple):
  """The prompts of one call, served in order, and their settings."""

  prompts: jax.Array  # [Q, P] int32, right-padded
  prompt_lengths: jax.Array  # [Q] int32
  rng: jax.Array  # prompt q's token j is drawn with fold_in(fold_in(rng, q), j)
  stop_tokens: jax.Array  # [Q, K] int32
  max_new_tokens: jax.Array  # [Q] int32


def start(model_cfg: ModelConfig, cfg: sampling.SamplingConfig, slots: int, queue: Queue) -> dict[str, Any]:
  """The loop state before the first step: the first min(slots, Q) prompts in the slots, an empty cache.

  Slot state: the prompt it serves (q, -1: idle), the cache slot of the token it feeds this step (t), that token
  (cur); the queue's next prompt (next_q); the results so far, one row per prompt (tokens, logp, valid, stopped)."""
  Q, P = queue.prompts.shape
  N, B = cfg.max_new_tokens, min(slots, Q)
  cache_dtype = jnp.dtype(cfg.cache_dtype) if cfg.cache_dtype else model_cfg.compute_dtype
  cache = transformer.init_cache(model_cfg, B, P + N, cache_dtype)
  first = jnp.arange(B, dtype=jnp.int32)
  return dict(
    q=first, t=jnp.zeros((B,), jnp.int32), cur=queue.prompts[first, 0], next_q=jnp.int32(B), cache=cache,
    tokens=jnp.full((Q, N), cfg.pad_id, jnp.int32), logp=jnp.zeros((Q, N), jnp.float32),
    valid=jnp.zeros((Q, N), bool), stopped=jnp.zeros((Q,), bool),
  )


def step(model_cfg: ModelConfig, cfg: sampling.SamplingConfig, params: Any, queue: Queue, state: dict[str, Any]
         ) -> dict[str, Any]:
  """One token through every slot (a prompt token or the token it drew), then the slots whose rows ended refill."""
  Q, P = queue.prompts.shape
  prompts, prompt_lengths, rng = queue.prompts, queue.prompt_lengths, queue.rng
  cache_slots = jnp.arange(P + cfg.max_new_tokens)[None, :]
  q, t = state["q"], state["t"]
  active = q >= 0
  qs = jnp.maximum(q, 0)
  length = prompt_lengths[qs]
  kv_mask = (cache_slots <= t[:, None]) & active[:, None]  # [B, S]: the row's tokens so far, this one included
  logits, cache = transformer.forward_cached(model_cfg, params, state["cur"][:, None], t[:, None], state["cache"],
                                             t, kv_mask)
  j = t + 1 - length  # completion index of the token these logits draw (< 0: still in the prompt)
  drawing = active & (j >= 0)
  keys = jax.vmap(lambda qq, jj: jax.random.fold_in(jax.random.fold_in(rng, qq), jj))(qs, jnp.maximum(j, 0))
  tok, logp = sampling.sample_token(logits[:, 0], None, cfg, row_keys=keys)
  at_q, at_j = jnp.where(drawing, qs, Q), jnp.maximum(j, 0)  # row Q is out of range: dropped
  hit = jnp.any(tok[:, None] == queue.stop_tokens[qs], axis=-1)
  ends = drawing & (hit | (j + 1 >= queue.max_new_tokens[qs]))
  new = dict(
    tokens=state["tokens"].at[at_q, at_j].set(tok, mode="drop"),
    logp=state["logp"].at[at_q, at_j].set(logp, mode="drop"),
    valid=state["valid"].at[at_q, at_j].set(True, mode="drop"),
    stopped=state["stopped"].at[jnp.where(ends, qs, Q)].set(hit, mode="drop"),
  )
  prompt_next = prompts[qs, jnp.minimum(t + 1, P - 1)]
  cur = jnp.where(drawing, tok, prompt_next)
  # Refill: every slot whose row just ended takes the next queued prompt, in slot order.
  rank = jnp.cumsum(ends.astype(jnp.int32)) - 1
  take = ends & (state["next_q"] + rank < Q)
  new_q = jnp.where(take, state["next_q"] + rank, jnp.where(ends, -1, q))
  return dict(
    q=new_q, t=jnp.where(take, 0, t + 1), cur=jnp.where(take, prompts[jnp.minimum(new_q, Q - 1), 0], cur),
    next_q=state["next_q"] + jnp.sum(take).astype(jnp.int32), cache=cache, **new,
  )


def _generate(
  model_cfg: ModelConfig, cfg: sampling.SamplingConfig, slots: int, params: Any, prompts: jax.Array,
  prompt_lengths: jax.Array, rng: jax.Array, stop_tokens: jax.Array, max_new_tokens: jax.Array,
) -> sampling.Rollout:
  Q, P = prompts.shape
  N = cfg.max_new_tokens
  queue = Queue(prompts.astype(jnp.int32), prompt_lengths.astype(jnp.int32), keys_lib.as_key(rng), stop_tokens,
                max_new_tokens)
  state = start(model_cfg, cfg, slots, queue)
  state = jax.lax.while_loop(lambda state: jnp.any(state["q"] >= 0),
                             functools.partial(step, model_cfg, cfg, params, queue), state)
  aligned, prompt_mask = sampling.right_align(queue.prompts, queue.prompt_lengths)
  zeros = jnp.zeros((Q, P), bool)
  return sampling.Rollout(
    tokens=jnp.concatenate([aligned, state["tokens"]], axis=1),
    prompt_mask=jnp.concatenate([prompt_mask, jnp.zeros((Q, N), bool)], axis=1),
    completion_mask=jnp.concatenate([zeros, state["valid"]], axis=1),
    logprobs=jnp.concatenate([jnp.zeros((Q, P), jnp.float32), state["logp"]], axis=1),
    lengths=jnp.sum(state["valid"], axis=1).astype(jnp.int32),
    finished=state["stopped"],
  )


def jit_generate(model_cfg: ModelConfig, cfg: sampling.SamplingConfig, slots: int,
                 mesh: jax.sharding.Mesh | None = None, rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES
                 ) -> Callable[..., sampling.Rollout]:
  """`sampling.jit_generate` with `slots` cache rows shared by the prompts in turn (what `make_generate_fn` calls)."""
  if slots < 1:
    raise ValueError(f"slots must be positive, got {slots}")
  return jax.jit(mesh_lib.bind(functools.partial(_generate, model_cfg, cfg, slots), mesh, rules))


def make_generate_fn(
  model_cfg: ModelConfig, cfg: sampling.SamplingConfig, slots: int, mesh: jax.sharding.Mesh | None = None,
  rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES,
) -> Callable[..., sampling.Rollout]:
  """`sampling.make_generate_fn`'s signature and result, with `slots` cache rows shared by the prompts in turn:
  `fn(params, prompts [Q, P], prompt_lengths [Q], rng, stop_tokens=None, max_new_tokens=None) -> Rollout [Q]`."""
  jitted = jit_generate(model_cfg, cfg, slots, mesh, rules)

  def fn(params, prompts, prompt_lengths, rng, stop_tokens=None, max_new_tokens=None) -> sampling.Rollout:
    stop_tokens, max_new_tokens = sampling.stop_and_budget(cfg, prompts.shape[0], stop_tokens, max_new_tokens,
                                                           mesh, rules)
    return jitted(params, prompts, prompt_lengths, rng, stop_tokens, max_new_tokens)

  return fn


def generate_fn(
  model_cfg: ModelConfig, cfg: sampling.SamplingConfig, mesh: jax.sharding.Mesh | None = None,
  rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES,
) -> Callable[..., sampling.Rollout]:
  """The sampler `config.sampling` asks for: continuous batching over `cfg.slots` rows, or (slots 0) the static
  batch of `sampling.make_generate_fn`. The same call and result either way."""
  if cfg.slots:
    return make_generate_fn(model_cfg, cfg, cfg.slots, mesh, rules)
  return sampling.make_generate_fn(model_cfg, cfg, mesh, rules)
