"""Decoder-only transformer of the Llama / Qwen2 family, as pure functions over a parameter dict.

RMSNorm, rotary position embeddings (half-rotation convention of the Hugging Face checkpoints,
optional Llama-3 frequency scaling), SwiGLU MLP, grouped-query attention, optional q/k/v biases
(Qwen2), tied or untied embeddings, float32 or bfloat16 compute with float32 softmax and logits.

Layers are stacked on a leading axis and run with `lax.scan`, so compile time does not grow
with depth. Every weight has logical axes (`param_axes`); activations are named through
`mesh.constrain`.

Padding: `mask[b, t]` marks real tokens. A token's position is the number of real tokens before
it, so left- and right-padded rows give the same numbers for their real tokens. Keys that are
padding are never attended to. Outputs at padding positions are defined but meaningless.

Shapes: B batch, T query length, S key length, D d_model, H heads, K kv heads, G = H // K,
Dh head dim, F mlp dim, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rl_lm.mesh import constrain
from rl_lm.models.presets import ModelConfig

Params = dict[str, Any]
_NEG_INF = -1e30


class LoraWeight(NamedTuple):
  """A projection with a low-rank adapter (rl_lm/models/lora.py): x W + (x A) B, B already scaled by alpha / r.
  w [L, *in, *out], a [L, *in, r], b [L, r, *out] (without L inside the layer scan)."""

  w: jax.Array
  a: jax.Array
  b: jax.Array


@functools.partial(jax.tree_util.register_dataclass, data_fields=["k", "v"], meta_fields=["by_slot"])
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Preallocated keys and values of every layer: v [L, B, K, S, Dh]; k [L, B, K, Dh, S], or with `by_slot`
  [L, B, K, S, Dh] as the values. `by_slot` is static (the pytree's metadata): a program is traced for one layout.

  Transposed keys make both attention products of a decode step plain [G, x] @ [x, y] matmuls per (row, kv head):
  q [G, Dh] @ k [Dh, W], then probs [G, W] @ v [W, Dh]; with keys stored [W, Dh] the first product reads k
  transposed, which XLA:CPU runs about four times slower. On a TPU the step's write is what matters: a new key is
  then one slot of the minor (lane) axis, a column through every (8, 128) tile of the row's [Dh, S] block, and
  XLA:TPU reads and writes those whole tiles (12.7 MB a layer for Llama-3.1-8B's 128 rows of a v5p chip, against
  0.36 MB for a row of [S, Dh] keys; experiments in the README's "At pod scale"). `sampling.key_layout` chooses
  (`keys_by_slot`): by slot on TPUs and GPUs, transposed on CPUs.
  """

  k: jax.Array
  v: jax.Array
  by_slot: bool = False


KEY_LAYOUTS = ("auto", "transposed", "by_slot")


def keys_by_slot(layout: str, platform: str | None = None) -> bool:
  """`sampling.key_layout` -> whether the key cache is stored by slot ([.., S, Dh]). "auto": by slot unless the
  platform (default: JAX's default backend; the AOT tool passes its target's) is a CPU."""
  if layout not in KEY_LAYOUTS:
    raise ValueError(f"key layout {layout!r}: expected one of {', '.join(KEY_LAYOUTS)}")
  if layout == "auto":
    return (platform or jax.default_backend()) != "cpu"
  return layout == "by_slot"


# ------------------------------------------------------------------------------------------------
# Parameters


def param_axes(cfg: ModelConfig) -> Params:
  """Logical axis names of every parameter, in the same tree as `init`."""
  layers = {
    "attn_norm": ("layers", "embed"),
    "wq": ("layers", "embed", "heads", "head_dim"),
    "wk": ("layers", "embed", "kv_heads", "head_dim"),
    "wv": ("layers", "embed", "kv_heads", "head_dim"),
    "wo": ("layers", "heads", "head_dim", "embed"),
    "mlp_norm": ("layers", "embed"),
    "w_gate": ("layers", "embed", "mlp"),
    "w_up": ("layers", "embed", "mlp"),
    "w_down": ("layers", "mlp", "embed"),
  }
  if cfg.qkv_bias:
    layers.update(
      bq=("layers", "heads", "head_dim"), bk=("layers", "kv_heads", "head_dim"), bv=("layers", "kv_heads", "head_dim")
    )
  axes: Params = {"embed": ("vocab", "embed"), "layers": layers, "final_norm": ("embed",)}
  if not cfg.tie_embeddings:
    axes["lm_head"] = ("embed", "vocab")
  return axes


def param_shapes(cfg: ModelConfig) -> Params:
  """Shape of every parameter, in the same tree as `init`."""
  L, D, H, K, Dh, F, V = (
    cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim, cfg.vocab_size
  )
  layers = {
    "attn_norm": (L, D), "wq": (L, D, H, Dh), "wk": (L, D, K, Dh), "wv": (L, D, K, Dh), "wo": (L, H, Dh, D),
    "mlp_norm": (L, D), "w_gate": (L, D, F), "w_up": (L, D, F), "w_down": (L, F, D),
  }
  if cfg.qkv_bias:
    layers.update(bq=(L, H, Dh), bk=(L, K, Dh), bv=(L, K, Dh))
  shapes: Params = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
  if not cfg.tie_embeddings:
    shapes["lm_head"] = (D, V)
  return shapes


def init(cfg: ModelConfig, rng: jax.Array, std: float = 0.02) -> Params:
  """Random parameters: normal(std) weights, unit norms, zero biases."""
  shapes = param_shapes(cfg)
  flat, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
    shapes, is_leaf=lambda x: isinstance(x, tuple))[0]]
  keys = jax.random.split(rng, len(flat))
  leaves = []
  for path, shape, key in zip(paths, flat, keys, strict=True):
    if "norm" in path:
      leaves.append(jnp.ones(shape, cfg.weight_dtype))
    elif "'b" in path:  # bq, bk, bv
      leaves.append(jnp.zeros(shape, cfg.weight_dtype))
    else:
      leaves.append((std * jax.random.normal(key, shape, jnp.float32)).astype(cfg.weight_dtype))
  return jax.tree.unflatten(treedef, leaves)


# ------------------------------------------------------------------------------------------------
# Building blocks


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm computed in float32, returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight.astype(x.dtype) * x32.astype(x.dtype)


def rope_frequencies(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies [Dh // 2], with Llama-3 scaling when configured."""
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float32) / cfg.head_dim))
  inv = inv.astype(np.float32)
  if cfg.rope_scaling is not None:
    factor, low, high, original = cfg.rope_scaling
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    inv = np.where(medium, smoothed, scaled).astype(np.float32)
  return inv


def rope_tables(cfg: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  """cos, sin tables [B, T, Dh] for integer positions [B, T]."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_frequencies(cfg))  # [B, T, Dh/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x [B, T, N, Dh] rotated by the half-split convention."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """Position of each token = number of real tokens before it. [B, T] bool -> [B, T] int32."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def _attention(cfg: ModelConfig, q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array) -> jax.Array:
  """Grouped-query attention. q [B,T,H,Dh], k/v [B,S,K,Dh], allowed [B,T,S] bool -> [B,T,H,Dh]."""
  B, T, H, Dh = q.shape
  K = cfg.n_kv_heads
  q = q.reshape(B, T, K, H // K, Dh)
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) / np.sqrt(Dh).astype(np.float32)
  scores = jnp.where(allowed[:, None, None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # [B, K, G, T, S]
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
  return out.reshape(B, T, H, Dh)


def _dense(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
  """x [B, T, *in] times w [*in, *out] -> [B, T, *out], as one 2-D matmul over the B*T rows.

  The same product as an einsum, but XLA:CPU runs the 2-D form about twice as fast forwards and
  backwards (a 3-D dot fuses its elementwise neighbours into a slow loop and its weight gradient
  misses the fast matmul kernel). n_in: how many trailing axes of x are contracted.
  """
  lead, inner, outer = x.shape[:-n_in], w.shape[:n_in], w.shape[n_in:]
  flat = x.reshape(-1, int(np.prod(inner))) @ w.reshape(int(np.prod(inner)), -1)
  return flat.reshape(*lead, *outer)


def _project(x: jax.Array, w: jax.Array | LoraWeight, dt: Any, n_in: int = 1) -> jax.Array:
  """x times a projection weight in compute dtype `dt`; with a LoRA adapter, x W + (x A) B, factorised."""
  if isinstance(w, LoraWeight):
    return _dense(x, w.w.astype(dt), n_in) + _dense(_dense(x, w.a.astype(dt), n_in), w.b.astype(dt))
  return _dense(x, w.astype(dt), n_in)


def _layer(cfg: ModelConfig, lp: Params, x: jax.Array, cos: jax.Array, sin: jax.Array,
           attend: Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]) -> tuple[jax.Array, Any]:
  """One pre-norm block. x [B,T,D] -> ([B,T,D], aux); `attend(q, k, v)` ([B,T,H,Dh], [B,T,K,Dh] x 2 ->
  ([B,T,H,Dh], aux)) attends over these tokens, or writes k, v into a cache (returned as aux) and attends
  over that."""
  dt = cfg.compute_dtype
  h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
  q = _project(h, lp["wq"], dt)  # [B, T, H, Dh]
  k = _project(h, lp["wk"], dt)  # [B, T, K, Dh]
  v = _project(h, lp["wv"], dt)
  if cfg.qkv_bias:
    q, k, v = q + lp["bq"].astype(dt), k + lp["bk"].astype(dt), v + lp["bv"].astype(dt)
  q = constrain(apply_rope(q, cos, sin), ("batch", "length", "heads", "head_dim"))
  k = constrain(apply_rope(k, cos, sin), ("batch", "length", "kv_heads", "head_dim"))
  v = constrain(v, ("batch", "length", "kv_heads", "head_dim"))
  attn, aux = attend(q, k, v)
  x = x + _project(attn, lp["wo"], dt, n_in=2)
  x = constrain(x, ("batch", "length", "embed"))
  h = rms_norm(x, lp["mlp_norm"], cfg.rms_eps)
  gate = _project(h, lp["w_gate"], dt)  # [B, T, F]
  up = _project(h, lp["w_up"], dt)
  hidden = constrain(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
  x = x + _project(hidden, lp["w_down"], dt)
  return constrain(x, ("batch", "length", "embed")), aux


def _embed(cfg: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
  # The lookup gathers whole rows: gather the vocab-sharded table first, so the partitioner need
  # not replicate the gathered activations (which it can only do by a full rematerialisation).
  table = constrain(params["embed"], (None, "embed"))  # [V, D]
  x = jnp.take(table, tokens, axis=0).astype(cfg.compute_dtype)
  return constrain(x, ("batch", "length", "embed"))


def logits_from_hidden(cfg: ModelConfig, params: Params, h: jax.Array) -> jax.Array:
  """Final-normed hidden states [B, T, D] -> float32 logits [B, T, V]."""
  dt = cfg.compute_dtype
  if cfg.tie_embeddings:
    logits = jnp.einsum("btd,vd->btv", h, params["embed"].astype(dt), preferred_element_type=jnp.float32)
  else:
    logits = jnp.einsum("btd,dv->btv", h, params["lm_head"].astype(dt), preferred_element_type=jnp.float32)
  return constrain(logits, ("batch", "length", "vocab"))


# ------------------------------------------------------------------------------------------------
# Full forward


def hidden_states(cfg: ModelConfig, params: Params, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """Final-normed hidden states. tokens [B, T] int32, mask [B, T] bool -> [B, T, D] compute dtype."""
  chex.assert_rank(tokens, 2)  # checked while tracing: free per step
  chex.assert_type(tokens, int)
  chex.assert_equal_shape([tokens, mask])
  T = tokens.shape[1]
  mask = mask.astype(bool)
  cos, sin = rope_tables(cfg, positions_from_mask(mask))
  causal = jnp.tril(jnp.ones((T, T), bool))
  allowed = causal[None] & mask[:, None, :]  # [B, T, S=T]

  def body(x, lp):
    return _layer(cfg, lp, x, cos, sin, lambda q, k, v: (_attention(cfg, q, k, v, allowed), None))[0], None

  if cfg.remat:
    body = jax.checkpoint(body)
  x, _ = jax.lax.scan(body, _embed(cfg, params, tokens), params["layers"])
  return rms_norm(x, params["final_norm"], cfg.rms_eps)


def forward(cfg: ModelConfig, params: Params, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """Next-token logits. tokens [B, T] int32, mask [B, T] bool -> [B, T, V] float32."""
  return logits_from_hidden(cfg, params, hidden_states(cfg, params, tokens, mask))


# ------------------------------------------------------------------------------------------------
# KV-cache path


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype: Any = None, by_slot: bool = False) -> KVCache:
  """Zeroed cache for `batch` rows of up to `length` tokens (prompt plus completion), its axes named; keys
  transposed, or `by_slot` (`KVCache`)."""
  L, K, Dh = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
  dtype = cfg.compute_dtype if dtype is None else dtype
  axes = cache_axes(by_slot)
  k_shape = (L, batch, K, length, Dh) if by_slot else (L, batch, K, Dh, length)
  return KVCache(constrain(jnp.zeros(k_shape, dtype), axes.k),
                 constrain(jnp.zeros((L, batch, K, length, Dh), dtype), axes.v), by_slot)


def cache_axes(by_slot: bool = False) -> KVCache:
  """The cache's logical axes, as a KVCache of names."""
  by_slot_axes = ("layers", "batch", "kv_heads", "cache_length", "head_dim")
  return KVCache(by_slot_axes if by_slot else ("layers", "batch", "kv_heads", "head_dim", "cache_length"),
                 by_slot_axes, by_slot)


def _attend_cache(cfg: ModelConfig, q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array,
                  by_slot: bool = False) -> jax.Array:
  """Grouped-query attention over a cache window. q [B,T,H,Dh], k [B,K,Dh,W] (`by_slot`: [B,K,W,Dh]),
  v [B,K,W,Dh], allowed [B,T,W] -> [B,T,H,Dh]. A decode step (T = 1) drops the length axis: per (row, kv head),
  [G, Dh] @ [Dh, W] @ [W, Dh]."""
  B, T, H, Dh = q.shape
  K = cfg.n_kv_heads
  G = H // K
  scale = np.float32(1 / np.sqrt(Dh))
  q, k = q.astype(jnp.float32), k.astype(jnp.float32)  # scores in float32 (XLA:CPU has no bf16 x bf16 -> f32 here)
  if T == 1:
    q = q.reshape(B, K, G, Dh)
    scores = jnp.einsum("bkgd,bkwd->bkgw" if by_slot else "bkgd,bkdw->bkgw", q, k) * scale
    scores = jnp.where(allowed[:, None], scores, _NEG_INF)  # allowed [B, 1, W]
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgw,bkwd->bkgd", probs, v)
    return out.reshape(B, 1, H, Dh)
  q = q.reshape(B, T, K, G, Dh)
  scores = jnp.einsum("btkgd,bkwd->bkgtw" if by_slot else "btkgd,bkdw->bkgtw", q, k) * scale
  scores = jnp.where(allowed[:, None, None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # [B, K, G, T, W]
  out = jnp.einsum("bkgtw,bkwd->btkgd", probs, v)
  return out.reshape(B, T, H, Dh)


def forward_cached(
  cfg: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array, cache: KVCache,
  index: jax.Array, kv_mask: jax.Array, window: int | None = None, take: jax.Array | None = None,
) -> tuple[jax.Array, KVCache]:
  """Runs `tokens` [B, T] at cache slots index..index+T-1 and returns (logits [B, T, V], cache). What the decode
  engine (rl_lm/rollout/engine.py) needs, and nothing more:

  positions [B, T] int32: rotary positions of the new tokens. kv_mask [B, S] bool: which cache
  slots hold real tokens, the new ones included. Slot s is visible to new token t when
  kv_mask[b, s] and s <= index + t. Prefill is this call with index 0; decoding is T = 1.
  window: attend over cache slots [0, window) only (static; every slot at or before index + T - 1 must
  lie inside it), so a step costs what the filled part of the cache costs, not all S slots. The cache is
  written in place: a step writes T slots per layer, never a new cache.
  index: a scalar (every row writes slots index..index+T-1), or [B] int32 (row b writes slots index[b] ..
  index[b] + T - 1: rows at different lengths, as in continuous batching and multi-turn episodes; slots past
  the cache's end are not written: an idle row writes at S).
  take: [B] int32, the logits of position take[b] of each row alone ([B, 1, V]): a prefill draws from one
  position per row (rows end at different lengths), and with a large vocabulary the others would cost B * T * V
  floats.
  """
  chex.assert_rank(tokens, 2)  # checked while tracing: free per step
  chex.assert_type(tokens, int)
  (B, T), S = tokens.shape, cache.v.shape[3]
  W = S if window is None else window
  chex.assert_shape(positions, (B, T))
  chex.assert_shape(kv_mask, (B, S))
  by_slot = cache.by_slot
  chex.assert_shape(cache.k, (cfg.n_layers, B, cfg.n_kv_heads) + ((S, cfg.head_dim) if by_slot else (cfg.head_dim, S)))
  chex.assert_shape(cache.v, (cfg.n_layers, B, cfg.n_kv_heads, S, cfg.head_dim))
  if not 0 < W <= S:
    raise ValueError(f"window {W} outside (0, {S}]")
  cos, sin = rope_tables(cfg, positions)
  slots = jnp.arange(W)[None, :]
  index = jnp.asarray(index, jnp.int32)
  per_row = index.ndim == 1
  if per_row:
    chex.assert_shape(index, (B,))
    causal = slots[:, None, :] <= (index[:, None] + jnp.arange(T))[:, :, None]  # [B, T, W]
  else:
    causal = (slots <= (index + jnp.arange(T))[:, None])[None]  # [1, T, W]
  allowed = causal & kv_mask[:, :W].astype(bool)[:, None, :]  # [B, T, W]
  rows = jnp.arange(B)
  dt = cfg.compute_dtype

  K, Dh = cfg.n_kv_heads, cfg.head_dim
  window_axes = cache_axes(by_slot)

  def write_by_slot(all_: jax.Array, new: jax.Array, layer: jax.Array) -> jax.Array:
    """new [B, K, T, Dh] into all_ [L, B, K, S, Dh] at the layer's slots index.. (per row: index[b]..)."""
    if per_row and T == 1:  # one slot per row, scattered in place
      return all_.at[layer, rows, :, index].set(new[:, :, 0], mode="drop")
    if per_row:  # T slots per row from index[b]; advanced indices first: values [B, T, K, Dh]
      at = index[:, None] + jnp.arange(T)  # [B, T]
      return all_.at[layer, rows[:, None], :, at].set(jnp.transpose(new, (0, 2, 1, 3)), mode="drop")
    return jax.lax.dynamic_update_slice(all_, new[None], (layer, 0, 0, index, 0))

  def write_transposed(all_: jax.Array, new: jax.Array, layer: jax.Array) -> jax.Array:
    """new [B, K, Dh, T] into all_ [L, B, K, Dh, S], as `write_by_slot`."""
    if per_row and T == 1:
      return all_.at[layer, rows, :, :, index].set(new[..., 0], mode="drop")
    if per_row:
      at = index[:, None] + jnp.arange(T)  # [B, T]
      return all_.at[layer, rows[:, None], :, :, at].set(jnp.transpose(new, (0, 3, 1, 2)), mode="drop")
    return jax.lax.dynamic_update_slice(all_, new[None], (layer, 0, 0, 0, index))

  def body(carry, lp):
    x, k_all, v_all, layer = carry  # k_all [L, B, K, Dh, S] (by slot: [L, B, K, S, Dh]), v_all [L, B, K, S, Dh]

    def attend(q, k, v):  # k, v [B, T, K, Dh]: written at their slots, then the layer's window read back
      if by_slot:
        k_new = write_by_slot(k_all, jnp.transpose(k, (0, 2, 1, 3)).astype(k_all.dtype), layer)
        k_w = jax.lax.dynamic_slice(k_new, (layer, 0, 0, 0, 0), (1, B, K, W, Dh))[0]  # [B, K, W, Dh]
      else:
        k_new = write_transposed(k_all, jnp.transpose(k, (0, 2, 3, 1)).astype(k_all.dtype), layer)
        k_w = jax.lax.dynamic_slice(k_new, (layer, 0, 0, 0, 0), (1, B, K, Dh, W))[0]  # [B, K, Dh, W]
      v_new = write_by_slot(v_all, jnp.transpose(v, (0, 2, 1, 3)).astype(v_all.dtype), layer)
      v_w = jax.lax.dynamic_slice(v_new, (layer, 0, 0, 0, 0), (1, B, K, W, Dh))[0]  # [B, K, W, Dh]
      k_w = constrain(k_w, window_axes.k[1:])
      v_w = constrain(v_w, window_axes.v[1:])
      return _attend_cache(cfg, q, k_w.astype(dt), v_w.astype(dt), allowed, by_slot), (k_new, v_new)

    x, (k_all, v_all) = _layer(cfg, lp, x, cos, sin, attend)
    return (x, k_all, v_all, layer + 1), None

  carry = (_embed(cfg, params, tokens), cache.k, cache.v, jnp.int32(0))
  (x, k, v, _), _ = jax.lax.scan(body, carry, params["layers"])
  if take is not None:
    x = jnp.take_along_axis(x, jnp.clip(take, 0, T - 1).astype(jnp.int32)[:, None, None], axis=1)  # [B, 1, D]
  h = rms_norm(x, params["final_norm"], cfg.rms_eps)
  return logits_from_hidden(cfg, params, h), KVCache(k, v, by_slot)
