"""Where a decode step's time goes: the JAX profiler's per-op trace of whole `sampling.generate` calls, by part.

  python -m experiments.benchmarks.sampler_profile [--batch=32] [--new=64,2048] [--steps=64] [--calls=2] [--lines=12]

The fixed shape (preset `bench`: 4 layers, d 256, MLP 1024, 8 x 32 query heads, 2 KV heads, vocab 4096, float32),
16-token prompts, temperature 1, no stop token; every row decodes `--steps` tokens (the cache sized for N).
`experiments.benchmarks.xla_trace` attributes every executed op to the rl_lm source line (and function) that
emitted it; this script sums the ops by part of a decode step and divides by the decode steps:
- projections and MLP: the q, k, v, o, gate, up and down matmuls (`transformer._dense`);
- vocabulary projection: the logits (`logits_from_hidden`, tied embedding);
- layer-loop weight slices: the `lax.scan` over layers copying each layer's weights out of the stacked arrays;
- attention: the two products and the softmax over the cache window (`_attend_cache`);
- cache writes and window reads: the new key/value written in place, the layer's window read back;
- token draw: temperature, inverse CDF, log-prob (`sample_token` and its helpers);
- norms, rotary, SiLU and the rest; bookkeeping of the decode loop (`_generate`).
Ops that run once per call (the prefill) are shown apart. Then the most costly source lines, and the draw alone
at [B, V] with top-k and top-p (a jitted loop of 64 draws), since the benchmark's sampler uses neither.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp

from experiments.benchmarks import xla_trace
from rl_lm import sampling
from rl_lm.models import presets, transformer
from rl_lm.rollout import generate as drivers

PARTS = {  # rl_lm function -> part of a decode step
  "_dense": "projections and MLP (matmuls)",
  "_project": "projections and MLP (matmuls)",
  "logits_from_hidden": "vocabulary projection",
  "forward_cached": "layer-loop weight slices",
  "_attend_cache": "attention over the window",
  "attend": "cache write and window read",
  "sample_token": "token draw",
  "decode_step": "loop bookkeeping",
  "_inverse_cdf": "token draw",
  "_last_positive": "token draw",
  "filter_logits": "token draw",
  "_generate": "loop bookkeeping",
  "step": "loop bookkeeping",
}


def profile(batch: int, new: int, steps: int, calls: int) -> list[xla_trace.Row]:
  """The trace of `calls` generate calls with an N = `new` token cache, every row stopping after `steps` tokens."""
  cfg = presets.get("bench", max_seq_len=max(512, 16 + new))
  params = transformer.init(cfg, jax.random.key(0))
  prompts = jax.random.randint(jax.random.key(1), (batch, 16), 3, cfg.vocab_size, jnp.int32)
  lengths = jnp.full((batch,), 16, jnp.int32)
  scfg = sampling.SamplingConfig(max_new_tokens=new, temperature=1.0)
  stop, budget = sampling.stop_and_budget(scfg, batch, None, steps)
  jitted = jax.jit(functools.partial(drivers.static, cfg, scfg))
  return xla_trace.profile(jitted, params, prompts, lengths, jax.random.key(2), stop, budget, calls=calls)


def by_part(rows: list[xla_trace.Row], steps: int) -> list[tuple[str, float]]:
  """Milliseconds per decode step of each part; ops run fewer than once a step go to 'once per call'."""
  parts: dict[str, float] = {}
  for r in rows:
    per_step = r.executions >= steps - 1
    function = r.function.rsplit(".", 1)[-1]  # nested functions come qualified: "forward_cached.<locals>.attend"
    part = PARTS.get(function, "norms, rotary, SiLU, other") if per_step else "once per call (prefill)"
    parts[part] = parts.get(part, 0.0) + r.ms / steps
  return sorted(parts.items(), key=lambda kv: -kv[1])


def draw_times(batch: int, vocab: int, repeats: int = 10, n: int = 64) -> list[tuple[str, float]]:
  """Milliseconds per draw from [batch, vocab] logits, inside a jitted loop of n draws (median of repeats)."""
  out = []
  for name, extra in (("temperature 1", {}), ("top-k 50", {"top_k": 50}), ("top-p 0.9", {"top_p": 0.9})):
    scfg = sampling.SamplingConfig(max_new_tokens=1, temperature=1.0, **extra)

    def body(_, c, scfg=scfg):
      logits, key = c
      tok, _ = sampling.sample_token(logits, key, scfg)
      return logits + 1e-3 * tok[:, None].astype(jnp.float32), jax.random.fold_in(key, 1)

    loop = jax.jit(lambda c, body=body: jax.lax.fori_loop(0, n, body, c))
    carry = (jax.random.normal(jax.random.key(3), (batch, vocab), jnp.float32), jax.random.key(4))
    jax.block_until_ready(loop(carry))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(loop(carry))
      times.append((time.perf_counter() - start) / n)
    out.append((name, statistics.median(times) * 1e3))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--new", default="64,2048")
  parser.add_argument("--calls", type=int, default=2, help="traced calls per shape (after one warm-up)")
  parser.add_argument("--steps", type=int, default=64, help="decode steps traced per call (the profiler's buffer "
                      "holds a few hundred steps of events)")
  parser.add_argument("--lines", type=int, default=12, help="source lines to list")
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; batch {args.batch}, preset bench, float32")
  for new in (int(n) for n in args.new.split(",")):
    steps = min(new, args.steps)
    rows = profile(args.batch, new, steps, args.calls)
    parts = by_part(rows, steps)
    total = sum(ms for _, ms in parts)
    print(f"\ncache of {16 + new} slots (N = {new}), the first {steps} tokens: ms per decode step, ops summed")
    print("part | ms | share")
    print("--- | --- | ---")
    for part, ms in parts:
      print(f"{part} | {ms:.3f} | {ms / total:.0%}")
    print(f"all ops | {total:.3f} | 100%")
    print(f"\nthe {args.lines} most costly source lines (ms per decode step):")
    print(xla_trace.table(rows, per=steps, top=args.lines))
  print("\ndraw alone from [B, V] logits | ms")
  for name, ms in draw_times(args.batch, presets.get("bench").vocab_size):
    print(f"{name} | {ms:.3f}")


if __name__ == "__main__":
  main()
