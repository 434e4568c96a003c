"""The multi-turn driver of the decode engine: the policy's turns of the episodes in R cache rows, on device.

Layout. Each row holds one episode, written left to right from slot 0 of an S-slot buffer (S =
`config.env.max_tokens`): the first observation (the prompt), the policy's first turn, the next observation, and so
on. `fill[r]` slots are real. `sampled[r, t]` marks the policy's tokens (the stop token that ends each turn
included), which train and carry the sampler's log-probs; every other real slot is an observation token, which never
trains. No slot is padding inside an episode, so the trainer scores it with the attention mask `slots < fill` and
positions 0, 1, 2, ... exactly as the sampler ran it (`to_rollout`).

One call (`advance`, one jit per observation width O): the rows given an observation prefill it at their own cache
offset and draw the turn's token 0 from the logits at their last observation token; then the engine's decode loop
draws one token per live row per step, attending over windows of w, 2w, 4w, ... slots, until at most `until_live`
turns are in flight (0: every turn ended, a stop token, its budget or the end of the buffer). A turn that ended goes
into the buffer, and its last token into the cache, so the cache holds the whole episode and the next turn prefills
only its new observation: no re-prefill of the history, nothing re-tokenised. A turn still in flight goes on in the
next call: this is continuous batching over episodes (rl_lm/envs/episodes.py runs the host's side: the
environments, and a row taking the next episode when its own ends, `retire` copying the finished one out). Episode e's
turn t draws its token j from fold_in(fold_in(fold_in(rng, e), t), j), so an episode does not depend on the other
rows, nor on when it ran.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rl_lm import keys as keys_lib
from rl_lm import mesh as mesh_lib
from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.rollout import engine
from rl_lm.rollout.generate import new_cache
from rl_lm.rollout.types import Rollout, SamplingConfig


class EpisodeState(NamedTuple):
  """The device side of the episodes in R cache rows, carried from call to call."""

  cache: transformer.KVCache  # every real slot of every row's episode, written (a turn in flight: up to its last)
  tokens: jax.Array  # [R, S] int32
  sampled: jax.Array  # [R, S] bool: the policy's tokens
  logprobs: jax.Array  # [R, S] float32: sampler log-probs of sampled tokens, 0 elsewhere
  fill: jax.Array  # [R] int32: real slots in the buffer (a turn in flight is not in it yet)
  turn: engine.State  # the turns in flight: the engine's rows, one request per row


class Episodes(NamedTuple):
  """Finished episodes, one row each, in the layout of the module docstring."""

  tokens: jax.Array  # [Q, S] int32
  sampled: jax.Array  # [Q, S] bool
  logprobs: jax.Array  # [Q, S] float32
  fill: jax.Array  # [Q] int32


def init_state(model_cfg: ModelConfig, cfg: SamplingConfig, rows: int, slots: int, turn_tokens: int, stops: int
               ) -> EpisodeState:
  """R = `rows` empty cache rows of `slots` slots, no turn in flight."""
  reqs = engine.Requests(jnp.zeros((rows, 1), jnp.int32), jnp.ones((rows,), jnp.int32),
                         jax.random.split(jax.random.key(0), rows), jnp.full((rows, stops), -1, jnp.int32),
                         jnp.zeros((rows,), jnp.int32))
  cache = new_cache(model_cfg, cfg, rows, slots)
  idle = engine.start(cfg, cache, reqs, turn_tokens, live=jnp.zeros((rows,), bool))
  return EpisodeState(cache, jnp.full((rows, slots), cfg.pad_id, jnp.int32), jnp.zeros((rows, slots), bool),
                      jnp.zeros((rows, slots), jnp.float32), jnp.zeros((rows,), jnp.int32), idle._replace(cache=None))


def init_episodes(cfg: SamplingConfig, episodes: int, slots: int) -> Episodes:
  return Episodes(jnp.full((episodes, slots), cfg.pad_id, jnp.int32), jnp.zeros((episodes, slots), bool),
                  jnp.zeros((episodes, slots), jnp.float32), jnp.zeros((episodes,), jnp.int32))


def retire(state: EpisodeState, out: Episodes, to: jax.Array) -> Episodes:
  """Copies row r's episode into row to[r] of `out` (to[r] = Q: none)."""
  return Episodes(out.tokens.at[to].set(state.tokens, mode="drop"), out.sampled.at[to].set(state.sampled, mode="drop"),
                  out.logprobs.at[to].set(state.logprobs, mode="drop"), out.fill.at[to].set(state.fill, mode="drop"))


def advance(model_cfg: ModelConfig, cfg: SamplingConfig, params: Any, state: EpisodeState, obs: jax.Array,
            obs_len: jax.Array, budget: jax.Array, restart: jax.Array, episode: jax.Array, turn: jax.Array,
            rng: jax.Array, stop_tokens: jax.Array, until_live: jax.Array) -> tuple[EpisodeState, jax.Array, jax.Array]:
  """Starts a turn in the rows given an observation, then decodes until at most `until_live` ([] int32; 0: none)
  turns are in flight.

  obs [R, O], obs_len [R]: row r's next observation (obs_len 0: none; the row's turn in flight, if any, goes on).
  budget [R]: the new turn's token budget. restart [R] bool: the row starts a new episode (its buffer is emptied
  first). episode [R], turn [R] int32: the row's episode and turn number, whose key draws the turn's token j as
  fold_in(fold_in(fold_in(rng, episode), turn), j). stop_tokens [R, K].
  -> (state, ended [R]: a turn ended in this call, its tokens now in the buffer; stopped [R]: on a stop token).
  """
  cache, tokens, sampled, logprobs, fill, run = state
  R, O = obs.shape  # noqa: E741 -- O: the observation width, as in the shape comments
  S, N = tokens.shape[1], run.tokens.shape[1]
  rows, slots = jnp.arange(R), jnp.arange(S)[None, :]
  rng = keys_lib.as_key(rng)
  # A new episode: an empty buffer.
  fill = jnp.where(restart, 0, fill)
  tokens = jnp.where(restart[:, None], cfg.pad_id, tokens)
  sampled = sampled & ~restart[:, None]
  logprobs = jnp.where(restart[:, None], 0.0, logprobs)
  # The observations into the buffer.
  obs_len = jnp.minimum(obs_len, S - fill)
  starting = (obs_len > 0) & (budget > 0)
  obs_len = jnp.where(starting, obs_len, 0)
  end = fill + obs_len  # the slot of the new turn's token 0
  at = fill[:, None] + jnp.arange(O)[None, :]  # [R, O]
  real = jnp.arange(O)[None, :] < obs_len[:, None]
  tokens = tokens.at[rows[:, None], jnp.where(real, at, S)].set(obs, mode="drop")  # slot S: dropped

  keys = jax.vmap(lambda e, t: jax.random.fold_in(jax.random.fold_in(rng, e), t))(episode, turn)
  reqs = engine.Requests(obs, obs_len, keys, stop_tokens, jnp.minimum(budget, N))
  fresh = lambda new, old: jnp.where(starting[:, None] if old.ndim == 2 else starting, new, old)  # noqa: E731
  run = run._replace(
    cache=cache, request=jnp.where(starting, jnp.where(end < S, rows, -1), run.request),
    start=jnp.where(starting, 0, run.start), prompt_end=jnp.where(starting, end, run.prompt_end),
    tokens=fresh(cfg.pad_id, run.tokens), logp=fresh(0.0, run.logp), valid=fresh(False, run.valid),
    stopped=fresh(False, run.stopped), queued=jnp.int32(R))
  # PREFILL the observations at each starting row's own offset; DECODE.
  run = engine.prefill(model_cfg, cfg, params, reqs, run, obs, jnp.where(starting, fill, S), obs_len - 1,
                       slots < end[:, None], rows=starting)
  run = engine.decode(model_cfg, cfg, params, reqs, run, engine.windows(0, S, cfg.window), until_live=until_live)
  fill = jnp.where(starting, end, fill)

  # The turns that ended into the buffer, after their observations.
  ended = (run.request < 0) & jnp.any(run.valid, axis=1)
  col = jnp.where(run.valid & ended[:, None], run.prompt_end[:, None] + jnp.arange(N)[None, :], S)  # [R, N]
  tokens = tokens.at[rows[:, None], col].set(run.tokens, mode="drop")
  sampled = sampled.at[rows[:, None], col].set(True, mode="drop")
  logprobs = logprobs.at[rows[:, None], col].set(run.logp, mode="drop")
  fill = jnp.where(ended, run.prompt_end + jnp.sum(run.valid, axis=1).astype(jnp.int32), fill)
  # Their last token into the cache, so the next observation attends to the whole episode.
  pos = jnp.maximum(fill - 1, 0)
  _, cache = transformer.forward_cached(model_cfg, params, tokens[rows, pos][:, None], pos[:, None], run.cache,
                                        jnp.where(ended, pos, S), slots <= pos[:, None])
  stopped = run.stopped
  run = run._replace(cache=None, valid=run.valid & ~ended[:, None])  # handed over: not ended again
  return EpisodeState(cache, tokens, sampled, logprobs, fill, run), ended, stopped


def make_advance_fn(model_cfg: ModelConfig, cfg: SamplingConfig, mesh: jax.sharding.Mesh | None = None,
                    rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES
                    ) -> Callable[..., tuple[EpisodeState, jax.Array, jax.Array]]:
  """jit(params, state, obs, obs_len, budget, restart, episode, turn, rng, stop_tokens, until_live) ->
  (state, ended, stopped) (`advance`), the state donated (its cache is written in place)."""
  fn = functools.partial(advance, model_cfg, cfg)
  return jax.jit(mesh_lib.bind(fn, mesh, rules), donate_argnums=(1,))


def to_rollout(state: Episodes, finished: jax.Array) -> Rollout:
  """The episodes as the RL step's `Rollout`: observation tokens as the prompt mask, the policy's tokens as the
  completion mask (see the module docstring)."""
  real = jnp.arange(state.tokens.shape[1])[None, :] < state.fill[:, None]
  return Rollout(tokens=state.tokens, prompt_mask=real & ~state.sampled, completion_mask=state.sampled,
                 logprobs=jnp.where(state.sampled, state.logprobs, 0.0),
                 lengths=jnp.sum(state.sampled, axis=1).astype(jnp.int32), finished=finished)
