"""The decode engine: one jitted decode step on a named state, and the one `lax.while_loop` that runs it.

Every sampler in rl_lm is a driver of this loop: the static batch and continuous batching
(`rl_lm.rollout.generate`), and the policy's turns of multi-turn episodes (`rl_lm.rollout.turns`).

The model. R cache rows serve Q requests (a prompt, or an episode's turn), each to at most `budgets[q]` drawn
tokens. A row reads its request's sequence in cache slots [start, ...): slot s holds rotary position s - start,
and a token at slot s attends to slots [start, s]. One step feeds one token per row at the row's own slot
(`State.slot`): a prompt token while the row still reads its prompt, else the token it drew last. The logits of
the slot just before `prompt_end` draw the request's token 0, the next slot's token 1, and so on: token j is drawn
at slot prompt_end - 1 + j and fed at prompt_end + j.
- Static batch: R = Q; prefilled in one chunk (`prefill`); every row at the same slot (`lockstep`: the cache
  written at one index with a dynamic slice, not a scatter).
- Continuous batching: Q > R; the prompt read one token a step beside the other rows' decoding; a row whose
  request ends takes the next queued request at slot 0 (its old entries need no clearing: attention reads [0, s]).
- Multi-turn: R = Q = episodes; each row's observation prefilled at its own offset, its turn decoded after it.

Windows. The loop runs in segments whose attention reads only the first w, 2w, 4w, ... cache slots
(`windows`): a segment ends when a live row's next slot would fall outside its window, so a step costs about
what the filled part of the cache costs, in every driver.

Random draws. Request q's token j is drawn with fold_in(keys[q], j): a request's sample does not depend on which
rows share its batch, when it started or which row served it, so the static batch and continuous batching draw
the same tokens.

Results. Request q's tokens, their sampler log-probs and a valid mask, [Q, N] from column 0, and whether it ended
on a stop token (else its budget or the cache's end cut it).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.rollout import draw
from rl_lm.rollout.types import SamplingConfig


class Requests(NamedTuple):
  """What one call decodes, in the order the requests are served; read by every step, never written."""

  prompts: jax.Array  # [Q, P] int32: the tokens a row reads before it draws (continuous batching), from slot 0
  lengths: jax.Array  # [Q] int32: real tokens of each prompt
  keys: jax.Array  # [Q] typed keys: request q draws its token j with fold_in(keys[q], j)
  stop_tokens: jax.Array  # [Q, K] int32: a drawn stop token ends the request (kept); -1 pads
  budgets: jax.Array  # [Q] int32: at most this many tokens drawn


class State(NamedTuple):
  """The loop's carry: R cache rows and the results of Q requests."""

  cache: transformer.KVCache  # keys [L, R, K, Dh, S] (or by slot), values [L, R, K, S, Dh], written in place
  request: jax.Array  # [R] int32: the request the row serves; -1: idle (its writes are dropped)
  start: jax.Array  # [R] int32: the cache slot of the request's first token (position 0)
  prompt_end: jax.Array  # [R] int32: the slot after the request's prompt (its token 0 is fed there)
  slot: jax.Array  # [R] int32: the cache slot of the token the row feeds next
  fed: jax.Array  # [R] int32: that token
  queued: jax.Array  # [] int32: the next request to start (Q: none left)
  tokens: jax.Array  # [Q, N] int32: drawn tokens, pad_id after a request's end
  logp: jax.Array  # [Q, N] float32: their sampler log-probs, 0 after the end
  valid: jax.Array  # [Q, N] bool: drawn
  stopped: jax.Array  # [Q] bool: ended on a stop token


def windows(first: int, end: int, smallest: int) -> tuple[int, ...]:
  """The attention windows of the decode segments: first + w, first + 2w, first + 4w, ... slots (w = `smallest`),
  the last one the whole cache (`end` slots). A step attends over at most twice the slots filled after `first`."""
  out, c = [], smallest
  while first + c < end:
    out.append(first + c)
    c *= 2
  return (*out, end)


def start(cfg: SamplingConfig, cache: transformer.KVCache, requests: Requests, new_tokens: int,
          live: jax.Array | None = None) -> State:
  """The state before the first step: row r serves request r (R <= Q rows; `live` [R] False: idle from the start),
  reading its prompt from slot 0; requests R.. are queued. Drivers that prefill set the slots after (`prefill`)."""
  R, Q = cache.v.shape[1], requests.prompts.shape[0]
  rows = jnp.arange(R, dtype=jnp.int32)
  request = rows if live is None else jnp.where(live, rows, -1)
  zeros = jnp.zeros((R,), jnp.int32)
  return State(
    cache=cache, request=request, start=zeros, prompt_end=requests.lengths[:R], slot=zeros,
    fed=requests.prompts[:R, 0], queued=jnp.int32(R),
    tokens=jnp.full((Q, new_tokens), cfg.pad_id, jnp.int32), logp=jnp.zeros((Q, new_tokens), jnp.float32),
    valid=jnp.zeros((Q, new_tokens), bool), stopped=jnp.zeros((Q,), bool),
  )


def _draw(cfg: SamplingConfig, requests: Requests, state: State, logits: jax.Array, slot: jax.Array, lockstep: bool,
          rows: jax.Array | None = None) -> tuple[State, jax.Array, jax.Array, jax.Array]:
  """Draws from logits [R, V] at each row's `slot` [R]; records the drawing rows' tokens (of `rows` [R] bool only,
  when given). -> (state with the results written, drawn tokens [R], drawing [R], ended [R]: the request drew its
  last token).

  `lockstep` (row r serves request r, every row at one slot): the results are written as one column with a dynamic
  slice instead of a scatter (which TPU's cost model cannot estimate)."""
  Q, S = requests.prompts.shape[0], state.cache.v.shape[3]
  q = jnp.maximum(state.request, 0)
  j = slot + 1 - state.prompt_end  # the token index these logits draw (< 0: the row still reads its prompt)
  drawing = (state.request >= 0) & (j >= 0)
  if rows is not None:
    drawing = drawing & rows
  j = jnp.maximum(j, 0)
  if lockstep:  # row r serves request r: its own entries, no gathers
    keys, stop_tokens, budgets = requests.keys, requests.stop_tokens, requests.budgets
  else:
    keys, stop_tokens, budgets = requests.keys[q], requests.stop_tokens[q], requests.budgets[q]
  row_keys = jax.vmap(jax.random.fold_in)(keys, j)
  tok, logp = draw.sample_token(logits, None, cfg, row_keys=row_keys)
  hit = drawing & jnp.any(tok[:, None] == stop_tokens, axis=-1)
  ended = drawing & (hit | (j + 1 >= budgets) | (slot + 2 >= S))  # S: the drawn token must fit
  if lockstep:
    col = (0, jnp.max(j))
    return state._replace(
      tokens=jax.lax.dynamic_update_slice(state.tokens, jnp.where(drawing, tok, cfg.pad_id)[:, None], col),
      logp=jax.lax.dynamic_update_slice(state.logp, jnp.where(drawing, logp, 0.0)[:, None], col),
      valid=jax.lax.dynamic_update_slice(state.valid, drawing[:, None], col),
      stopped=state.stopped | hit,
    ), tok, drawing, ended
  at_q = jnp.where(drawing, q, Q)  # row Q is out of range: the write is dropped
  state = state._replace(
    tokens=state.tokens.at[at_q, j].set(tok, mode="drop"),
    logp=state.logp.at[at_q, j].set(logp, mode="drop"),
    valid=state.valid.at[at_q, j].set(True, mode="drop"),
    stopped=state.stopped.at[jnp.where(ended, q, Q)].set(hit, mode="drop"),
  )
  return state, tok, drawing, ended


def prefill(model_cfg: ModelConfig, cfg: SamplingConfig, params: Any, requests: Requests, state: State,
            chunk: jax.Array, index: jax.Array, take: jax.Array, kv_mask: jax.Array, window: int | None = None,
            lockstep: bool = False, rows: jax.Array | None = None) -> State:
  """Feeds each row a chunk [R, T] of its prompt at cache slots index.. (scalar or [R]; positions from `start`),
  draws token 0 from the logits at chunk position take[r] (the slot prompt_end - 1), and leaves the row feeding it
  at prompt_end. kv_mask [R, S]: the slots the chunk attends to (its own included). `rows` [R] bool: only these
  rows start (the others, mid-request, keep their state; their `index` must lie past the cache: nothing written)."""
  T = chunk.shape[1]
  at = jnp.asarray(index)[..., None] + jnp.arange(T)  # [R, T] or [T]
  positions = jnp.maximum(jnp.broadcast_to(at, chunk.shape) - state.start[:, None], 0)  # < 0: padding, unread
  logits, cache = transformer.forward_cached(model_cfg, params, chunk, positions, state.cache, index, kv_mask,
                                             window=window, take=take)
  state, tok, _, ended = _draw(cfg, requests, state._replace(cache=cache), logits[:, 0], state.prompt_end - 1,
                               lockstep, rows)
  return _replace_rows(rows, state._replace(request=jnp.where(ended, -1, state.request), slot=state.prompt_end,
                                            fed=tok), state)


def _replace_rows(rows: jax.Array | None, new: State, old: State) -> State:
  """`new`'s per-row fields for `rows` (all when None), `old`'s for the others; results and cache from `new`."""
  if rows is None:
    return new
  pick = lambda a, b: jnp.where(rows, a, b)  # noqa: E731
  return new._replace(request=pick(new.request, old.request), start=pick(new.start, old.start),
                      prompt_end=pick(new.prompt_end, old.prompt_end), slot=pick(new.slot, old.slot),
                      fed=pick(new.fed, old.fed))


def step(model_cfg: ModelConfig, cfg: SamplingConfig, window: int, lockstep: bool, params: Any,
         requests: Requests, state: State) -> State:
  """DECODE, one step: every row feeds its token at its slot (attending over the first `window` cache slots) and
  draws the next, or reads its prompt's next token; a row whose request ended takes the next queued one."""
  Q, P = requests.prompts.shape
  S = state.cache.v.shape[3]
  live = state.request >= 0
  slots = jnp.arange(S)[None, :]
  kv_mask = live[:, None] & (slots >= state.start[:, None]) & (slots <= state.slot[:, None])  # [R, S]
  index = jnp.max(state.slot) if lockstep else jnp.where(live, state.slot, S)  # S: out of range, not written
  logits, cache = transformer.forward_cached(model_cfg, params, state.fed[:, None], (state.slot - state.start)[:, None],
                                             state.cache, index, kv_mask, window=window)
  state, tok, drawing, ended = _draw(cfg, requests, state._replace(cache=cache), logits[:, 0], state.slot, lockstep)
  if lockstep:  # the static batch: every row draws from its first step on, and there is no queue to take from
    return state._replace(request=jnp.where(ended, -1, state.request), slot=state.slot + 1, fed=tok)
  q = jnp.maximum(state.request, 0)
  fed = jnp.where(drawing, tok, requests.prompts[q, jnp.clip(state.slot + 1 - state.start, 0, P - 1)])
  # A row whose request ended takes the next queued request, in row order.
  rank = jnp.cumsum(ended.astype(jnp.int32)) - 1
  take = ended & (state.queued + rank < Q)
  request = jnp.where(take, state.queued + rank, jnp.where(ended, -1, state.request))
  new = jnp.clip(request, 0, Q - 1)
  return state._replace(
    request=request, start=jnp.where(take, 0, state.start),
    prompt_end=jnp.where(take, requests.lengths[new], state.prompt_end),
    slot=jnp.where(take, 0, state.slot + 1), fed=jnp.where(take, requests.prompts[new, 0], fed),
    queued=state.queued + jnp.sum(take).astype(jnp.int32),
  )


def decode(model_cfg: ModelConfig, cfg: SamplingConfig, params: Any, requests: Requests, state: State,
           segments: tuple[int, ...], lockstep: bool = False, until_live: int = 0) -> State:
  """Steps until at most `until_live` rows are live (0: every row idle): the windows of `segments` in turn
  (`windows`), each segment while every live row's slot lies inside its window. The only loop in rl_lm that decodes
  tokens."""
  for window in segments:

    def cond(state: State, window: int = window) -> jax.Array:
      live = state.request >= 0
      return (jnp.sum(live) > until_live) & jnp.all(jnp.where(live, state.slot, 0) < window)

    body = functools.partial(step, model_cfg, cfg, window, lockstep, params, requests)
    state = jax.lax.while_loop(cond, body, state)
  return state
