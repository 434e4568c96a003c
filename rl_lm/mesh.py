"""One device mesh for every model, and the logical-axis rules that place tensors on it.

Models name logical axes only ('batch', 'embed', 'mlp', ...). A rule list maps each logical
name to mesh axes, in order of priority, and flax's `logical_to_mesh_axes` resolves it: the
first rule for a dimension's name whose mesh axes no other dimension holds yet wins, a rule
`(name, None)` replicates, and a name with no rule is replicated. So weights
`('embed', 'mlp')` shard over (fsdp, tensor) while activations `('batch', 'length', 'embed')`
shard the batch over (data, fsdp) and keep embed whole. A tensor may not name one logical
axis twice (flax raises ValueError).

Flax knows no shapes, so `logical_to_spec` first fits the rules to the tensor: mesh axes of
size 1 are dropped, and a rule whose mesh axes do not divide its dimension is skipped (the
next rule for that name, if any, is tried; otherwise it stays replicated). That is why
`constrain` and `tree_shardings` wrap this resolver rather than call flax's
`with_logical_constraint` / `logical_to_mesh_sharding`, which would emit uneven shardings.

Activation constraints are applied while tracing inside `activate(mesh, rules)`; wrap a
function with `bind(fn, mesh, rules)` before jitting it so that its trace always sees them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor")

Rules = tuple[tuple[str, Any], ...]  # (logical name, mesh axis | tuple of mesh axes | None)

DEFAULT_RULES: Rules = (
  ("batch", ("data", "fsdp")),
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("mlp", "tensor"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("head_dim", None),
  ("length", None),
  ("cache_length", None),
  ("layers", None),
)

_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar("rl_lm_mesh", default=None)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
  """Builds the (data, fsdp, tensor) mesh. One size may be -1: it takes the devices left over."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1:
    raise ValueError(f"config.mesh: at most one axis may be -1, got {sizes}")
  for k, v in sizes.items():
    if v == 0 or v < -1:
      raise ValueError(f"config.mesh.{k}: must be positive or -1, got {v}")
  known = math.prod(v for v in sizes.values() if v != -1)
  if free:
    if len(devices) % known:
      raise ValueError(f"config.mesh: {len(devices)} devices cannot be split by the fixed axes {sizes}")
    sizes[free[0]] = len(devices) // known
  if math.prod(sizes.values()) != len(devices):
    raise ValueError(
      f"config.mesh: data*fsdp*tensor = {math.prod(sizes.values())} but there are {len(devices)} devices "
      f"({sizes}); set one axis to -1 to fill the rest"
    )
  grid = np.asarray(devices).reshape(sizes["data"], sizes["fsdp"], sizes["tensor"])
  return Mesh(grid, AXES)


def mesh_from_config(mesh_cfg: Any) -> Mesh:
  """The mesh described by `config.mesh` (fields data, fsdp, tensor)."""
  return make_mesh(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor)


def rules_from_config(mesh_cfg: Any) -> Rules:
  """`config.mesh.rules` (a tuple of (logical, mesh axes) pairs), or the defaults when empty."""
  rules = tuple(mesh_cfg.rules) if mesh_cfg.rules else DEFAULT_RULES
  return tuple((str(name), _norm_axes(axes)) for name, axes in rules)


def _norm_axes(axes: Any) -> tuple[str, ...]:
  if axes is None:
    return ()
  if isinstance(axes, str):
    return (axes,)
  return tuple(axes)


def logical_to_spec(
  logical: Sequence[str | None], rules: Rules = DEFAULT_RULES, mesh: Mesh | None = None,
  shape: Sequence[int] | None = None,
) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec by `rules` (flax's resolver), fitted to `mesh` and `shape`."""
  logical = tuple(logical)
  fitted = []
  for name, axes in rules:
    if name not in logical:
      continue
    axes = _norm_axes(axes)
    if mesh is not None:
      axes = tuple(a for a in axes if mesh.shape[a] > 1)
      if shape is not None and shape[logical.index(name)] % math.prod(mesh.shape[a] for a in axes):
        continue
    fitted.append((name, axes or None))
  return nn.logical_to_mesh_axes(logical, fitted)


def named_sharding(mesh: Mesh, logical: Sequence[str | None], rules: Rules, shape: Sequence[int]) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(logical, rules, mesh, shape))


def tree_shardings(mesh: Mesh, rules: Rules, abstract: Any, axes: Any) -> Any:
  """Shardings for a pytree of arrays (or ShapeDtypeStructs) given a matching pytree of logical-axis tuples."""
  return jax.tree.map(
    lambda x, a: named_sharding(mesh, a, rules, x.shape), abstract, axes,
    is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
  )


def without_axis(rules: Rules, axis: str, keep: Sequence[str] = ("batch",)) -> Rules:
  """`rules` with the mesh axis `axis` taken out of every logical axis but those in `keep`: what was sharded over
  it is replicated over it (the sampler's gathered weights, `rollout.Sampler`), the batch still split over it."""
  return tuple((name, axes if name in keep else tuple(a for a in _norm_axes(axes) if a != axis))
               for name, axes in rules)


def drop_axis(sharding: NamedSharding, axis: str) -> NamedSharding:
  """`sharding` replicated over the mesh axis `axis` (every other dimension split as before)."""

  def entry(e: Any) -> Any:
    names = tuple(n for n in _norm_axes(e) if n != axis)
    return None if not names else names[0] if len(names) == 1 else names

  return NamedSharding(sharding.mesh, PartitionSpec(*(entry(e) for e in sharding.spec)))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, rules: Rules, shape: Sequence[int]) -> NamedSharding:
  """Sharding of a `[B, ...]` batch array: the batch over its rule's mesh axes, the rest replicated."""
  return named_sharding(mesh, ("batch",) + (None,) * (len(shape) - 1), rules, shape)


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """Within this context, `constrain` places activations on `mesh` by `rules`."""
  token = _ACTIVE.set((mesh, rules))
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def bind(fn: Callable, mesh: Mesh | None, rules: Rules = DEFAULT_RULES) -> Callable:
  """Wraps `fn` so that it runs (and is traced) inside `activate(mesh, rules)`."""
  if mesh is None:
    return fn

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with activate(mesh, rules):
      return fn(*args, **kwargs)

  return wrapped


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
  """Names the logical axes of an activation; a sharding constraint when a mesh is active."""
  active = _ACTIVE.get()
  if active is None:
    return x
  mesh, rules = active
  if mesh.size == 1:
    return x
  return jax.lax.with_sharding_constraint(x, named_sharding(mesh, logical, rules, x.shape))


def abstract_init(init_fn: Callable[[jax.Array], Any], axes: Any, mesh: Mesh, rules: Rules,
                  rng: jax.Array | None = None) -> Any:
  """What `sharded_init` creates, as ShapeDtypeStructs carrying their shardings: nothing is allocated."""
  abstract = jax.eval_shape(init_fn, jax.random.key(0) if rng is None else rng)
  shardings = tree_shardings(mesh, rules, abstract, axes)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def sharded_init(init_fn: Callable[[jax.Array], Any], axes: Any, mesh: Mesh, rules: Rules, rng: jax.Array) -> Any:
  """Creates parameters already sharded: eval_shape -> shardings -> jit(init, out_shardings)."""
  shardings = jax.tree.map(lambda a: a.sharding, abstract_init(init_fn, axes, mesh, rules, rng))
  return jax.jit(init_fn, out_shardings=shardings)(rng)


def place(tree: Any, axes: Any, mesh: Mesh, rules: Rules) -> Any:
  """Moves an existing pytree of arrays onto the mesh by its logical axes."""
  shardings = tree_shardings(mesh, rules, tree, axes)
  return jax.tree.map(jax.device_put, tree, shardings)


def put(x: Any, sharding: jax.sharding.Sharding | None) -> Any:
  """Host arrays (a pytree, the same on every process) placed as global arrays with `sharding` (None: the default
  device); with several processes each one fills only the shards its devices hold.

  Numpy leaves are copied first, so the caller may reuse its arrays at once: `device_put` on CPU may alias a host
  buffer (a replicated sharding does) or read it after it returns (the transfer is asynchronous), and a loop that
  resets its flags after queueing a call would otherwise change what the call reads (the episode runner's did)."""
  x = jax.tree.map(lambda a: np.array(a) if isinstance(a, np.ndarray) else a, x)
  if sharding is None or jax.process_count() == 1:
    return jax.device_put(x, sharding)

  def one(a: Any) -> jax.Array:
    a = np.asarray(a)
    return jax.make_array_from_callback(a.shape, sharding, lambda index: a[index])

  return jax.tree.map(one, x)


def fetch(tree: Any) -> Any:
  """Global arrays -> numpy, whole on every process (gathers the shards other processes hold)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils

  return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True))
                      if isinstance(x, jax.Array) and not x.is_fully_addressable else np.asarray(x), tree)
