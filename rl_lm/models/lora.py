"""LoRA adapters (Hu et al. 2021) as their own pytree; the base weights stay frozen and hold no optimizer state.

A targeted projection W [*in, *out] (per layer) gets A [*in, r] and B [r, *out]; the layer computes
x W + (alpha / r) (x A) B, factorised, so neither the merged weight nor its gradient is ever formed in
training. B starts at zero, so a fresh adapter leaves the model exactly as it was.

  adapters = lora.init(cfg, lora_cfg, rng)             # {"layers": {"wq": {"a": [L, D, r], "b": [L, r, H, Dh]}, ...}}
  params = lora.combine(base, adapters, lora_cfg)      # the base with `LoraWeight`s where targeted: forward as usual
  merged = lora.merge(base, adapters, lora_cfg)        # W + (alpha / r) A B: plain parameters, for export

The reference policy of RL is `base` itself: the policy with its adapters off, so no second copy of the
weights exists. Adapters are sharded like their base weight: A's input axes and B's output axes are the
weight's own logical axes, the rank axis is unsharded (`param_axes`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.models.transformer import LoraWeight

# The projections that can carry an adapter, and how many leading axes (after "layers") are their input.
INPUT_AXES = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  rank: int
  alpha: float
  targets: tuple[str, ...] = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
    unknown = [t for t in self.targets if t not in INPUT_AXES]
    if unknown or not self.targets:
      raise ValueError(f"unknown LoRA targets {unknown or list(self.targets)}; known: {list(INPUT_AXES)}")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def from_section(model: Any) -> LoraConfig | None:
  """`config.model.lora` -> LoraConfig, or None when its rank is 0 (off)."""
  lora = model.lora
  return LoraConfig(int(lora.rank), float(lora.alpha), tuple(lora.targets)) if lora.rank else None


def _split(shape: Sequence[int], name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
  n = INPUT_AXES[name]
  return tuple(shape[1:1 + n]), tuple(shape[1 + n:])  # (input dims, output dims), after the layer axis


def param_axes(cfg: ModelConfig, lcfg: LoraConfig) -> dict[str, Any]:
  """Logical axes of the adapters: those of the base weight, with an unsharded rank axis between."""
  base = transformer.param_axes(cfg)["layers"]
  out = {}
  for name in lcfg.targets:
    axes = base[name]
    n = INPUT_AXES[name]
    out[name] = {"a": (*axes[:1 + n], None), "b": (axes[0], None, *axes[1 + n:])}
  return {"layers": out}


def init(cfg: ModelConfig, lcfg: LoraConfig, rng: jax.Array) -> dict[str, Any]:
  """A ~ normal(0, 1 / fan_in) (He-like, as the reference implementation's Kaiming init), B = 0."""
  shapes = transformer.param_shapes(cfg)["layers"]
  keys = jax.random.split(rng, len(lcfg.targets))
  out = {}
  for key, name in zip(keys, lcfg.targets, strict=True):
    inner, outer = _split(shapes[name], name)
    L, fan_in = shapes[name][0], math.prod(inner)
    a = jax.random.normal(key, (L, *inner, lcfg.rank), jnp.float32) / math.sqrt(fan_in)
    out[name] = {"a": a.astype(cfg.weight_dtype), "b": jnp.zeros((L, lcfg.rank, *outer), cfg.weight_dtype)}
  return {"layers": out}


def combine(base: dict[str, Any], adapters: dict[str, Any], lcfg: LoraConfig) -> dict[str, Any]:
  """The base parameters with each targeted weight replaced by LoraWeight(W, A, scale * B).
  `transformer.forward` and the sampler take the result as they take plain params; a trainer differentiates
  with respect to `adapters` only, so the base receives no gradient and needs no optimizer state."""
  layers = dict(base["layers"])
  for name, ab in adapters["layers"].items():
    layers[name] = LoraWeight(layers[name], ab["a"], lcfg.scale * ab["b"])
  return {**base, "layers": layers}


def merge(base: dict[str, Any], adapters: dict[str, Any], lcfg: LoraConfig) -> dict[str, Any]:
  """Plain parameters W + (alpha / r) A B, in the base's dtype: what export writes."""
  layers = dict(base["layers"])
  for name, ab in adapters["layers"].items():
    w = layers[name]
    a = ab["a"].astype(jnp.float32).reshape(w.shape[0], -1, lcfg.rank)  # [L, In, r]
    b = ab["b"].astype(jnp.float32).reshape(w.shape[0], lcfg.rank, -1)  # [L, r, Out]
    delta = jnp.einsum("lir,lro->lio", a, b).reshape(w.shape)
    layers[name] = (w.astype(jnp.float32) + lcfg.scale * delta).astype(w.dtype)
  return {**base, "layers": layers}


def num_params(tree: Any) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
