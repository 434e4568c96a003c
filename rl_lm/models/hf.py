"""Hugging Face checkpoints of the Llama / Qwen2 family: config, weights and tokenizer.

`load(dir)` reads `config.json` and the safetensors weights (one `model.safetensors`, or the
shards listed in `model.safetensors.index.json`) into our parameter tree, stacking the layers
on a leading axis. With a mesh, each stacked tensor is assembled on the host as numpy and
placed straight onto the mesh by its logical axes, so the model never sits whole on one
device. `save(dir, cfg, params)` writes the inverse: a `config.json` that transformers'
`AutoModelForCausalLM` loads, and the weights, sharded by size when large.

Layout (HF `nn.Linear` weights are [out, in]; ours are [in..., out...]):

  model.embed_tokens.weight                [V, D]      embed [V, D]
  model.layers.{l}.input_layernorm.weight  [D]         layers.attn_norm [L, D]
  model.layers.{l}.self_attn.q_proj.weight [H*Dh, D]   layers.wq [L, D, H, Dh]  (W.T.reshape)
  model.layers.{l}.self_attn.k_proj.weight [K*Dh, D]   layers.wk [L, D, K, Dh]  (v_proj: wv)
  model.layers.{l}.self_attn.q_proj.bias   [H*Dh]      layers.bq [L, H, Dh]     (k/v: bk, bv)
  model.layers.{l}.self_attn.o_proj.weight [D, H*Dh]   layers.wo [L, H, Dh, D]
  model.layers.{l}.post_attention_layernorm.weight     layers.mlp_norm [L, D]
  model.layers.{l}.mlp.gate_proj.weight    [F, D]      layers.w_gate [L, D, F]  (up_proj: w_up)
  model.layers.{l}.mlp.down_proj.weight    [D, F]      layers.w_down [L, F, D]
  model.norm.weight                        [D]         final_norm [D]
  lm_head.weight                           [V, D]      lm_head [D, V]  (untied only)

A Llama checkpoint with `attention_bias: true` also has `o_proj.bias`, which our model lacks:
it loads only when that bias is all zeros, and `save` writes zeros there.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so safetensors' numpy framework can return it)
import numpy as np
from jax.sharding import Mesh

from rl_lm import mesh as mesh_lib
from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.tokenizer import HFTokenizer

Params = transformer.Params

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
_HF_CLASS = {v: k for k, v in _ARCHITECTURES.items()}
_DEFAULT_MAX_POS = {"llama": 2048, "qwen2": 32768}
_IGNORED_TENSOR = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_SHARD_FILE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


# ------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


class UnsupportedModelError(ValueError):
  """A `config.json` our model cannot represent (another architecture, rotary scaling, ...); names the field.

  `user_facing`: `rl_lm.main` reports it as one line, as the user's input, not as a bug.
  """

  user_facing = True


class MissingTensorError(KeyError):
  """A tensor the config needs is not in the checkpoint files. The message names it and the files searched."""

  user_facing = True

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ""


def _unsupported(field: str, value: Any, why: str = "") -> UnsupportedModelError:
  return UnsupportedModelError(f"config.json: unsupported {field}={value!r}{': ' + why if why else ''}")


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, tuple[float, float, float, int] | None]:
  """(rope_theta, our rope_scaling tuple) from `rope_parameters` (transformers 5) or `rope_scaling` (legacy)."""
  if hf.get("rope_parameters") is not None:
    field, params = "rope_parameters", hf["rope_parameters"]
  else:
    field, params = "rope_scaling", hf.get("rope_scaling")
  params = dict(params or {})
  if any(isinstance(v, dict) for v in params.values()):
    raise _unsupported(field, params, "per-layer-type rope parameters")
  theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
  kind = params.get("rope_type", params.get("type", "default"))
  if params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
    raise _unsupported("partial_rotary_factor", params.get("partial_rotary_factor", hf.get("partial_rotary_factor")))
  if kind in (None, "default"):
    return theta, None
  if kind != "llama3":
    raise _unsupported(f"{field}.rope_type", kind, "only 'default' and 'llama3' rotary embeddings are supported")
  try:
    scaling = (
      float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"]),
      int(params["original_max_position_embeddings"]),
    )
  except KeyError as e:
    raise UnsupportedModelError(f"config.json: {field} of rope_type 'llama3' lacks {e.args[0]!r}: {params}") from None
  return theta, scaling


def config_from_hf(hf_config: dict[str, Any]) -> ModelConfig:
  """The ModelConfig of a Hugging Face `config.json` dict (LlamaForCausalLM or Qwen2ForCausalLM).

  Raises UnsupportedModelError (a ValueError) naming the field for anything our model cannot
  represent: another architecture, rotary scaling other than Llama-3's, sliding-window attention,
  MLP or output biases, another activation, quantized weights. Compute and parameter dtypes are left at the
  ModelConfig defaults (`load` sets them).
  """
  hf = hf_config
  archs = hf.get("architectures") or []
  model_type = hf.get("model_type")
  if archs:
    if len(archs) != 1 or archs[0] not in _ARCHITECTURES:
      raise _unsupported("architectures", archs, f"supported: {sorted(_ARCHITECTURES)}")
    arch = _ARCHITECTURES[archs[0]]
    if model_type is not None and model_type != arch:
      raise _unsupported("model_type", model_type, f"architectures is {archs} (model_type {arch!r})")
  elif model_type in _HF_CLASS:
    arch = model_type
  else:
    raise _unsupported("model_type", model_type, f"supported: {sorted(_HF_CLASS)} (and no 'architectures' given)")

  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise _unsupported("hidden_act", act, "the MLP is SwiGLU (silu)")
  if hf.get("mlp_bias", False):
    raise _unsupported("mlp_bias", hf["mlp_bias"])
  if hf.get("quantization_config") is not None:
    raise _unsupported("quantization_config", hf["quantization_config"].get("quant_method", "?"))
  layer_types = hf.get("layer_types")
  if layer_types is not None:
    if any(t != "full_attention" for t in layer_types):
      raise _unsupported("layer_types", sorted(set(layer_types)), "only full_attention layers")
  elif (hf.get("use_sliding_window", False) and hf.get("sliding_window") is not None
        and hf.get("max_window_layers", 28) < hf.get("num_hidden_layers", 0)):
    # Qwen2: layers from max_window_layers on would use sliding-window attention.
    raise _unsupported("use_sliding_window", hf["use_sliding_window"],
                       f"sliding-window attention (sliding_window={hf['sliding_window']}, "
                       f"max_window_layers={hf.get('max_window_layers', 28)})")
  if hf.get("use_mrope", False):
    raise _unsupported("use_mrope", hf["use_mrope"])
  if arch == "qwen2":
    qkv_bias = True
  else:
    qkv_bias = bool(hf.get("attention_bias", False))

  def req(name: str) -> Any:
    if hf.get(name) is None:
      raise UnsupportedModelError(f"config.json: missing required field {name!r}")
    return hf[name]

  d_model, n_heads = int(req("hidden_size")), int(req("num_attention_heads"))
  head_dim = hf.get("head_dim") or d_model // n_heads
  theta, scaling = _rope_from_hf(hf)
  return ModelConfig(
    vocab_size=int(req("vocab_size")),
    d_model=d_model,
    n_layers=int(req("num_hidden_layers")),
    n_heads=n_heads,
    n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
    head_dim=int(head_dim),
    mlp_dim=int(req("intermediate_size")),
    max_seq_len=int(hf.get("max_position_embeddings") or _DEFAULT_MAX_POS[arch]),
    rope_theta=theta,
    rope_scaling=scaling,
    rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
    qkv_bias=qkv_bias,
    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    architecture=arch,
  )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
  """The `config.json` dict of `cfg`, in the form transformers 5 writes (readable by transformers 4 too)."""
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
  if cfg.rope_scaling is not None:
    factor, low, high, original = cfg.rope_scaling
    rope.update(rope_type="llama3", factor=float(factor), low_freq_factor=float(low), high_freq_factor=float(high),
                original_max_position_embeddings=int(original))
  out: dict[str, Any] = {
    "architectures": [_HF_CLASS[cfg.architecture]],
    "model_type": cfg.architecture,
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.d_model,
    "intermediate_size": cfg.mlp_dim,
    "num_hidden_layers": cfg.n_layers,
    "num_attention_heads": cfg.n_heads,
    "num_key_value_heads": cfg.n_kv_heads,
    "head_dim": cfg.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": cfg.max_seq_len,
    "rms_norm_eps": cfg.rms_eps,
    "rope_parameters": rope,
    # transformers < 5 reads these two instead of rope_parameters.
    "rope_theta": float(cfg.rope_theta),
    "rope_scaling": None if cfg.rope_scaling is None else {k: v for k, v in rope.items() if k != "rope_theta"},
    "tie_word_embeddings": cfg.tie_embeddings,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "dtype": cfg.param_dtype,
    "torch_dtype": cfg.param_dtype,
  }
  if cfg.architecture == "llama":
    out.update(attention_bias=cfg.qkv_bias, mlp_bias=False, pretraining_tp=1)
  else:
    if not cfg.qkv_bias:
      raise ValueError("a qwen2 ModelConfig must have qkv_bias=True (Qwen2ForCausalLM always has q/k/v biases)")
    out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layers,
               layer_types=["full_attention"] * cfg.n_layers)
  return out


# ------------------------------------------------------------------------------------------------
# Tensor name mapping


class _Tensor(NamedTuple):
  """One of our parameter leaves and the HF tensor(s) it comes from.

  `path` is the key path in our tree; `hf_name` has `{l}` for a stacked layer tensor; `n_in` is
  how many leading dims (after the layer axis) of ours form the HF input dim of a matrix, 0 for
  a vector that HF stores flat (norms, biases), None for a tensor stored as it is (the embedding).
  """

  path: tuple[str, ...]
  hf_name: str
  n_in: int | None


def _tensors(cfg: ModelConfig) -> list[_Tensor]:
  p = "model.layers.{l}."
  out = [_Tensor(("embed",), "model.embed_tokens.weight", None)]
  layer = [
    ("attn_norm", "input_layernorm.weight", 0),
    ("wq", "self_attn.q_proj.weight", 1), ("wk", "self_attn.k_proj.weight", 1), ("wv", "self_attn.v_proj.weight", 1),
  ]
  if cfg.qkv_bias:
    layer += [(f"b{x}", f"self_attn.{x}_proj.bias", 0) for x in "qkv"]
  layer += [
    ("wo", "self_attn.o_proj.weight", 2), ("mlp_norm", "post_attention_layernorm.weight", 0),
    ("w_gate", "mlp.gate_proj.weight", 1), ("w_up", "mlp.up_proj.weight", 1), ("w_down", "mlp.down_proj.weight", 1),
  ]
  out += [_Tensor(("layers", ours), p + theirs, n_in) for ours, theirs, n_in in layer]
  out.append(_Tensor(("final_norm",), "model.norm.weight", 0))
  if not cfg.tie_embeddings:
    out.append(_Tensor(("lm_head",), "lm_head.weight", 1))
  return out


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """The Hugging Face name and shape of every tensor `load` needs for `cfg` (not the all-zero o_proj bias of a
  Llama with attention bias, which it also accepts)."""
  shapes = transformer.param_shapes(cfg)
  out = {}
  for t in _tensors(cfg):
    shape = tuple(_get(shapes, t.path))
    if "{l}" in t.hf_name:
      out.update({t.hf_name.format(l=i): _hf_shape(shape[1:], t.n_in) for i in range(cfg.n_layers)})
    else:
      out[t.hf_name] = _hf_shape(shape, t.n_in)
  return out


def _o_proj_bias(cfg: ModelConfig) -> bool:
  """Whether the HF model has an o_proj bias (Llama with attention_bias) that we keep at zero."""
  return cfg.architecture == "llama" and cfg.qkv_bias


def _hf_shape(ours: tuple[int, ...], n_in: int | None) -> tuple[int, ...]:
  """HF shape of one (per-layer) tensor of ours."""
  if n_in is None:
    return tuple(ours)
  if n_in == 0:
    return (math.prod(ours),)
  return (math.prod(ours[n_in:]), math.prod(ours[:n_in]))


def _to_ours(w: np.ndarray, ours: tuple[int, ...], n_in: int | None) -> np.ndarray:
  return w.T.reshape(ours) if n_in else w.reshape(ours)


def _to_hf(x: np.ndarray, n_in: int | None) -> np.ndarray:
  if n_in:
    return np.ascontiguousarray(x.reshape(math.prod(x.shape[:n_in]), -1).T)
  return np.ascontiguousarray(x.reshape(_hf_shape(x.shape, n_in)))


def _get(tree: Params, path: tuple[str, ...]) -> Any:
  for k in path:
    tree = tree[k]
  return tree


def _set(tree: Params, path: tuple[str, ...], value: Any) -> None:
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


# ------------------------------------------------------------------------------------------------
# Loading


class _Reader:
  """Tensors of a checkpoint directory, from one safetensors file or an index of shards."""

  def __init__(self, directory: str, stack: contextlib.ExitStack) -> None:
    from safetensors import safe_open

    self.dir = directory
    index = os.path.join(directory, INDEX_FILE)
    single = os.path.join(directory, WEIGHTS_FILE)
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f).get("weight_map")
      if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: no 'weight_map' dict")
      self.where: dict[str, str] = dict(weight_map)
      self.files = sorted(set(self.where.values()))
      self.searched = f"{INDEX_FILE} (shards {', '.join(self.files)})"
    elif os.path.exists(single):
      self.files = [WEIGHTS_FILE]
      self.where = {}
      self.searched = WEIGHTS_FILE
    else:
      others = sorted(f for f in os.listdir(directory) if f.endswith((".bin", ".pt", ".pth", ".safetensors")))
      raise FileNotFoundError(
        f"{directory}: neither {WEIGHTS_FILE} nor {INDEX_FILE}" + (f" (found {others}; only safetensors load)"
                                                                    if others else "")
      )
    self.handles, self.keys = {}, {}
    for name in self.files:
      path = os.path.join(directory, name)
      if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: listed in {INDEX_FILE} but missing")
      self.handles[name] = stack.enter_context(safe_open(path, framework="numpy"))
      self.keys[name] = set(self.handles[name].keys())
    if not self.where:
      self.where = dict.fromkeys(self.keys[WEIGHTS_FILE], WEIGHTS_FILE)

  def names(self) -> set[str]:
    return set(self.where)

  def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Tensor `name` as numpy (bfloat16 as ml_dtypes.bfloat16), checked to have `shape`."""
    file = self.where.get(name)
    if file is None:
      raise MissingTensorError(f"{self.dir}: tensor {name!r} not found (searched {self.searched})")
    handle = self.handles[file]
    if name not in self.keys[file]:
      raise MissingTensorError(f"{self.dir}: tensor {name!r} not in {file}, where {INDEX_FILE} says it is")
    got = tuple(handle.get_slice(name).get_shape())
    if got != tuple(shape):
      raise ValueError(
        f"{self.dir}: tensor {name!r} in {file} has shape {got}, expected {tuple(shape)} from config.json")
    return handle.get_tensor(name)


def _place(arr: np.ndarray, axes: tuple[str, ...], mesh: Mesh | None, rules: mesh_lib.Rules) -> jax.Array:
  if mesh is None:
    return jax.device_put(arr)
  sharding = mesh_lib.named_sharding(mesh, axes, rules, arr.shape)
  return jax.make_array_from_callback(arr.shape, sharding, lambda index: arr[index])


def load(
  checkpoint_dir: str, mesh: Mesh | None = None, rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES,
  dtype: str | None = None, param_dtype: str = "float32",
) -> tuple[ModelConfig, Params]:
  """Reads a Hugging Face checkpoint directory into (ModelConfig, params).

  dtype: compute dtype of the returned config (None keeps the ModelConfig default, float32);
  param_dtype: the dtype the weights are converted to, whatever the checkpoint stores.
  With `mesh`, each parameter is placed sharded by its logical axes (`rules`) as it is read;
  otherwise on the default device. Raises MissingTensorError (a KeyError) naming a tensor the
  config needs and the files searched, UnsupportedModelError (a ValueError) for a config.json it
  cannot read or represent, ValueError for tensors the model would not use and for tensors of the
  wrong shape, FileNotFoundError without safetensors weights.
  """
  path = os.path.join(checkpoint_dir, CONFIG_FILE)
  with open(path, encoding="utf-8") as f:
    try:
      hf_config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise UnsupportedModelError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(hf_config, dict):
    raise UnsupportedModelError(f"{path}: expected a JSON object, got {type(hf_config).__name__}")
  try:
    cfg = config_from_hf(hf_config)
  except UnsupportedModelError as e:
    raise UnsupportedModelError(os.path.join(checkpoint_dir, str(e))) from None  # "<dir>/config.json: ..."
  cfg = cfg.replace(param_dtype=param_dtype, **({"dtype": dtype} if dtype is not None else {}))
  np_dtype = np.dtype(cfg.weight_dtype)
  shapes, axes = transformer.param_shapes(cfg), transformer.param_axes(cfg)
  specs = _tensors(cfg)

  with contextlib.ExitStack() as stack:
    reader = _Reader(checkpoint_dir, stack)
    expected = set()
    for t in specs:
      expected.update({t.hf_name.format(l=i) for i in range(cfg.n_layers)} if "{l}" in t.hf_name else {t.hf_name})
    if _o_proj_bias(cfg):
      expected.update(f"model.layers.{i}.self_attn.o_proj.bias" for i in range(cfg.n_layers))
    available = reader.names()
    extra = sorted(n for n in available - expected
                   if not _IGNORED_TENSOR.search(n) and not (cfg.tie_embeddings and n == "lm_head.weight"))
    if extra:
      shown = ", ".join(extra[:8]) + (f", ... ({len(extra)} in all)" if len(extra) > 8 else "")
      raise ValueError(f"{checkpoint_dir}: unexpected tensors for a {cfg.architecture} config: {shown}")
    missing = sorted(expected - available)
    if missing:
      raise MissingTensorError(f"{checkpoint_dir}: tensor {missing[0]!r} not found (searched {reader.searched})"
                               + (f"; {len(missing) - 1} more missing" if len(missing) > 1 else ""))

    params: Params = {}
    for t in specs:
      shape = tuple(_get(shapes, t.path))
      if "{l}" in t.hf_name:
        arr = np.empty(shape, np_dtype)
        for i in range(cfg.n_layers):
          w = reader.get(t.hf_name.format(l=i), _hf_shape(shape[1:], t.n_in))
          arr[i] = _to_ours(w, shape[1:], t.n_in).astype(np_dtype)
      else:
        w = reader.get(t.hf_name, _hf_shape(shape, t.n_in))
        arr = np.ascontiguousarray(_to_ours(w, shape, t.n_in).astype(np_dtype))
      _set(params, t.path, _place(arr, tuple(_get(axes, t.path)), mesh, rules))
      del arr
    if _o_proj_bias(cfg):
      for i in range(cfg.n_layers):
        name = f"model.layers.{i}.self_attn.o_proj.bias"
        if np.any(reader.get(name, (cfg.d_model,)).astype(np.float32) != 0):
          raise ValueError(f"{checkpoint_dir}: tensor {name!r} is nonzero; our model has no attention output bias")
  return cfg, params


# ------------------------------------------------------------------------------------------------
# Saving


def _host(x: Any) -> np.ndarray:
  return np.asarray(jax.device_get(x))


def _hf_tensors(cfg: ModelConfig, params: Params) -> Iterator[tuple[str, tuple[int, ...], Any]]:
  """(HF name, HF shape, thunk giving the numpy tensor) for every tensor to write, in HF order."""
  np_dtype = np.dtype(cfg.weight_dtype)
  shapes = transformer.param_shapes(cfg)

  def check(t: _Tensor) -> Any:
    leaf = _get(params, t.path)
    want = tuple(_get(shapes, t.path))
    if tuple(leaf.shape) != want:
      raise ValueError(f"params[{'.'.join(t.path)}] has shape {tuple(leaf.shape)}, expected {want} from the config")
    return leaf

  specs = _tensors(cfg)
  for t in specs:
    if "{l}" not in t.hf_name:
      leaf = check(t)
      yield t.hf_name, _hf_shape(tuple(leaf.shape), t.n_in), lambda leaf=leaf, t=t: _to_hf(
        _host(leaf).astype(np_dtype), t.n_in)
  layer_specs = [t for t in specs if "{l}" in t.hf_name]
  leaves = {t.path: check(t) for t in layer_specs}
  for i in range(cfg.n_layers):
    for t in layer_specs:
      leaf = leaves[t.path]
      yield t.hf_name.format(l=i), _hf_shape(tuple(leaf.shape[1:]), t.n_in), lambda leaf=leaf, t=t, i=i: _to_hf(
        _host(leaf[i]).astype(np_dtype), t.n_in)
    if _o_proj_bias(cfg):
      yield f"model.layers.{i}.self_attn.o_proj.bias", (cfg.d_model,), lambda: np.zeros((cfg.d_model,), np_dtype)


def save(checkpoint_dir: str, cfg: ModelConfig, params: Params, max_shard_bytes: int = 2**31) -> None:
  """Writes `cfg` and `params` as a Hugging Face checkpoint (config.json + safetensors).

  Tensors are stored in `cfg.param_dtype`. When they total more than `max_shard_bytes`, they are
  split over `model-0000i-of-0000n.safetensors` files listed in `model.safetensors.index.json`.
  Sharded arrays are gathered to the host one layer slice at a time (single-process meshes).
  Weight files of an earlier save in the directory are replaced.
  """
  from safetensors.numpy import save_file

  os.makedirs(checkpoint_dir, exist_ok=True)
  itemsize = np.dtype(cfg.weight_dtype).itemsize
  tensors = list(_hf_tensors(cfg, params))
  shards: list[list[tuple[str, Any]]] = [[]]
  size = 0
  for name, shape, thunk in tensors:
    nbytes = math.prod(shape) * itemsize
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append((name, thunk))
    size += nbytes
  total = sum(math.prod(shape) * itemsize for _, shape, _ in tensors)

  files = [WEIGHTS_FILE] if len(shards) == 1 else [
    f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  for old in os.listdir(checkpoint_dir):
    if (old in (WEIGHTS_FILE, INDEX_FILE) or _SHARD_FILE.match(old)) and old not in files:
      os.remove(os.path.join(checkpoint_dir, old))
  weight_map = {}
  for file, shard in zip(files, shards, strict=True):
    save_file({name: thunk() for name, thunk in shard}, os.path.join(checkpoint_dir, file), metadata={"format": "pt"})
    weight_map.update((name, file) for name, _ in shard)
  if len(files) > 1:
    with open(os.path.join(checkpoint_dir, INDEX_FILE), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  with open(os.path.join(checkpoint_dir, CONFIG_FILE), "w") as f:
    json.dump(config_to_hf(cfg), f, indent=2)


def load_tokenizer(checkpoint_dir: str) -> HFTokenizer:
  """The tokenizer of a checkpoint directory (tokenizer.json, with specials from tokenizer_config.json)."""
  return HFTokenizer(checkpoint_dir)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def export(out_dir: str, cfg: ModelConfig, params: Params, tokenizer_dir: str | None = None) -> list[str]:
  """A folder that transformers' `AutoModelForCausalLM` / `AutoTokenizer` load: `save(out_dir, cfg, params)` (merge
  LoRA adapters first, `lora.merge`) plus the tokenizer files of `tokenizer_dir` (the checkpoint the run started
  from), chat template included. Returns the files written."""
  import shutil

  save(out_dir, cfg, params)
  copied = []
  for name in TOKENIZER_FILES if tokenizer_dir else ():
    src = os.path.join(tokenizer_dir, name)
    if os.path.isfile(src):
      shutil.copyfile(src, os.path.join(out_dir, name))
      copied.append(name)
  return sorted(os.listdir(out_dir))
