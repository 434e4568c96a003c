"""Where a decode step's time goes: each part of one step jitted alone at the sampler benchmark's fixed shape.

  python -m experiments.benchmarks.sampler_profile [--batch=32] [--new=64,2048] [--repeats=20]

For each completion budget N (cache S = 16 + N slots), at a step in the middle of the first 64 tokens:
- the whole in-loop step (`sampling.generate` at N tokens minus at 1, over N - 1; as in sampler.py);
- one cached forward of the batch's [B, 1] tokens (`transformer.forward_cached`), and its parts:
  attention over the cache window (all layers), the cache write (all layers, in place), the vocabulary
  projection, and the rest (the projections, MLPs and norms);
- drawing the tokens from [B, V] logits: temperature only, with top-k 50, with top-p 0.9;
- bookkeeping: the step minus the forward and the draw.
Also XLA's own estimate of each jitted part's bytes accessed (`cost_analysis`). Times are medians of
`--repeats` calls, each averaged over 10 back-to-back executions.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from rl_lm import sampling
from rl_lm.models import presets, transformer


def _time(fn, *args, repeats: int, inner: int = 10) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(inner):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / inner)
  return statistics.median(times)


def _bytes(fn, *args) -> float:
  cost = fn.lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float(cost.get("bytes accessed", float("nan")))


def profile(batch: int, new: int, repeats: int) -> list[tuple[str, float, float]]:
  cfg = presets.get("bench")
  params = transformer.init(cfg, jax.random.key(0))
  P, S, B = 16, 16 + new, batch
  t = P + min(new, 64) // 2  # the step's cache index
  prompts = jax.random.randint(jax.random.key(1), (B, P), 3, cfg.vocab_size, jnp.int32)
  lengths = jnp.full((B,), P, jnp.int32)
  rng = jax.random.key(2)
  rows = []

  gen = sampling.make_generate_fn(cfg, sampling.SamplingConfig(max_new_tokens=new, temperature=1.0))
  budget = min(new, 64)
  t_n = _time(lambda: gen(params, prompts, lengths, rng, max_new_tokens=jnp.full((B,), budget, jnp.int32)).tokens,
              repeats=max(3, repeats // 4), inner=1)
  t_1 = _time(lambda: gen(params, prompts, lengths, rng, max_new_tokens=jnp.ones((B,), jnp.int32)).tokens,
              repeats=max(3, repeats // 4), inner=1)
  step = (t_n - t_1) / (budget - 1)
  rows.append(("in-loop decode step (all of it)", step, float("nan")))

  cache = transformer.init_cache(cfg, B, S)
  tok = jnp.zeros((B, 1), jnp.int32)
  pos = jnp.full((B, 1), t, jnp.int32)
  kv_mask = jnp.broadcast_to(jnp.arange(S)[None, :] <= t, (B, S))
  window = sampling.decode_windows(P, new, 64)[0]
  fwd = jax.jit(lambda p, c: transformer.forward_cached(cfg, p, tok, pos, c, t, kv_mask, window=window)[0])
  t_fwd = _time(fwd, params, cache, repeats=repeats)
  rows.append((f"cached forward, [B, 1] tokens, window {window} of {S} slots", t_fwd, _bytes(fwd, params, cache)))

  q = jnp.ones((B, 1, cfg.n_heads, cfg.head_dim), jnp.float32)
  allowed = kv_mask[:, None, :window]
  attn = jax.jit(lambda k, v: jax.vmap(lambda k_l, v_l: transformer._attention(cfg, q, k_l, v_l, allowed))(
    k[:, :, :window], v[:, :, :window]))
  t_attn = _time(attn, cache.k, cache.v, repeats=repeats)
  rows.append((f"  attention over {window} slots, {cfg.n_layers} layers", t_attn, _bytes(attn, cache.k, cache.v)))

  kv = jnp.ones((cfg.n_layers, B, 1, cfg.n_kv_heads, cfg.head_dim), jnp.float32)
  write = jax.jit(lambda c: transformer.KVCache(jax.lax.dynamic_update_slice(c.k, kv, (0, 0, t, 0, 0)),
                                                jax.lax.dynamic_update_slice(c.v, kv, (0, 0, t, 0, 0))),
                  donate_argnums=(0,))
  state = {"cache": transformer.init_cache(cfg, B, S)}

  def write_once():
    state["cache"] = write(state["cache"])
    return state["cache"].k

  t_write = _time(write_once, repeats=repeats)
  rows.append((f"  cache write, {cfg.n_layers} layers, in place", t_write, float("nan")))

  h = jnp.ones((B, 1, cfg.d_model), jnp.float32)
  head = jax.jit(lambda p, h: transformer.logits_from_hidden(cfg, p, h))
  t_head = _time(head, params, h, repeats=repeats)
  rows.append((f"  vocabulary projection, d {cfg.d_model} x V {cfg.vocab_size}", t_head, _bytes(head, params, h)))
  rows.append(("  the rest: projections, MLPs, norms, embedding", t_fwd - t_attn - t_write - t_head, float("nan")))

  logits = jax.random.normal(jax.random.key(3), (B, cfg.vocab_size), jnp.float32)
  t_draw = None
  for name, extra in (("temperature 1", {}), ("top-k 50", {"top_k": 50}), ("top-p 0.9", {"top_p": 0.9})):
    scfg = sampling.SamplingConfig(max_new_tokens=1, temperature=1.0, **extra)
    draw = jax.jit(lambda x, r, scfg=scfg: sampling.sample_token(x, r, scfg))
    t_d = _time(draw, logits, rng, repeats=repeats)
    t_draw = t_d if t_draw is None else t_draw
    rows.append((f"draw from [B, V] logits, {name}", t_d, _bytes(draw, logits, rng)))
  rows.append(("bookkeeping (step - forward - draw at temperature 1)", step - t_fwd - t_draw, float("nan")))
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--new", default="64,2048")
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; batch {args.batch}, preset bench, float32")
  for new in (int(n) for n in args.new.split(",")):
    rows = profile(args.batch, new, args.repeats)
    step = rows[0][1]
    print(f"\nN = {new} new tokens (cache {16 + new} slots)")
    print("part | ms | share of the step | XLA bytes accessed (MB)")
    for name, seconds, nbytes in rows:
      print(f"{name} | {seconds * 1e3:.3f} | {seconds / step:.0%} | {nbytes / 1e6:.2f}")


if __name__ == "__main__":
  main()
