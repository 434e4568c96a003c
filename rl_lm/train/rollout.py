"""From prompt texts to scored token arrays: fixed-shape encoding, chunked sampling, decoding.

Every call to the jitted sampler (or scorer) has the same shape (`rows` x `prompt_len`), so a run
compiles it once: `in_batches` pads the rows with copies of the first up to a multiple of `rows`,
calls it chunk by chunk, and drops the padding rows from the results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rl_lm import keys, sampling, tokenizer
from rl_lm import mesh as mesh_lib
from rl_lm.models.presets import ModelConfig


def in_batches(fn: Callable[[int, dict[str, jax.Array]], Any], arrays: Mapping[str, np.ndarray], rows: int,
               mesh: Mesh, rules: mesh_lib.Rules) -> Any:
  """`fn(c, chunk)` on chunk c of `rows` rows of `arrays` (each [n, ...]; the rows padded by repeating the first
  to a multiple of `rows`), the chunk placed on the mesh with the batch sharding. Returns fn's outputs (a pytree
  of [rows, ...] arrays) on the host, the chunks concatenated and the padding rows dropped: [n, ...] each."""
  n = len(next(iter(arrays.values())))
  pad = (-n) % rows
  arrays = {k: np.concatenate([v, np.repeat(v[:1], pad, 0)]) for k, v in arrays.items()}
  chunks = []
  for c in range((n + pad) // rows):
    chunk = {k: v[c * rows: (c + 1) * rows] for k, v in arrays.items()}
    placed = {k: mesh_lib.put(v, mesh_lib.batch_sharding(mesh, rules, v.shape)) for k, v in chunk.items()}
    chunks.append(mesh_lib.fetch(fn(c, placed)))
  return jax.tree.map(lambda *xs: np.concatenate(xs)[:n], *chunks)


def embed_sharding(mesh: Mesh, rules: mesh_lib.Rules, shape: Sequence[int]) -> jax.sharding.NamedSharding:
  """How the sampler holds the embedding table [V, D]: whole along the vocabulary, the layout `transformer._embed`
  constrains it to before each lookup. Inside the decode loop that constraint is an all-gather of the whole table
  per token (1 GiB for Llama-3.1-8B in bfloat16 when the vocabulary is sharded); held so, it is one per rollout.
  Where the vocabulary is not sharded (no tensor axis) this is the table's own sharding and nothing moves."""
  return mesh_lib.named_sharding(mesh, (None, "embed"), rules, shape)


class Sampler:
  """Samples completions for prompt texts with the policy's own (sharded) parameters.

  `dtype` ("" or None: the model's) sets the sampler's compute dtype, so a bfloat16 sampler can
  serve a float32 trainer; the sampler's log-probs then differ from the trainer's, which the RL
  loop measures and corrects.
  """

  def __init__(self, model_cfg: ModelConfig, scfg: sampling.SamplingConfig, tok: tokenizer.Tokenizer, mesh: Mesh,
               rules: mesh_lib.Rules, prompt_len: int, rows: int, dtype: str | None = None, gather: bool = False):
    self.model_cfg = model_cfg.replace(dtype=dtype) if dtype else model_cfg
    # `gather` (rl.sampler_gather): the weights gathered over the fsdp axis, once a rollout, rather than by every
    # decode step (FSDP's own pattern, all the weights a token); the rows stay split over it.
    self.gather = gather and mesh is not None and mesh.shape.get("fsdp", 1) > 1
    rules = mesh_lib.without_axis(rules, "fsdp") if self.gather else rules
    self.scfg, self.tok, self.mesh, self.rules = scfg, tok, mesh, rules
    self.prompt_len, self.rows = prompt_len, rows
    self._generate = sampling.make_generate_fn(self.model_cfg, scfg, mesh, rules)  # static or continuous batching
    self._cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(self.model_cfg.compute_dtype), p))
    self._whole_embed: Any = None  # jit(copy of the embedding table, whole along the vocabulary), made when needed
    self._gathered: Any = None  # with `gather`: jit(the weights cast and gathered over fsdp), made when needed

  def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded prompt ids [n, prompt_len] and lengths [n]; a prompt too long is an error."""
    out = np.full((len(texts), self.prompt_len), self.tok.pad_id, np.int32)
    lengths = np.zeros((len(texts),), np.int32)
    for i, text in enumerate(texts):
      ids = self.tok.encode_prompt(text)
      if len(ids) > self.prompt_len:
        raise ValueError(f"a prompt of {len(ids)} tokens exceeds the prompt length {self.prompt_len} "
                         f"(config.rl.max_prompt_len): {text[:60]!r}")
      out[i, : len(ids)] = ids
      lengths[i] = len(ids)
    return out, lengths

  def params(self, params: Any) -> Any:
    """The policy's parameters as the sampler takes them: in its compute dtype (unless float32) and the embedding
    table whole along the vocabulary (`embed_sharding`); with `gather`, every weight whole over the fsdp axis (one
    copy per chip for the rollout: the weights' bytes over the tensor axis, in the sampler's dtype)."""
    if self.gather:
      if self._gathered is None:
        dtype, whole = self.model_cfg.compute_dtype, lambda x: mesh_lib.drop_axis(x.sharding, "fsdp")  # noqa: E731
        targets = {**jax.tree.map(whole, params),
                   "embed": embed_sharding(self.mesh, self.rules, params["embed"].shape)}
        cast = (lambda x: x) if dtype == jnp.float32 else (lambda x: x.astype(dtype))  # noqa: E731
        self._gathered = jax.jit(lambda p: jax.tree.map(cast, p), out_shardings=targets)
      return self._gathered(params)
    params = self._cast(params) if self.model_cfg.compute_dtype != jnp.float32 else params
    target = embed_sharding(self.mesh, self.rules, params["embed"].shape)
    if not params["embed"].sharding.is_equivalent_to(target, 2):
      if self._whole_embed is None:  # a jitted copy: it reshards arrays that span several processes too
        self._whole_embed = jax.jit(lambda x: x, out_shardings=target)
      params = {**params, "embed": self._whole_embed(params["embed"])}
    return params

  def dispatch(self, params: Any, texts: Sequence[str], rng: jax.Array) -> sampling.Rollout:
    """Starts sampling one completion for each of exactly `rows` texts, for training, and returns at once: the
    rollout is computed on the device (JAX dispatch is asynchronous) while the host goes on."""
    if len(texts) != self.rows:
      raise ValueError(f"Sampler.rollout takes exactly {self.rows} prompts, got {len(texts)}")
    prompts, lengths = self.encode(texts)
    params = self.params(params)
    put = lambda x: mesh_lib.put(x, mesh_lib.batch_sharding(self.mesh, self.rules, x.shape))
    return self._generate(params, put(prompts), put(lengths), keys.fold(rng, 0))

  def finish(self, out: sampling.Rollout) -> tuple[dict[str, np.ndarray], list[str]]:
    """Waits for a dispatched rollout and brings tokens, lengths and `finished` to the host (once), to decode the
    completions; the rollout itself stays on the device. Returns (those host arrays, the completion texts)."""
    host = mesh_lib.fetch({"tokens": out.tokens, "lengths": out.lengths, "finished": out.finished})
    P = self.prompt_len
    return host, [self.tok.decode(host["tokens"][i, P: P + host["lengths"][i]]) for i in range(self.rows)]

  def rollout(self, params: Any, texts: Sequence[str], rng: jax.Array
              ) -> tuple[sampling.Rollout, dict[str, np.ndarray], list[str]]:
    """`dispatch` then `finish`: (device rollout, host arrays, completion texts)."""
    out = self.dispatch(params, texts, rng)
    return (out, *self.finish(out))

  def sample(self, params: Any, texts: Sequence[str], rng: jax.Array) -> dict[str, np.ndarray]:
    """Samples one completion per text. Returns host arrays (see `sampling.Rollout`) plus `texts`."""
    prompts, lengths = self.encode(texts)
    params = self.params(params)
    generate = lambda c, b: self._generate(params, b["prompts"], b["lengths"], keys.fold(rng, c))
    result = in_batches(generate, {"prompts": prompts, "lengths": lengths}, self.rows, self.mesh, self.rules)._asdict()
    P = self.prompt_len
    result["texts"] = [self.tok.decode(result["tokens"][i, P: P + result["lengths"][i]]) for i in range(len(texts))]
    return result
