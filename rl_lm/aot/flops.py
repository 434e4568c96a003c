"""The analytic count every compiled estimate is checked against, and the model FLOPs that MFU divides.

Matmul FLOPs of the model as rl_lm computes it (rl_lm/models/transformer.py): per token and layer
2 x (the q, k, v, o and MLP weights); attention 4 x H x Dh per key attended (scores and the weighted sum, over
every key of the window: masked keys are computed too); the vocabulary projection 2 x D x V per position whose
logits are made. A backward pass costs twice its forward (input and weight gradients), once where the weights
are frozen (the LoRA base, a reference); rematerialisation (`model.remat`) adds one forward of the layers,
logit chunking (`model.logit_chunk`) one of the vocabulary projection. Elementwise work (norms, softmax, the
optimizer) is not counted: XLA's count exceeds this one by a few percent on real shapes.

Model FLOPs, the numerator of MFU, leave rematerialisation out: 6 N per trained token plus attention
(12 L H Dh per key), N the matmul parameters (layers and the vocabulary projection); 4 N with a frozen LoRA base
(plus 6 per adapter parameter); 2 N per token (plus 4 L H Dh per key) for a forward alone.
"""

from __future__ import annotations

from typing import Any

from rl_lm.models.presets import ModelConfig


def layer_params(cfg: ModelConfig) -> int:
  """Matmul weights of one layer: q, k, v, o and the three MLP projections."""
  d, h, k, hd, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim
  return d * hd * (h + 2 * k) + h * hd * d + 3 * d * f


def matmul_params(cfg: ModelConfig, head: bool = True) -> int:
  """N: the weights every token multiplies (the embedding lookup is a gather, not a matmul)."""
  return cfg.n_layers * layer_params(cfg) + (cfg.d_model * cfg.vocab_size if head else 0)


def lora_params(cfg: ModelConfig, lora: Any) -> int:
  """Adapter weights per layer stack: A [in, r] and B [r, out] of each targeted projection."""
  d, h, k, hd, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim
  shapes = {"wq": (d, h * hd), "wk": (d, k * hd), "wv": (d, k * hd), "wo": (h * hd, d), "w_gate": (d, f),
            "w_up": (d, f), "w_down": (f, d)}
  return cfg.n_layers * sum(lora.rank * sum(shapes[t]) for t in lora.targets)


def forward(cfg: ModelConfig, rows: int, length: int, keys: int, logits: int, head: bool = True) -> dict[str, float]:
  """One forward of `rows` x `length` tokens attending over `keys` keys each, the vocabulary projection on `logits`
  positions per row: {"layers", "attention", "head"} matmul FLOPs, whole slice."""
  tokens = rows * length
  return {"layers": 2.0 * tokens * cfg.n_layers * layer_params(cfg),
          "attention": 4.0 * tokens * cfg.n_layers * cfg.n_heads * cfg.head_dim * keys,
          "head": 2.0 * rows * logits * cfg.d_model * cfg.vocab_size if head else 0.0}


def scored(cfg: ModelConfig, rows: int, length: int, head: bool = True) -> dict[str, float]:
  """`forward` as `scoring.score_tokens` (head=True) or a scalar head (False) runs it over whole sequences."""
  return forward(cfg, rows, length, length, length - 1, head)


def training(cfg: ModelConfig, rows: int, length: int, head: bool = True, lora: Any = None) -> tuple[float, float]:
  """(FLOPs XLA should run, model FLOPs) of a forward and backward over whole sequences."""
  f = scored(cfg, rows, length, head)
  chunked = 0 < cfg.logit_chunk < length - 1
  weights = 2.0 if lora else 3.0  # a frozen base: input gradients only
  hardware = (f["layers"] * (weights + cfg.remat) + f["attention"] * (3.0 + cfg.remat)
              + f["head"] * (weights + chunked))
  model = f["layers"] * weights + f["attention"] * 3.0 + f["head"] * weights
  if lora:
    adapters = 6.0 * rows * length * lora_params(cfg, lora)
    hardware += adapters * (1.0 + cfg.remat / 3.0)
    model += adapters
  return hardware, model


def total(parts: dict[str, float]) -> float:
  return float(sum(parts.values()))
