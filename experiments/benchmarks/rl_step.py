"""RL step benchmark: where the time of one GRPO step goes, and how close the update runs to the machine's
matmul rate, both measured in this run.

  python -m experiments.benchmarks.rl_step [--steps=5] [--warmup=1] [--json=rl_step.json]

Fixed shape: preset "tiny" (4 layers, d 128, MLP 512, 4 x 32 query heads, 2 KV heads, vocab 128, float32,
random init), arithmetic levels 1-3, GRPO, 32 prompts x 8 samples = 256 rows, prompt slots 16, 8 new tokens
(T = 24 per row), 1 epoch, 1 minibatch, on every local device (mesh data = -1). After `--warmup` steps
(compilation), `--steps`
steps are timed with `RLTrainer.train_step`'s own phase timers: sampling (generation, decoding, curriculum
draws), scoring, prepare (old and reference log-probs, advantages, importance weights) and update.

Model FLOPs of the update, per step (forward + backward = 3 x forward):
  update_flops = epochs * rows * T * (6 * n_params + 12 * n_layers * T * n_heads * head_dim)
6 * n_params per token is the dense part (2 per weight forward, 4 backward; the tied embedding is counted
once, as the output projection; the lookup is free). 12 * L * T * n_heads * head_dim per token is
attention: Q K^T and A V are 2 * T * n_heads * head_dim FLOPs each per token forward, over all T
positions (the causal mask does not skip work), times 3 for the backward. Every token of the padded
[rows, T] batch counts, since the forward runs on all of them. Prepare is two forwards (policy and
reference): rows * T * (4 * n_params + 8 * L * T * n_heads * head_dim).

Baseline: a jitted float32 (n x n) @ (n x n) matmul (n = --matmul, 2048), 2 n^3 FLOPs, median of
--repeats runs. "update / matmul" is the update's model FLOP/s as a fraction of that rate. Timings are
printed, never asserted; the machine is shared and noisy, so compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm.config import base_config
from rl_lm.train.context import make_context
from rl_lm.train.rl import RLTrainer

PHASES = ("sampling", "scoring", "prepare", "update")


def bench_config(prompts: int = 32, group: int = 8, new_tokens: int = 8, prompt_len: int = 16,
                 minibatches: int = 1, seed: int = 0) -> Any:
  """The fixed shape, built from `rl_lm.config.base_config()` so that tuning configs/default.py cannot move it."""
  c = base_config()
  c.seed = seed
  c.stages = ("rl",)
  c.model.preset = "tiny"
  c.task.name = "arithmetic"
  c.task.levels = (1, 2, 3)
  c.task.pool_size = 1000
  c.sampling.max_new_tokens = new_tokens
  c.sampling.temperature = 1.0
  c.rl.algorithm = "grpo"
  c.rl.prompts_per_step = prompts
  c.rl.group_size = group
  c.rl.max_prompt_len = prompt_len
  c.rl.epochs = 1
  c.rl.minibatches = minibatches
  c.rl.grad_accum = 1
  return c


def update_flops(model_cfg: Any, rows: int, T: int, epochs: int) -> float:
  """Model FLOPs of one step's update (see the module docstring)."""
  attn = 12 * model_cfg.n_layers * T * model_cfg.n_heads * model_cfg.head_dim
  return float(epochs * rows * T * (6 * model_cfg.num_params() + attn))


def prepare_flops(model_cfg: Any, rows: int, T: int) -> float:
  """Model FLOPs of prepare: a forward of the policy and one of the reference."""
  attn = 8 * model_cfg.n_layers * T * model_cfg.n_heads * model_cfg.head_dim
  return float(rows * T * (4 * model_cfg.num_params() + attn))


def matmul_flops_per_s(n: int, repeats: int) -> float:
  """FLOP/s of a jitted float32 (n x n) @ (n x n), median over `repeats` runs after a compile."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(jnp.matmul)
  jax.block_until_ready(f(a, b))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(f(a, b))
    times.append(time.perf_counter() - start)
  return 2.0 * n**3 / statistics.median(times)


def bench(steps: int, warmup: int, matmul: int, repeats: int, **shape: Any) -> dict[str, Any]:
  """Runs warm-up and timed steps; returns the figures (medians over the timed steps)."""
  config = bench_config(**shape)
  with tempfile.TemporaryDirectory() as workdir:
    ctx = make_context(config, workdir)
    trainer = RLTrainer(ctx, log=lambda _: None)
    t0 = time.perf_counter()
    for step in range(1, warmup + 1):
      trainer.train_step(step)
    warmup_s = time.perf_counter() - t0
    history = [trainer.train_step(step) for step in range(warmup + 1, warmup + steps + 1)]
  rl, cfg = config.rl, ctx.model_cfg
  rows, T = rl.prompts_per_step * rl.group_size, rl.max_prompt_len + config.sampling.max_new_tokens
  med = lambda key: statistics.median(m[key] for m in history)
  times = {p: med(f"perf/time_{p}_s") for p in PHASES}
  total = med("perf/time_total_s")
  flops_u = update_flops(cfg, rows, T, rl.epochs)
  flops_p = prepare_flops(cfg, rows, T)
  peak = matmul_flops_per_s(matmul, repeats)
  return {
    "jax": jax.__version__, "platform": jax.devices()[0].platform, "devices": jax.device_count(),
    "mesh": dict(ctx.mesh.shape), "preset": config.model.preset, "params": cfg.num_params(),
    "rows": rows, "prompt_len": rl.max_prompt_len, "new_tokens": config.sampling.max_new_tokens, "T": T,
    "epochs": rl.epochs, "minibatches": rl.minibatches, "warmup_steps": warmup, "timed_steps": steps,
    "warmup_s": warmup_s, "step_s": total, **{f"{p}_s": t for p, t in times.items()},
    **{f"{p}_frac": t / total for p, t in times.items()},
    "completion_tokens_per_step": med("rollout/completion_tokens"),
    "completion_tokens_per_s": med("rollout/completion_tokens") / total,
    "sampled_tokens_per_s": rows * config.sampling.max_new_tokens / times["sampling"],
    "update_tokens_per_s": rl.epochs * rows * T / times["update"],
    "update_flops": flops_u, "update_flops_per_s": flops_u / times["update"],
    "prepare_flops": flops_p, "prepare_flops_per_s": flops_p / times["prepare"],
    "matmul_n": matmul, "matmul_flops_per_s": peak,
    "update_vs_matmul": flops_u / times["update"] / peak, "prepare_vs_matmul": flops_p / times["prepare"] / peak,
    "step_times_s": [m["perf/time_total_s"] for m in history],
  }


def print_table(r: dict[str, Any]) -> None:
  """The figures as two small tables."""
  print(f"jax {r['jax']} on {r['platform']} x{r['devices']}, mesh {r['mesh']}; preset {r['preset']} "
        f"({r['params'] / 1e6:.2f}M params), {r['rows']} rows x T={r['T']} ({r['prompt_len']} prompt + "
        f"{r['new_tokens']} new), epochs {r['epochs']}, minibatches {r['minibatches']}; warm-up {r['warmup_steps']} "
        f"steps {r['warmup_s']:.1f}s, median of {r['timed_steps']} timed steps")
  print("phase | seconds | share")
  for p in PHASES:
    print(f"{p} | {r[f'{p}_s']:.3f} | {r[f'{p}_frac']:.1%}")
  print(f"step | {r['step_s']:.3f} | 100%")
  print("measure | value")
  print(f"completion tokens / s (whole step) | {r['completion_tokens_per_s']:.0f}")
  print(f"sampled tokens / s (rows x new / sampling) | {r['sampled_tokens_per_s']:.0f}")
  print(f"update tokens / s (rows x T / update) | {r['update_tokens_per_s']:.0f}")
  print(f"update model GFLOP per step | {r['update_flops'] / 1e9:.2f}")
  print(f"update model GFLOP/s | {r['update_flops_per_s'] / 1e9:.2f}")
  print(f"prepare model GFLOP/s | {r['prepare_flops_per_s'] / 1e9:.2f}")
  print(f"f32 matmul {r['matmul_n']}^3 GFLOP/s | {r['matmul_flops_per_s'] / 1e9:.2f}")
  print(f"update / matmul | {r['update_vs_matmul']:.1%}")
  print(f"prepare / matmul | {r['prepare_vs_matmul']:.1%}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=5, help="timed steps")
  parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (compilation)")
  parser.add_argument("--prompts", type=int, default=32)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--new_tokens", type=int, default=8)
  parser.add_argument("--minibatches", type=int, default=1)
  parser.add_argument("--matmul", type=int, default=2048, help="n of the float32 n x n matmul baseline")
  parser.add_argument("--repeats", type=int, default=5, help="matmul runs (median)")
  parser.add_argument("--json", default="", help="also write the figures here")
  args = parser.parse_args()
  r = bench(args.steps, args.warmup, args.matmul, args.repeats, prompts=args.prompts, group=args.group,
            new_tokens=args.new_tokens, minibatches=args.minibatches)
  print_table(r)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()}, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
