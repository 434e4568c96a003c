"""The train-state pytree and its optimizer, created already sharded on the mesh."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from rl_lm import mesh as mesh_lib


class TrainState(NamedTuple):
  step: jax.Array  # [] int32
  params: Any
  opt_state: Any


def make_optimizer(
  learning_rate: float, *, weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
  grad_clip: float = 1.0, warmup_steps: int = 0, total_steps: int | None = None,
) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and linear warmup, then constant (or cosine to 0 given total_steps)."""
  if total_steps:
    warmup = min(max(warmup_steps, 1), max(total_steps - 1, 1))
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, max(total_steps, warmup + 1))
  elif warmup_steps:
    schedule = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  else:
    schedule = optax.constant_schedule(learning_rate)
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
  return optax.chain(*parts)


def state_shardings(optimizer: optax.GradientTransformation, params_abstract: Any, param_shardings: Any,
                    mesh: Mesh) -> TrainState:
  """Shardings of a TrainState: optimizer moments follow their parameters, counters are replicated."""
  opt_abstract = jax.eval_shape(optimizer.init, params_abstract)
  rep = mesh_lib.replicated(mesh)
  opt_shardings = optax.tree_map_params(
    optimizer, lambda _, s: s, opt_abstract, param_shardings, transform_non_params=lambda _: rep,
    is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
  )
  return TrainState(step=rep, params=param_shardings, opt_state=opt_shardings)


def create(params: Any, optimizer: optax.GradientTransformation, mesh: Mesh, param_shardings: Any) -> TrainState:
  """A TrainState around already-placed `params`, the optimizer state born sharded like them."""
  shardings = state_shardings(optimizer, jax.eval_shape(lambda: params), param_shardings, mesh)
  init = jax.jit(lambda p: TrainState(jnp.zeros((), jnp.int32), p, optimizer.init(p)), out_shardings=shardings)
  return init(params)


def global_norm(tree: Any) -> jax.Array:
  """L2 norm over every leaf of a pytree (None leaves skipped)."""
  return optax.tree.norm(tree)


def all_finite(tree: Any) -> jax.Array:
  """True when no floating-point leaf of `tree` holds a NaN or an inf (integer leaves cannot). [] bool"""
  flags = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.stack(flags).all() if flags else jnp.asarray(True)


def propose(state: TrainState, grads: Any, optimizer: optax.GradientTransformation) -> tuple[TrainState, jax.Array]:
  """The state one optimizer step later, unconditionally, and the global norm of the parameter update."""
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), global_norm(updates)


def accept(ok: jax.Array, new: TrainState, old: TrainState) -> TrainState:
  """`new` where `ok`, else `old`: a skipped step keeps the parameters, optimizer state and step count."""
  return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def apply_gradients(state: TrainState, grads: Any, optimizer: optax.GradientTransformation,
                    finite: jax.Array | bool = True) -> tuple[TrainState, jax.Array, jax.Array]:
  """One optimizer step, kept only when `finite` (the loss and gradients were) and the new parameters and
  optimizer state are finite too (an inf learning rate, an overflowing moment). -> (state, applied, update norm)."""
  new, update_norm = propose(state, grads, optimizer)
  ok = jnp.asarray(finite) & all_finite((new.params, new.opt_state))
  return accept(ok, new, state), ok, update_norm


def make_update_fn(
  loss_fn: Callable[[Any, Any, jax.Array], tuple[jax.Array, dict]], optimizer: optax.GradientTransformation,
  shardings: TrainState, mesh: Mesh | None = None, rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES,
) -> Callable[[TrainState, Any, jax.Array], tuple[TrainState, dict]]:
  """`update_fn(state, batch, rng) -> (state, metrics)`, jitted once, the state donated.

  loss_fn(params, batch, rng) -> (scalar loss, metrics dict). Metrics gain `train/loss`, `train/grad_norm`,
  `train/update_norm` and `train/skipped` (1.0 when a NaN or inf in the loss, the gradients or the updated
  parameters or optimizer state left the state unchanged).
  """

  def update(state: TrainState, batch: Any, rng: jax.Array):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, rng)
    grad_norm = global_norm(grads)
    state, applied, update_norm = apply_gradients(state, grads, optimizer, jnp.isfinite(grad_norm) & jnp.isfinite(loss))
    metrics = dict(metrics, **{"train/loss": loss, "train/grad_norm": grad_norm, "train/update_norm": update_norm,
                               "train/skipped": (~applied).astype(jnp.float32)})
    return state, metrics

  return jax.jit(mesh_lib.bind(update, mesh, rules), out_shardings=(shardings, None), donate_argnums=(0,))
