"""Continuous batching against the static batch on a length-skewed workload: useful tokens/s, in one run.

  python -m experiments.benchmarks.refill [--prompts=256] [--slots=32] [--long=512] [--short=64] [--repeats=3]

The fixed shape (preset `bench`: 4 layers, d 256, vocab 4096, float32), 16-token prompts, temperature 1.
One prompt in ten may run to `--long` new tokens, the rest stop within `--short` (a per-row budget drawn
uniformly in [1, short]; no stop token, so every row runs exactly to its budget and both sides produce the
same number of tokens). Static: `sampling.generate` over batches of `--slots` rows, each batch decoding
until its longest row ends. Refill: `sampling.make_generate_fn(..., slots=)` with `--slots` cache rows over all the
prompts. Useful tokens = completion tokens (no padding). Medians of `--repeats` warm runs.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import useful
from rl_lm import sampling
from rl_lm.models import presets, transformer


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--prompts", type=int, default=256)
  parser.add_argument("--slots", type=int, default=32)
  parser.add_argument("--long", type=int, default=512)
  parser.add_argument("--short", type=int, default=64)
  parser.add_argument("--long_frac", type=float, default=0.1)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", default="", help="also write the figures here (for ab.py)")
  args = parser.parse_args()
  cfg = presets.get("bench")
  params = transformer.init(cfg, jax.random.key(0))
  Q, P, B = args.prompts, 16, args.slots
  rng = np.random.default_rng(0)
  prompts = jnp.asarray(rng.integers(3, cfg.vocab_size, (Q, P)), jnp.int32)
  lengths = jnp.full((Q,), P, jnp.int32)
  budgets = np.where(rng.random(Q) < args.long_frac, args.long, rng.integers(1, args.short + 1, Q)).astype(np.int32)
  scfg = sampling.SamplingConfig(max_new_tokens=args.long, temperature=1.0)
  static_fn = sampling.make_generate_fn(cfg, scfg)
  refill_fn = sampling.make_generate_fn(cfg, scfg, slots=B)
  key = jax.random.key(1)

  def static():
    n = 0
    for s in range(0, Q, B):
      out = static_fn(params, prompts[s:s + B], lengths[s:s + B], key, max_new_tokens=jnp.asarray(budgets[s:s + B]))
      n += int(jnp.sum(out.lengths))
    return n

  def refilled():
    return int(jnp.sum(refill_fn(params, prompts, lengths, key, max_new_tokens=jnp.asarray(budgets)).lengths))

  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {Q} prompts, {int((budgets == args.long).sum())} "
        f"of them up to {args.long} new tokens, the rest within {args.short}; {B} rows at a time")
  _, tokens = useful.compare((("static", static), ("refill", refilled)), args.repeats, args.json)
  assert set(tokens.values()) == {int(budgets.sum())}, (tokens, int(budgets.sum()))  # every budget ran, both sides

if __name__ == "__main__":
  main()
