"""Where a decode step's time goes: each part of one step jitted alone at the sampler benchmark's fixed shape.

  python -m experiments.benchmarks.sampler_profile [--batch=32] [--new=64,2048] [--repeats=20]

For each completion budget N (cache S = 16 + N slots), at a step in the middle of the first 64 tokens:
- the whole in-loop step (`sampling.generate` at N tokens minus at 1, over N - 1; as in sampler.py);
- one cached forward of the batch's [B, 1] tokens (`transformer.forward_cached`), and its parts:
  attention over the cache window (all layers), the cache write (all layers, in place), the vocabulary
  projection, and the rest (the projections, MLPs and norms);
- drawing the tokens from [B, V] logits: temperature only, with top-k 50, with top-p 0.9;
- bookkeeping: the step minus the forward and the draw.
Each part runs 64 times inside one jitted `lax.fori_loop`, as inside the sampler (no dispatch between
iterations, the carry donated), timed per iteration (median of `--repeats`). The parts are timed apart, so
they need not sum to the step exactly; bookkeeping is what is left.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from experiments.benchmarks.sampler import median_time
from rl_lm import sampling
from rl_lm.models import presets, transformer


def _per_iteration(body, init, repeats: int, n: int = 64) -> float:
  """Seconds per iteration of `body` run n times in one jitted `lax.fori_loop` (as inside the sampler: no
  dispatch between iterations; the carry donated, so in-place updates stay in place), median of `repeats`."""
  loop = jax.jit(lambda c: jax.lax.fori_loop(0, n, lambda _, c: body(c), c), donate_argnums=(0,))
  state = {"carry": init}

  def once():
    state["carry"] = loop(state["carry"])
    return state["carry"]

  jax.block_until_ready(once())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(once())
    times.append((time.perf_counter() - start) / n)
  return statistics.median(times)


def profile(batch: int, new: int, repeats: int) -> list[tuple[str, float]]:
  cfg = presets.get("bench", max_seq_len=max(512, 16 + new))
  params = transformer.init(cfg, jax.random.key(0))
  P, S, B = 16, 16 + new, batch
  t = P + min(new, 64) // 2  # the step's cache index
  prompts = jax.random.randint(jax.random.key(1), (B, P), 3, cfg.vocab_size, jnp.int32)
  lengths = jnp.full((B,), P, jnp.int32)
  rng = jax.random.key(2)
  rows = []

  gen = sampling.make_generate_fn(cfg, sampling.SamplingConfig(max_new_tokens=new, temperature=1.0))
  budget = min(new, 64)

  def whole(n_tokens):
    fn = lambda: gen(params, prompts, lengths, rng, max_new_tokens=jnp.full((B,), n_tokens, jnp.int32)).tokens
    jax.block_until_ready(fn())  # compile
    return median_time(fn, max(3, repeats // 4))

  step = (whole(budget) - whole(1)) / (budget - 1)
  rows.append(("in-loop decode step (all of it)", step))

  kv_mask = jnp.broadcast_to(jnp.arange(S)[None, :] <= t, (B, S))
  pos = jnp.full((B, 1), t, jnp.int32)
  window = sampling.decode_windows(P, new, 64)[0]

  def forward(c):
    cache, tok = c
    logits, cache = transformer.forward_cached(cfg, params, tok, pos, cache, t, kv_mask, window=window)
    return cache, jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)

  cache = transformer.init_cache(cfg, B, S)
  t_fwd = _per_iteration(forward, (cache, jnp.zeros((B, 1), jnp.int32)), repeats)
  rows.append((f"cached forward of [B, 1] tokens, window {window} of {S} slots", t_fwd))

  allowed = kv_mask[:, None, :window]

  def attention(c):
    q, k, v = c
    out = jax.vmap(lambda k_l, v_l: transformer._attention(cfg, q, k_l[:, :window], v_l[:, :window], allowed))(k, v)
    return out[0] * 0.5 + q * 0.5, k, v  # [B, 1, H, Dh], the cache unchanged

  q = jnp.ones((B, 1, cfg.n_heads, cfg.head_dim), jnp.float32)
  t_attn = _per_iteration(attention, (q, *transformer.init_cache(cfg, B, S)), repeats)
  rows.append((f"  attention over {window} slots, {cfg.n_layers} layers", t_attn))

  kv = jnp.ones((cfg.n_layers, B, 1, cfg.n_kv_heads, cfg.head_dim), jnp.float32)

  def write(c):
    return transformer.KVCache(jax.lax.dynamic_update_slice(c.k, kv, (0, 0, t, 0, 0)),
                               jax.lax.dynamic_update_slice(c.v, kv, (0, 0, t, 0, 0)))

  t_write = _per_iteration(write, transformer.init_cache(cfg, B, S), repeats)
  rows.append((f"  cache write, {cfg.n_layers} layers, in place", t_write))

  def head(h):
    logits = transformer.logits_from_hidden(cfg, params, h)
    return h + 1e-3 * logits[..., : cfg.d_model]

  t_head = _per_iteration(head, jnp.ones((B, 1, cfg.d_model), jnp.float32), repeats)
  rows.append((f"  vocabulary projection, d {cfg.d_model} x V {cfg.vocab_size}", t_head))
  rows.append(("  the rest: projections, MLPs, norms, embedding", t_fwd - t_attn - t_write - t_head))

  t_draw = None
  for name, extra in (("temperature 1", {}), ("top-k 50", {"top_k": 50}), ("top-p 0.9", {"top_p": 0.9})):
    scfg = sampling.SamplingConfig(max_new_tokens=1, temperature=1.0, **extra)

    def draw(c, scfg=scfg):
      logits, key = c
      tok, _ = sampling.sample_token(logits, key, scfg)
      return logits + 1e-3 * tok[:, None].astype(jnp.float32), jax.random.fold_in(key, 1)

    logits = jax.random.normal(jax.random.key(3), (B, cfg.vocab_size), jnp.float32)
    t_d = _per_iteration(draw, (logits, jax.random.key(4)), repeats)
    t_draw = t_d if t_draw is None else t_draw
    rows.append((f"draw from [B, V] logits, {name}", t_d))
  rows.append(("bookkeeping (step - forward - draw at temperature 1)", step - t_fwd - t_draw))
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
    print("part | ms | share of the step")
    for name, seconds in rows:
      print(f"{name} | {seconds * 1e3:.3f} | {seconds / step:.0%}")


if __name__ == "__main__":
  main()
