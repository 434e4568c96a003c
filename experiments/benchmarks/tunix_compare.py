"""Our sampler against Tunix's (`tunix.generate.sampler.Sampler`), alternating fresh processes, same shape.

  python3 -m venv /tmp/tunix_venv && /tmp/tunix_venv/bin/pip install google-tunix==0.1.7 jax==0.10.2 jaxlib==0.10.2
  python -m experiments.benchmarks.tunix_compare --tunix_python=/tmp/tunix_venv/bin/python [--batches=32,128]

Tunix is not a dependency of the project: it runs in its own virtual environment, and this script starts one
process per (side, batch, round), ours with this interpreter and Tunix's with `--tunix_python`, alternately, so
both see the same machine at the same time. Each process builds the fixed shape (4 layers, d 256, MLP 1024,
8 x 32 query heads, 2 KV heads, vocab 4096, float32, random weights), draws 64 new tokens after a 16-token
prompt at temperature 1 with no stop token (every row decodes all 64), warms up once and prints the median
tokens/s of `--repeats` whole calls (prefill included; tokens back on the host). Tunix's call also tokenises
and detokenises through a trivial integer tokenizer, which costs microseconds.

A third side, "matmuls alone" (`matmuls_only`), runs nothing but the model's matmuls at the same shape: the
ceiling of any float32 sampler on this machine. ours / matmuls alone is how close we are to it; matmuls alone /
Tunix is the largest ratio to Tunix that any sampler could reach here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SHAPE = dict(layers=4, d=256, mlp=1024, heads=8, head_dim=32, kv_heads=2, vocab=4096, prompt=16, new=64)


def _median_rate(call, batch: int, repeats: int) -> float:
  call()  # compile
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return batch * SHAPE["new"] / statistics.median(times)


def ours(batch: int, repeats: int, options: dict) -> float:
  import jax
  import jax.numpy as jnp

  from rl_lm import sampling
  from rl_lm.models import presets, transformer

  cfg = presets.get("bench")
  params = transformer.init(cfg, jax.random.key(0))
  prompts = jax.random.randint(jax.random.key(1), (batch, SHAPE["prompt"]), 3, cfg.vocab_size, jnp.int32)
  lengths = jnp.full((batch,), SHAPE["prompt"], jnp.int32)
  gen = sampling.make_generate_fn(cfg, sampling.SamplingConfig(max_new_tokens=SHAPE["new"], temperature=1.0,
                                                               **options))
  keys = iter(range(10**6))
  return _median_rate(lambda: jax.device_get(gen(params, prompts, lengths, jax.random.key(next(keys))).tokens),
                      batch, repeats)


def matmuls_only(batch: int, repeats: int, options: dict) -> float:
  """The ceiling of any sampler of this shape on this machine: a jitted loop that runs only the model's matmuls
  (the prefill's seven projections per layer over batch x prompt tokens, then per new token the seven projections
  of every layer and the vocabulary projection), in float32, with nothing else: no attention, norms, rotary, cache
  or draw. Its tokens/s is what a sampler would reach if everything but the matmuls cost nothing."""
  del options
  import jax
  import jax.numpy as jnp

  from rl_lm.models import presets, transformer

  cfg = presets.get("bench")
  params = transformer.init(cfg, jax.random.key(0))
  B, P, N, D = batch, SHAPE["prompt"], SHAPE["new"], SHAPE["d"]

  def blocks(x, layers):  # x [R, D]: every projection of every layer, each layer's input the previous output
    for lp in layers:
      q = x @ lp["wq"].reshape(D, -1)  # [R, H * Dh]
      kv = jnp.sum(x @ lp["wk"].reshape(D, -1)) + jnp.sum(x @ lp["wv"].reshape(D, -1))
      x = x + q @ lp["wo"].reshape(-1, D) + 1e-9 * kv
      x = x + ((x @ lp["w_gate"]) * (x @ lp["w_up"])) @ lp["w_down"]
    return x

  @jax.jit
  def run(params, x_prompt, x0):
    layers = [jax.tree.map(lambda w, i=i: w[i], params["layers"]) for i in range(cfg.n_layers)]
    x = x0 + 1e-3 * blocks(x_prompt, layers)[:B]  # the prefill's matmuls, [B * P, D]

    def step(_, x):  # one new token per row
      logits = blocks(x, layers) @ params["embed"].T  # [B, V]
      return x + 1e-3 * logits[:, :D]

    return jax.lax.fori_loop(0, N, step, x)

  x_prompt = jax.random.normal(jax.random.key(1), (B * P, D))
  x0 = jax.random.normal(jax.random.key(2), (B, D))
  return _median_rate(lambda: jax.device_get(run(params, x_prompt, x0)), batch, repeats)


class _IntTokenizer:
  """Text "5 17 302" <-> ids [5, 17, 302]; what Tunix's TokenizerAdapter asks of a custom tokenizer."""

  def encode(self, text: str, **_) -> list[int]:
    return [int(t) for t in text.split()]

  def decode(self, ids, **_) -> str:
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self) -> int:
    return 0  # falsy: Tunix prepends no BOS

  def eos_id(self) -> int:
    return 1

  def pad_id(self) -> int:
    return 0


def tunix(batch: int, repeats: int, options: dict) -> float:
  del options
  from flax import nnx
  from tunix.generate import sampler as tunix_sampler
  from tunix.models.llama3 import model as llama3

  config = llama3.ModelConfig(
    num_layers=SHAPE["layers"], vocab_size=SHAPE["vocab"], embed_dim=SHAPE["d"], hidden_dim=SHAPE["mlp"],
    num_heads=SHAPE["heads"], head_dim=SHAPE["head_dim"], num_kv_heads=SHAPE["kv_heads"], rope_theta=10_000,
    norm_eps=1e-5, shd_config=llama3.ShardingConfig.get_default_sharding(is_sampling=True),
  )
  model = llama3.Llama3(config, rngs=nnx.Rngs(0))
  cache = tunix_sampler.CacheConfig(cache_size=SHAPE["prompt"] + SHAPE["new"], num_layers=SHAPE["layers"],
                                    num_kv_heads=SHAPE["kv_heads"], head_dim=SHAPE["head_dim"])
  sampler = tunix_sampler.Sampler(model, _IntTokenizer(), cache)
  rng = np.random.default_rng(1)
  prompts = [" ".join(str(t) for t in rng.integers(3, SHAPE["vocab"], SHAPE["prompt"])) for _ in range(batch)]
  seeds = iter(range(10**6))
  never = [SHAPE["vocab"] + 1]  # a stop id outside the vocabulary: every row decodes all the new tokens
  return _median_rate(lambda: sampler(prompts, max_generation_steps=SHAPE["new"], max_prompt_length=SHAPE["prompt"],
                                      temperature=1.0, top_p=1.0, eos_tokens=never, seed=next(seeds)),
                      batch, repeats)


def _child(python: str, side: str, batch: int, repeats: int, options: dict) -> float:
  cmd = [python, "-m", "experiments.benchmarks.tunix_compare", f"--side={side}", f"--batches={batch}",
         f"--repeats={repeats}", f"--options={json.dumps(options)}"]
  out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  if out.returncode != 0:
    raise SystemExit(f"{side} (batch {batch}) failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tunix_python", default="", help="the python of a virtual environment with google-tunix")
  parser.add_argument("--batches", default="32,128")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--options", default="{}", help="extra SamplingConfig fields for our side, as JSON")
  parser.add_argument("--side", default="", choices=("", "ours", "tunix", "matmuls"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  batches = [int(b) for b in args.batches.split(",")]
  options = json.loads(args.options)
  if args.side:  # a child: one measurement, printed as JSON
    rate = {"ours": ours, "tunix": tunix, "matmuls": matmuls_only}[args.side](batches[0], args.repeats, options)
    print(json.dumps({"tokens_per_s": rate}))
    return
  if not args.tunix_python:
    parser.error("--tunix_python is required (see the module docstring)")
  sides = (("ours", sys.executable), ("tunix", args.tunix_python), ("matmuls", sys.executable))
  rates = {(side, b): [] for side, _ in sides for b in batches}
  for r in range(args.rounds):
    for b in batches:
      for side, python in sides:
        rates[side, b].append(_child(python, side, b, args.repeats, options))
        print(f"round {r + 1} batch {b} {side}: {rates[side, b][-1]:,.0f} tokens/s", flush=True)
  print("batch | ours tokens/s (median) | Tunix tokens/s (median) | matmuls alone (median) | ours / Tunix"
        " | ours / matmuls alone | matmuls alone / Tunix")
  for b in batches:
    o, t, m = (statistics.median(rates[side, b]) for side in ("ours", "tunix", "matmuls"))
    print(f"{b} | {o:,.0f} | {t:,.0f} | {m:,.0f} | {o / t:.2f}x | {o / m:.2f} | {m / t:.2f}x")


if __name__ == "__main__":
  main()
