"""Models from config: a preset or a Hugging Face checkpoint, parameters born sharded on the mesh."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from rl_lm import mesh as mesh_lib
from rl_lm.models import presets, transformer
from rl_lm.models.presets import ModelConfig


def model_config(model: Any) -> ModelConfig:
  """`config.model` -> ModelConfig (for a preset; Hugging Face checkpoints carry their own)."""
  return presets.get(model.preset, dtype=model.dtype, param_dtype=model.param_dtype, remat=model.remat,
                     logit_chunk=model.logit_chunk)


def init_params(cfg: ModelConfig, mesh: Mesh, rules: mesh_lib.Rules, rng: jax.Array) -> transformer.Params:
  """Random parameters created already sharded over `mesh`."""
  return mesh_lib.sharded_init(lambda r: transformer.init(cfg, r), transformer.param_axes(cfg), mesh, rules, rng)


def load_or_init(model: Any, mesh: Mesh, rules: mesh_lib.Rules, rng: jax.Array) -> tuple[ModelConfig, Any]:
  """The policy described by `config.model`: loaded from `hf_checkpoint` if set, else a random preset."""
  if model.hf_checkpoint:
    from rl_lm.models import hf

    cfg, params = hf.load(model.hf_checkpoint, mesh=mesh, rules=rules, dtype=model.dtype,
                          param_dtype=model.param_dtype)
    return cfg.replace(remat=model.remat, logit_chunk=model.logit_chunk), params
  cfg = model_config(model)
  return cfg, init_params(cfg, mesh, rules, rng)
