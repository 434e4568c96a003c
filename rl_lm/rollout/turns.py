"""The multi-turn driver of the decode engine: one policy turn of a batch of episodes, on device.

Layout. Each row is one episode, written left to right from slot 0 of an S-slot buffer (S = `config.env.max_tokens`):
the first observation (the prompt), the policy's first turn, the next observation, and so on. `fill[b]` slots are
real. `sampled[b, t]` marks the policy's tokens (the stop token that ends each turn included), which train and carry
the sampler's log-probs; every other real slot is an observation token, which never trains. No slot is padding inside
an episode, so the trainer scores the row with the attention mask `slots < fill` and positions 0, 1, 2, ... exactly
as the sampler ran it (`to_rollout`).

A turn (`turn`, one jit per observation width O): the rows' observation chunks [B, O] are prefilled at each row's own
cache offset, token 0 of the turn drawn from the logits at each row's last observation token, then the engine's decode
loop draws until every row stopped (a stop token, its turn budget, or the end of the buffer), attending over windows
of w, 2w, 4w, ... slots. A last step feeds each row's final token, so the cache holds the whole episode and the next
turn prefills only its new observation: no re-prefill of the history, nothing re-tokenised. Turn t of a batch draws
row b's token j from fold_in(fold_in(fold_in(rng, t), b), j) (the caller folds t), so a row's episode does not depend
on the other rows' lengths.
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
  """The device side of a batch of episodes, carried across turns."""

  cache: transformer.KVCache  # every real slot of every episode, written
  tokens: jax.Array  # [B, S] int32
  sampled: jax.Array  # [B, S] bool: the policy's tokens
  logprobs: jax.Array  # [B, S] float32: sampler log-probs of sampled tokens, 0 elsewhere
  fill: jax.Array  # [B] int32: real slots


def init_state(model_cfg: ModelConfig, cfg: SamplingConfig, rows: int, slots: int) -> EpisodeState:
  return EpisodeState(new_cache(model_cfg, cfg, rows, slots), jnp.full((rows, slots), cfg.pad_id, jnp.int32),
                      jnp.zeros((rows, slots), bool), jnp.zeros((rows, slots), jnp.float32),
                      jnp.zeros((rows,), jnp.int32))


def turn(model_cfg: ModelConfig, cfg: SamplingConfig, turn_tokens: int, params: Any, state: EpisodeState,
         obs: jax.Array, obs_len: jax.Array, budget: jax.Array, rng: jax.Array, stop_tokens: jax.Array
         ) -> tuple[EpisodeState, jax.Array]:
  """Appends each row's observation obs[b, :obs_len[b]] and samples the policy's turn, at most
  min(budget[b], turn_tokens) tokens (rows with obs_len 0 or budget 0 sit the turn out).
  -> (state, stopped [B]: the turn ended on a stop token)."""
  cache, tokens, sampled, logprobs, fill = state
  B, O = obs.shape  # noqa: E741 -- O: the observation width, as in the shape comments
  S, N = tokens.shape[1], turn_tokens
  rows, slots = jnp.arange(B), jnp.arange(S)[None, :]
  rng = keys_lib.as_key(rng)
  obs_len = jnp.minimum(obs_len, S - fill)
  live = (obs_len > 0) & (budget > 0)
  obs_len = jnp.where(live, obs_len, 0)
  end = fill + obs_len  # the slot of the turn's token 0
  at = fill[:, None] + jnp.arange(O)[None, :]  # [B, O]
  real = jnp.arange(O)[None, :] < obs_len[:, None]
  tokens = tokens.at[rows[:, None], jnp.where(real, at, S)].set(obs, mode="drop")  # slot S: dropped

  keys = jax.vmap(lambda b: jax.random.fold_in(rng, b))(rows)
  reqs = engine.Requests(obs, obs_len, keys, stop_tokens, jnp.minimum(budget, N))
  run = engine.start(cfg, cache, reqs, N, live=live & (end < S))._replace(prompt_end=end)
  # PREFILL the observation at each row's own offset; DECODE the turn.
  run = engine.prefill(model_cfg, cfg, params, reqs, run, obs, fill, obs_len - 1, slots < end[:, None])
  run = engine.decode(model_cfg, cfg, params, reqs, run, engine.windows(0, S, cfg.window))

  # The turn into the episode buffer, after its observation.
  col = jnp.where(run.valid, end[:, None] + jnp.arange(N)[None, :], S)  # [B, N]
  tokens = tokens.at[rows[:, None], col].set(run.tokens, mode="drop")
  sampled = sampled.at[rows[:, None], col].set(True, mode="drop")
  logprobs = logprobs.at[rows[:, None], col].set(run.logp, mode="drop")
  fill = end + jnp.sum(run.valid, axis=1).astype(jnp.int32)
  # Each row's last token into the cache, so the next observation attends to the whole episode. A row that sat the
  # turn out rewrites its last entry with what it already held (same token, position and context).
  pos = jnp.maximum(fill - 1, 0)
  _, cache = transformer.forward_cached(model_cfg, params, tokens[rows, pos][:, None], pos[:, None], run.cache, pos,
                                        slots <= pos[:, None])
  return EpisodeState(cache, tokens, sampled, logprobs, fill), run.stopped


def make_turn_fn(model_cfg: ModelConfig, cfg: SamplingConfig, turn_tokens: int, mesh: jax.sharding.Mesh | None = None,
                 rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES) -> Callable[..., tuple[EpisodeState, jax.Array]]:
  """jit(params, state, obs [B, O], obs_len [B], budget [B], rng, stop_tokens [B, K]) -> (state, stopped [B]),
  the state donated (its cache is written in place)."""
  fn = functools.partial(turn, model_cfg, cfg, turn_tokens)
  return jax.jit(mesh_lib.bind(fn, mesh, rules), donate_argnums=(1,))


def to_rollout(state: EpisodeState, finished: jax.Array) -> Rollout:
  """The episodes as the RL step's `Rollout`: observation tokens as the prompt mask, the policy's tokens as the
  completion mask (see the module docstring)."""
  real = jnp.arange(state.tokens.shape[1])[None, :] < state.fill[:, None]
  return Rollout(tokens=state.tokens, prompt_mask=real & ~state.sampled, completion_mask=state.sampled,
                 logprobs=jnp.where(state.sampled, state.logprobs, 0.0),
                 lengths=jnp.sum(state.sampled, axis=1).astype(jnp.int32), finished=finished)
