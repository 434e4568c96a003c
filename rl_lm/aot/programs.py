"""What `python -m rl_lm.aot` compiles: every jitted function of every configured stage, with abstract arguments.

Each stage's state is rebuilt as the trainer builds it, through the same constructors (`build.config_of`,
`state_lib.state_shardings`, `rl_update.make_update_fn`, `sampling.jit_generate`, ...), but as ShapeDtypeStructs
carrying their shardings (`jax.eval_shape`): nothing is allocated, so a 70B model is fine on a laptop.

A `Program` is one jitted function of a stage:
- `memory`: the function as the run calls it (real model, real batch, its loops rolled), compiled for the
  per-chip memory it needs;
- `cost`: `Term`s whose sum is the cost of one call with every loop accounted for. XLA's cost analysis counts a
  loop body once, so a term compiles its piece (a decode step, one micro-batch of the update) with 1 and with 2
  layers, every short loop unrolled, and extrapolates linearly to the model's layers (rl_lm/aot/measure.py),
  times how often the call runs it;
- `expected`, `model_flops`: the analytic counts (rl_lm/aot/flops.py) the estimate is checked against and MFU
  divides;
- `uses`: the stage's resident buffers (`Stage.resident`) among its arguments; the others are held by the run
  while it runs and count against the same HBM.

The programs of each stage are listed in rl_lm/aot/stages.py, the samplers' in rl_lm/aot/samplers.py; this module
holds what they are made of, and the abstract arrays they take.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rl_lm import mesh as mesh_lib
from rl_lm import tokenizer as tokenizer_lib
from rl_lm.models import build, transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.train import state as state_lib


@dataclasses.dataclass(frozen=True)
class Call:
  """A jitted function and the abstract arguments to lower it with."""

  fn: Any
  args: tuple


@dataclasses.dataclass(frozen=True)
class Term:
  """`count` runs of a piece of a program. `build(model)` gives the piece for a model config: with 1 and 2 layers
  when `layers`, else the real one; with `per_parameter` 1 layer, scaled by the parameter count (a piece that does
  the same work for every parameter). `between` = (near, far, w) instead places it at the fraction w of the way
  from one built piece to another, its cost linear in between (a decode step in its attention window: each end is
  costed on its own). `whole` builds it once, with all the model's layers, every one unrolled: not
  extrapolated (a decode step, whose counts XLA:TPU does not grow evenly from layer to layer; rl_lm/aot/measure.py)."""

  count: float
  key: str  # the same key, the same compiled piece
  build: Callable[[ModelConfig], Call] | None = None
  layers: bool = True
  between: tuple[Term, Term, float] | None = None
  per_parameter: bool = False  # elementwise over the parameters (an optimizer step): 1 layer, scaled by their count
  model: ModelConfig | None = None  # the model whose layers the piece varies (a teacher's); None: the stage's
  whole: bool = False  # built once with the model's own layers, all unrolled (not with 1 and 2, extrapolated)


@dataclasses.dataclass
class Program:
  stage: str
  name: str
  memory: Call | None  # None: a piece whose memory is its caller's (`part_of`)
  cost: list[Term]
  expected: float  # FLOPs XLA should run, whole slice
  model_flops: float = 0.0  # MFU numerator; 0: none
  uses: frozenset[str] = frozenset()
  tokens: float = 0.0  # tokens one call makes or reads, for tokens/s
  roofline_bytes: float = 0.0  # decode: the bytes a step must read at least (weights, cache window), whole slice
  part_of: str = ""
  note: str = ""
  per_step: bool = False  # runs every training step (what --search ranks meshes by)

  @property
  def label(self) -> str:
    return f"{self.stage}/{self.name}"


@dataclasses.dataclass
class Stage:
  name: str
  resident: dict[str, float]  # bytes per chip of what the stage holds while its programs run
  programs: list[Program]


@dataclasses.dataclass
class Abstract:
  """The run's context, abstract: config, mesh and rules, the model config, the tokenizer (no weights read)."""

  config: Any
  mesh: Mesh
  rules: mesh_lib.Rules
  model: ModelConfig
  tokenizer: Any

  @property
  def chips(self) -> int:
    return self.mesh.size


def context(config: Any, mesh: Mesh) -> Abstract:
  rules = mesh_lib.rules_from_config(config.mesh)
  return Abstract(config, mesh, rules, build.config_of(config.model), tokenizer_lib.from_config(config))


# ------------------------------------------------------------------------------------------------
# Abstract arrays


def sds(shape: tuple[int, ...], dtype: Any, sharding: Any) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def batch_sds(a: Abstract, shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
  """A [B, ...] array placed as the run places batches: rows over the batch rule's mesh axes."""
  return sds(shape, dtype, mesh_lib.batch_sharding(a.mesh, a.rules, shape))


def replicated_sds(a: Abstract, shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
  return sds(shape, dtype, mesh_lib.replicated(a.mesh))


def key_sds(a: Abstract) -> jax.ShapeDtypeStruct:
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=mesh_lib.replicated(a.mesh))


def with_shardings(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: sds(x.shape, x.dtype, s), tree, shardings)


def shardings(tree: Any) -> Any:
  return jax.tree.map(lambda x: x.sharding, tree)


def per_chip_bytes(tree: Any) -> float:
  """Bytes of the largest shard of each array in `tree`, summed: what one chip holds of it."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += math.prod(shape) * x.dtype.itemsize
  return total


def train_state(opt: Any, params: Any, mesh: Mesh) -> state_lib.TrainState:
  """The abstract TrainState `state_lib.create` makes around `params`, with `state_shardings`."""
  sh = state_lib.state_shardings(opt, params, shardings(params), mesh)
  shapes = jax.eval_shape(lambda p: state_lib.TrainState(jnp.zeros((), jnp.int32), p, opt.init(p)), params)
  return with_shardings(shapes, sh)


def by_rows(a: Abstract, tree: Any, rows: int) -> Any:
  """Shardings for a sampler's loop state: the cache by its logical axes, [rows, ...] arrays over the batch axes,
  the rest (counters, keys) replicated; as the program's own constraints place them."""

  def one(x: Any, logical: Any = None) -> Any:
    if logical is not None:
      return mesh_lib.named_sharding(a.mesh, logical, a.rules, x.shape)
    if x.ndim and x.shape[0] == rows:
      return mesh_lib.batch_sharding(a.mesh, a.rules, x.shape)
    return mesh_lib.replicated(a.mesh)

  def walk(node: Any) -> Any:
    if isinstance(node, transformer.KVCache):
      axes = transformer.cache_axes(node.by_slot)
      return transformer.KVCache(one(node.k, axes.k), one(node.v, axes.v), node.by_slot)
    if isinstance(node, tuple) and hasattr(node, "_fields"):
      return type(node)(*(walk(x) for x in node))
    if isinstance(node, dict):
      return {k: walk(v) for k, v in node.items()}
    return one(node)

  return with_shardings(tree, walk(tree))
