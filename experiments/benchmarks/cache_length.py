"""Does a decode step cost what the filled part of the cache costs? Step cost against cache size, in one run.

  python -m experiments.benchmarks.cache_length [--batch=32] [--repeats=3]

The fixed shape (preset `bench`), 16-token prompts, temperature 1, no stop token.
- Step cost at position 64: the same compiled sampler run with every row's budget at 65 and at 1 tokens;
  the difference over 64 is one decode step at cache positions 16-80. Measured with a 128-slot cache
  (N = 112) and a 2,048-slot cache (N = 2,032), with the default attention windows
  (`config.sampling.window` = 64) and with one window over the whole cache (window = N: every step reads
  all S slots).
- Decode tokens/s at 64, 512 and 2,048 new tokens (whole `generate` calls, every row decoding all N), both ways.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

from experiments.benchmarks.sampler import median_time
from rl_lm import sampling
from rl_lm.models import presets, transformer


def _time(fn, repeats: int) -> float:
  jax.block_until_ready(fn())  # compile
  return median_time(fn, repeats)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", default="", help="also write the figures here (for ab.py)")
  args = parser.parse_args()
  cfg = presets.get("bench", max_seq_len=4096)
  params = transformer.init(cfg, jax.random.key(0))
  B, P = args.batch, 16
  prompts = jax.random.randint(jax.random.key(1), (B, P), 3, cfg.vocab_size, jnp.int32)
  lengths = jnp.full((B,), P, jnp.int32)
  key = jax.random.key(2)

  def gen(new: int, window: int, budget: int):
    fn = sampling.make_generate_fn(cfg, sampling.SamplingConfig(max_new_tokens=new, temperature=1.0, window=window))
    return lambda: fn(params, prompts, lengths, key, max_new_tokens=jnp.full((B,), budget, jnp.int32)).tokens

  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; batch {B}, preset bench, prompt {P}, float32")
  figures = {}
  print("\nstep cost at positions 16-80 | 128-slot cache | 2,048-slot cache | 2,048 / 128")
  for label, windows in (("windows of 64, 128, ... (default)", (64, 64)), ("one window: the whole cache", (112, 2032))):
    steps = []
    for new, window in zip((112, 2032), windows, strict=True):
      steps.append((_time(gen(new, window, 65), args.repeats) - _time(gen(new, window, 1), args.repeats)) / 64)
    figures.update({f"step_ms_128_{windows[0]}": steps[0] * 1e3, f"step_ms_2048_{windows[0]}": steps[1] * 1e3})
    print(f"{label} | {steps[0] * 1e3:.2f} ms | {steps[1] * 1e3:.2f} ms | {steps[1] / steps[0]:.2f}x", flush=True)

  print("\nnew tokens | tokens/s, default windows | tokens/s, one window | default / one window")
  for new in (64, 512, 2048):
    rates = [B * new / _time(gen(new, window, new), args.repeats) for window in (64, new)]
    figures.update({f"tokens_per_s_{new}": rates[0], f"tokens_per_s_{new}_one_window": rates[1]})
    print(f"{new} | {rates[0]:,.0f} | {rates[1]:,.0f} | {rates[0] / rates[1]:.2f}x", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  main()
