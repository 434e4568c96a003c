"""Models from config: a preset or a Hugging Face checkpoint, parameters born sharded on the mesh."""

from __future__ import annotations

import json
import os
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


def config_of(model: Any) -> ModelConfig:
  """`config.model` -> the ModelConfig of the model `load_or_init` builds, without reading or creating weights:
  the preset's, or the one a Hugging Face checkpoint's config.json describes."""
  if not model.hf_checkpoint:
    return model_config(model)
  from rl_lm.models import hf

  path = os.path.join(model.hf_checkpoint, hf.CONFIG_FILE)
  with open(path, encoding="utf-8") as f:
    try:
      cfg = hf.config_from_hf(json.load(f))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
      raise hf.UnsupportedModelError(f"{path}: not a JSON object ({e})") from None
    except hf.UnsupportedModelError as e:
      raise hf.UnsupportedModelError(os.path.join(model.hf_checkpoint, str(e))) from None
  return cfg.replace(dtype=model.dtype, param_dtype=model.param_dtype, remat=model.remat, logit_chunk=model.logit_chunk)


def abstract_params(cfg: ModelConfig, mesh: Mesh, rules: mesh_lib.Rules) -> transformer.Params:
  """What `init_params` (or `hf.load` onto the mesh) makes, as sharded ShapeDtypeStructs: nothing is allocated."""
  return mesh_lib.abstract_init(lambda r: transformer.init(cfg, r), transformer.param_axes(cfg), mesh, rules)


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
