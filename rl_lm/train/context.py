"""What the stages of one run share: the mesh, the model, the tokenizer and the current policy."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import Mesh

from rl_lm import mesh as mesh_lib
from rl_lm import tokenizer as tokenizer_lib
from rl_lm.models import build, transformer
from rl_lm.models.presets import ModelConfig


@dataclasses.dataclass
class Context:
  """Built once per run; each stage reads the policy it starts from and leaves the one it made."""

  config: Any
  workdir: str
  mesh: Mesh
  rules: mesh_lib.Rules
  model_cfg: ModelConfig
  tokenizer: tokenizer_lib.Tokenizer
  policy: Any  # parameters, sharded on `mesh`
  key: jax.Array
  reward_model: Any = None  # a reward_model.RewardModel once that stage has run

  @property
  def param_shardings(self) -> Any:
    return jax.tree.map(lambda x: x.sharding, self.policy)

  @property
  def param_axes(self) -> Any:
    return transformer.param_axes(self.model_cfg)


def make_context(config: Any, workdir: str) -> Context:
  mesh = mesh_lib.mesh_from_config(config.mesh)
  rules = mesh_lib.rules_from_config(config.mesh)
  # The run's root key, replicated over the mesh (made inside a jit: a global array on every process too), so
  # that the keys derived from it each step stay where the jitted functions take them.
  key = jax.jit(lambda: jax.random.key(config.seed), out_shardings=mesh_lib.replicated(mesh))()
  model_cfg, params = build.load_or_init(config.model, mesh, rules, jax.random.fold_in(key, 0))
  tok = tokenizer_lib.from_config(config)
  if tok.vocab_size > model_cfg.vocab_size:
    raise ValueError(f"the tokenizer has {tok.vocab_size} ids but the model only {model_cfg.vocab_size}")
  return Context(config, workdir, mesh, rules, model_cfg, tok, params, key)
