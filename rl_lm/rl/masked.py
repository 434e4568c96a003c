"""Masked reductions shared by advantages, KL and losses: sum, mean, max, variance, whitening.

Masks are bool arrays, or float arrays of 0/1 (any nonzero entry counts as valid), that broadcast
against `x`. Masked entries are replaced by 0 with `jnp.where` before any arithmetic, so an inf or
NaN sitting in a masked slot (padding logits, garbage log-probs) never reaches the result.

Empty selections are guarded everywhere: a mean, variance or max over no valid entry is 0, never
NaN, so an all-masked batch flows through a jitted update without poisoning it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Axis = int | tuple[int, ...] | None


def as_bool(mask: jax.Array) -> jax.Array:
  """A bool or 0/1 float mask as bool: nonzero is valid."""
  mask = jnp.asarray(mask)
  return mask if mask.dtype == jnp.bool_ else mask != 0


def _prepare(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """x with masked entries zeroed, and the bool mask broadcast to x's shape."""
  x = jnp.asarray(x)
  m = jnp.broadcast_to(as_bool(mask), x.shape)
  return jnp.where(m, x, jnp.zeros((), x.dtype)), m


def masked_count(mask: jax.Array, axis: Axis = None, keepdims: bool = False) -> jax.Array:
  """Number of valid entries (float32) along `axis`."""
  return jnp.sum(as_bool(mask), axis=axis, keepdims=keepdims, dtype=jnp.float32)


def masked_sum(x: jax.Array, mask: jax.Array, axis: Axis = None, keepdims: bool = False) -> jax.Array:
  """Sum of the valid entries of x along `axis` (0 where none is valid)."""
  xz, _ = _prepare(x, mask)
  return jnp.sum(xz, axis=axis, keepdims=keepdims)


def masked_mean(x: jax.Array, mask: jax.Array, axis: Axis = None, keepdims: bool = False) -> jax.Array:
  """Mean of the valid entries of x along `axis`; 0 where none is valid."""
  xz, m = _prepare(x, mask)
  total = jnp.sum(xz, axis=axis, keepdims=keepdims)
  count = jnp.sum(m, axis=axis, keepdims=keepdims, dtype=jnp.float32)
  return total / jnp.maximum(count, 1.0)


def masked_max(x: jax.Array, mask: jax.Array, axis: Axis = None, keepdims: bool = False) -> jax.Array:
  """Max of the valid entries of x along `axis`; 0 where none is valid."""
  x = jnp.asarray(x)
  m = jnp.broadcast_to(as_bool(mask), x.shape)
  top = jnp.max(jnp.where(m, x, -jnp.inf), axis=axis, keepdims=keepdims)
  return jnp.where(jnp.any(m, axis=axis, keepdims=keepdims), top, 0.0).astype(x.dtype)


def masked_var(
  x: jax.Array, mask: jax.Array, unbiased: bool = False, axis: Axis = None, keepdims: bool = False
) -> jax.Array:
  """Variance of the valid entries of x along `axis`.

  Biased (divide by n) by default; `unbiased=True` divides by n - 1 (Bessel). The result is 0
  where there is no valid entry, and, when unbiased, where there is exactly one.
  """
  xz, m = _prepare(x, mask)
  count = jnp.sum(m, axis=axis, keepdims=True, dtype=jnp.float32)
  mean = jnp.sum(xz, axis=axis, keepdims=True) / jnp.maximum(count, 1.0)
  sq = jnp.where(m, jnp.square(xz - mean), 0.0)
  denom = count - 1.0 if unbiased else count
  var = jnp.sum(sq, axis=axis, keepdims=True) / jnp.maximum(denom, 1.0)
  var = jnp.where(denom > 0, var, 0.0)
  if keepdims:
    return var
  return var.reshape(()) if axis is None else jnp.squeeze(var, axis=axis)


def whiten(
  x: jax.Array, mask: jax.Array, shift_mean: bool = True, eps: float = 1e-8, unbiased: bool = True
) -> jax.Array:
  """Normalises x by the mean and standard deviation of all its valid entries; masked entries become 0.

  (x - mean) / sqrt(var + eps), with `mean` added back when `shift_mean=False` (scale only).
  The variance is the unbiased one by default, as verl's and TRL's `masked_whiten`. With fewer
  than two valid entries the variance is 0, so the result is 0 (or the mean, when not shifting).
  """
  x = jnp.asarray(x)
  xz, m = _prepare(x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32), mask)
  mean = masked_mean(xz, m)
  var = masked_var(xz, m, unbiased=unbiased)
  out = (xz - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return jnp.where(m, out, 0.0)
