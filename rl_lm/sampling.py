"""Sampling from the policy, the public entry points: `generate`, `make_generate_fn` and the trainer's view of a
rollout (`completion_logprobs`).

The samplers themselves live in `rl_lm.rollout`: one decode engine (`rollout.engine`) behind the static batch and
continuous batching (`rollout.generate`) and the policy's turns of multi-turn episodes (`rollout.turns`). The layout
of the `Rollout` they return and the meaning of its log-probs: `rl_lm.rollout.types`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import mesh as mesh_lib
from rl_lm.models import scoring
from rl_lm.models.presets import ModelConfig
from rl_lm.rollout import generate as drivers
from rl_lm.rollout.draw import filter_logits, sample_token
from rl_lm.rollout.types import Rollout, SamplingConfig

__all__ = ["Rollout", "SamplingConfig", "completion_logprobs", "config_from", "filter_logits", "generate",
           "make_generate_fn", "pad_prompts", "sample_token", "stop_and_budget"]


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
    return mesh_lib.put(x, None if mesh is None else mesh_lib.batch_sharding(mesh, rules, shape))

  if stop_tokens is None:
    stop_tokens = cfg.stop_tokens or (-1,)
  if not isinstance(stop_tokens, jax.Array):
    stop_tokens = np.asarray(stop_tokens, np.int32)
  k = stop_tokens.shape[-1]
  if max_new_tokens is None:
    max_new_tokens = cfg.max_new_tokens
  return place(stop_tokens, (batch, k)), place(max_new_tokens, (batch,))


def make_generate_fn(
  model_cfg: ModelConfig, cfg: SamplingConfig, mesh: jax.sharding.Mesh | None = None,
  rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES, slots: int | None = None,
) -> Callable[..., Rollout]:
  """A jitted `fn(params, prompts [Q, P], prompt_lengths [Q], rng, stop_tokens=None, max_new_tokens=None) -> Rollout`.

  slots: continuous batching over this many cache rows, or 0 the static batch (default `cfg.slots`); the same call
  and result either way, the same tokens for the same key.
  stop_tokens: [Q, K] or [K] int32 (-1 pads rows with fewer), default `cfg.stop_tokens`.
  max_new_tokens: [Q] or scalar, at most `cfg.max_new_tokens`, default that.
  rng: a typed key or a legacy uint32[2] one.
  With a mesh, activations (and the KV cache) are placed by the logical-axis rules.
  """
  jitted = drivers.jit_generate(model_cfg, cfg, mesh, rules, slots)

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
  """Samples completions for right-padded `prompts` [B, P] (one jit per (model, sampling) config; continuous
  batching when `cfg.slots`). Every prompt must hold at least one real token. Layout: `rl_lm.rollout.types`.
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
