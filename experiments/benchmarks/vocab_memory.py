"""Peak memory of the compiled RL update with a large vocabulary: whole [B, T, V] logits vs chunked scoring.

  python -m experiments.benchmarks.vocab_memory [--rows=64] [--T=512] [--vocab=151936] [--chunks=0,128,32]

Nothing runs: `rl_update.make_update_fn` (GRPO, one minibatch) and `make_prepare_fn` are lowered on abstract
inputs and compiled for one CPU device, and XLA's `memory_analysis()` gives the bytes of the arguments
(parameters, optimizer state, batch), the outputs and the temporaries (activations, logits, gradients'
workspace). `config.model.logit_chunk = c` scores c positions at a time (rl_lm/models/scoring.py); 0 is
the whole sequence at once. The model is Qwen2.5-0.5B's shape (d 896, 14 x 64 heads, 2 KV heads, MLP
4864, tied vocabulary of 151,936) cut to `--layers` layers, so the logits dominate as they do in the
full model on a long batch.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

from rl_lm import mesh as mesh_lib
from rl_lm.config import base_config
from rl_lm.models import presets, transformer
from rl_lm.rl import kl as kl_lib
from rl_lm.train import rl_update
from rl_lm.train import state as state_lib


def compiled_bytes(rows: int, T: int, vocab: int, layers: int, chunk: int, remat: bool) -> dict[str, float]:
  """GiB of arguments, outputs and temporaries of the compiled update at this shape."""
  cfg = presets.get("qwen2.5-0.5b").replace(n_layers=layers, vocab_size=vocab, max_seq_len=max(T, 512),
                                            logit_chunk=chunk, remat=remat)
  rl = base_config().rl
  mesh = mesh_lib.make_mesh(data=1, devices=jax.devices()[:1])
  rules = mesh_lib.DEFAULT_RULES
  optimizer = state_lib.make_optimizer(1e-6)
  params = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  param_sh = mesh_lib.tree_shardings(mesh, rules, params, transformer.param_axes(cfg))
  policy = jax.eval_shape(lambda p: state_lib.TrainState(jnp.int32(0), p, optimizer.init(p)), params)
  kl = jax.eval_shape(lambda: kl_lib.init_kl_state(0.01))
  rep = mesh_lib.replicated(mesh)
  shardings = rl_update.RLState(state_lib.state_shardings(optimizer, params, param_sh, mesh), None,
                                jax.tree.map(lambda _: rep, kl))
  state = rl_update.RLState(policy, None, kl)
  f32, i32, b = (jax.ShapeDtypeStruct((rows, T), d) for d in (jnp.float32, jnp.int32, jnp.bool_))
  batch = rl_update.TrainBatch(i32, b, b, f32, f32, f32, f32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  update = rl_update.make_update_fn(cfg, rl, 1.0, T, (optimizer, None), shardings, mesh, rules)
  m = update.lower(state, batch, key).compile().memory_analysis()
  return {"update_args_gib": m.argument_size_in_bytes / 2**30, "update_out_gib": m.output_size_in_bytes / 2**30,
          "update_temp_gib": m.temp_size_in_bytes / 2**30}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--T", type=int, default=512)
  parser.add_argument("--vocab", type=int, default=151936)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--chunks", default="0,128,32")
  parser.add_argument("--remat", default="false,true", help="config.model.remat values to measure")
  parser.add_argument("--json", default="")
  a = parser.parse_args()
  rows = []
  for remat in (v.strip().lower() == "true" for v in a.remat.split(",")):
    for chunk in (int(c) for c in a.chunks.split(",")):
      r = {"remat": remat, "chunk": chunk, **compiled_bytes(a.rows, a.T, a.vocab, a.layers, chunk, remat)}
      rows.append(r)
      print(f"remat {remat!s:5s} logit_chunk {chunk:4d}: update temporaries {r['update_temp_gib']:.2f} GiB, "
            f"arguments {r['update_args_gib']:.2f} GiB", flush=True)
  print(f"\nB x T = {a.rows} x {a.T}, V = {a.vocab}, {a.layers} layers of Qwen2.5-0.5B's shape, float32")
  print("remat | logit_chunk | update temporaries (GiB) | vs whole logits, same remat")
  for r in rows:
    base = next(b["update_temp_gib"] for b in rows if b["remat"] == r["remat"] and b["chunk"] == 0)
    print(f"{r['remat']} | {r['chunk'] or 'whole'} | {r['update_temp_gib']:.2f} | {base / r['update_temp_gib']:.1f}x")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
