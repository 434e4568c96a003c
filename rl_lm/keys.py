"""Random keys at the library's edge: typed keys (`jax.random.key`) and legacy raw keys (`jax.random.PRNGKey`,
uint32[2] for the default threefry implementation) are both accepted, and become typed keys before anything
draws.

Inside the library every key is typed, so a key's shape says what it is: [] is one key, [B] is one key per row.
A legacy key's own trailing dimension would make it look like per-row keys, which is why the entry points
(`sampling.generate`, the refill and multi-turn drivers) convert first, and why per-row keys are a separate,
explicit argument (`sampling.sample_token(..., row_keys=)`), never inferred from a shape.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import mesh as mesh_lib


def is_typed(key: jax.Array) -> bool:
  """A typed key array (`jax.random.key`), not raw uint32 key data."""
  return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)


@functools.cache
def _raw_shape() -> tuple[int, ...]:
  return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape)  # (2,) for threefry


def as_key(key: jax.Array) -> jax.Array:
  """One typed key from a typed key [] or a legacy raw key (uint32[2] under the default implementation)."""
  if is_typed(key):
    if key.shape:
      raise ValueError(f"expected one random key, got a key array of shape {key.shape}: per-row keys are the "
                       "separate row_keys argument")
    return key
  raw = _raw_shape()
  if key.dtype != jnp.uint32 or tuple(key.shape) != raw:
    raise ValueError(f"expected one random key (jax.random.key(seed), or a legacy jax.random.PRNGKey(seed): "
                     f"uint32{list(raw)}), got {key.dtype}{list(key.shape)}")
  return jax.random.wrap_key_data(key)


def as_row_keys(keys: jax.Array, rows: int) -> jax.Array:
  """[rows] typed keys from typed keys [rows] or legacy raw keys [rows, 2]."""
  if not is_typed(keys):
    keys = jax.random.wrap_key_data(jnp.asarray(keys, jnp.uint32))
  if tuple(keys.shape) != (rows,):
    raise ValueError(f"expected {rows} per-row keys, got a key array of shape {keys.shape}")
  return keys


@jax.jit
def _fold(key: jax.Array, data: jax.Array) -> jax.Array:
  for i in range(data.shape[0]):
    key = jax.random.fold_in(key, data[i])
  return key


def fold(key: jax.Array, *data: int) -> jax.Array:
  """fold_in(... fold_in(key, data[0]) ..., data[-1]) for host integers, moved to the device explicitly (one
  transfer, placed as the key is: a key replicated over the mesh gives a replicated key), so that a step's key
  derivation passes `jax.transfer_guard("disallow")`. The same keys as `jax.random.fold_in` with the integers
  (as uint32)."""
  key = as_key(key)
  return _fold(key, mesh_lib.put(np.asarray(data, np.uint32), key.sharding))  # beside the key (replicated)
