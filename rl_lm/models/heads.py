"""A scalar head on the transformer backbone, for value and reward models.

The parameters are `{"backbone": <transformer params>, "head": {"w": [D], "b": []}}`, so a
backbone can be initialised from a policy or SFT checkpoint as it is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig

Params = transformer.Params


def param_axes(cfg: ModelConfig) -> Params:
  return {"backbone": transformer.param_axes(cfg), "head": {"w": ("embed",), "b": ()}}


def init(cfg: ModelConfig, rng: jax.Array, backbone: Params | None = None) -> Params:
  """Scalar-head parameters: a given (or random) backbone and a zero-initialised head."""
  if backbone is None:
    backbone = transformer.init(cfg, rng)
  return {"backbone": backbone, "head": {"w": jnp.zeros((cfg.d_model,), cfg.weight_dtype),
                                         "b": jnp.zeros((), cfg.weight_dtype)}}


def forward(cfg: ModelConfig, params: Params, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """One float32 scalar per token. tokens [B, T], mask [B, T] -> [B, T]."""
  h = transformer.hidden_states(cfg, params["backbone"], tokens, mask)  # [B, T, D]
  w = params["head"]["w"].astype(h.dtype)
  return jnp.einsum("btd,d->bt", h, w, preferred_element_type=jnp.float32) + params["head"]["b"].astype(jnp.float32)


def last_token_score(cfg: ModelConfig, params: Params, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """The scalar at each row's last real token (the reward-model convention). -> [B]."""
  values = forward(cfg, params, tokens, mask)
  last = jnp.max(jnp.where(mask, jnp.arange(tokens.shape[1])[None, :], -1), axis=1)
  return jnp.take_along_axis(values, jnp.maximum(last, 0)[:, None], axis=1)[:, 0]
