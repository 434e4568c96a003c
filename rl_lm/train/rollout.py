"""From prompt texts to scored token arrays: fixed-shape encoding, chunked sampling, decoding.

Every call to the jitted sampler has the same shape (`rows` x `prompt_len`), so a run compiles it
once: prompt lists are padded with copies of their first prompt up to a multiple of `rows`, and the
padding rows are dropped from the results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rl_lm import mesh as mesh_lib
from rl_lm import sampling, tokenizer
from rl_lm.models.presets import ModelConfig


class Sampler:
  """Samples completions for prompt texts with the policy's own (sharded) parameters.

  `dtype` ("" or None: the model's) sets the sampler's compute dtype, so a bfloat16 sampler can
  serve a float32 trainer; the sampler's log-probs then differ from the trainer's, which the RL
  loop measures and corrects.
  """

  def __init__(self, model_cfg: ModelConfig, scfg: sampling.SamplingConfig, tok: tokenizer.Tokenizer, mesh: Mesh,
               rules: mesh_lib.Rules, prompt_len: int, rows: int, dtype: str | None = None):
    self.model_cfg = model_cfg.replace(dtype=dtype) if dtype else model_cfg
    self.scfg, self.tok, self.mesh, self.rules = scfg, tok, mesh, rules
    self.prompt_len, self.rows = prompt_len, rows
    self._generate = sampling.make_generate_fn(self.model_cfg, scfg, mesh, rules)
    self._cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(self.model_cfg.compute_dtype), p))

  def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded prompt ids [n, prompt_len] and lengths [n]; a prompt too long is an error."""
    out = np.full((len(texts), self.prompt_len), self.tok.pad_id, np.int32)
    lengths = np.zeros((len(texts),), np.int32)
    for i, text in enumerate(texts):
      ids = tokenizer.encode_prompt(self.tok, text)
      if len(ids) > self.prompt_len:
        raise ValueError(f"a prompt of {len(ids)} tokens exceeds the prompt length {self.prompt_len} "
                         f"(config.rl.max_prompt_len): {text[:60]!r}")
      out[i, : len(ids)] = ids
      lengths[i] = len(ids)
    return out, lengths

  def sample(self, params: Any, texts: Sequence[str], rng: jax.Array) -> dict[str, np.ndarray]:
    """Samples one completion per text. Returns host arrays (see `sampling.Rollout`) plus `texts`."""
    n = len(texts)
    prompts, lengths = self.encode(texts)
    pad = (-n) % self.rows
    if pad:
      prompts = np.concatenate([prompts, np.repeat(prompts[:1], pad, 0)])
      lengths = np.concatenate([lengths, np.repeat(lengths[:1], pad, 0)])
    params = self._cast(params) if self.model_cfg.compute_dtype != jnp.float32 else params
    chunks = []
    sharding = mesh_lib.batch_sharding(self.mesh, self.rules, (self.rows, self.prompt_len))
    len_sharding = mesh_lib.batch_sharding(self.mesh, self.rules, (self.rows,))
    for c in range(len(prompts) // self.rows):
      sl = slice(c * self.rows, (c + 1) * self.rows)
      out = self._generate(params, mesh_lib.put(prompts[sl], sharding), mesh_lib.put(lengths[sl], len_sharding),
                           jax.random.fold_in(rng, c))
      chunks.append(mesh_lib.fetch(out._asdict()))
    result = {k: np.concatenate([ch[k] for ch in chunks])[:n] for k in chunks[0]}
    P = self.prompt_len
    result["texts"] = [self.tok.decode(result["tokens"][i, P: P + result["lengths"][i]]) for i in range(n)]
    return result
