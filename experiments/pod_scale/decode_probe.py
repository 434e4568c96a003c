"""What XLA:TPU's estimate of a decode step is made of: the probes behind the README's "At pod scale" decode figures.

  python -m experiments.pod_scale.decode_probe [--rows=256,512,1024,2048]

Every figure is XLA's own (`cost_analysis()` of a program compiled ahead of time for v5p chips on this CPU), so it
is deterministic: no run-to-run range. Prints:

1. **XLA's bandwidth.** A 1 GiB reduction and a [128, 8192] x [8192, 8192] matmul on one v5p chip: XLA's
   `optimal_seconds` for such memory-bound programs is its count of bytes accessed over one fixed bandwidth, which
   is printed (and its fraction of the chip's 2,765 GB/s). A step that reads exactly its roofline bytes therefore
   shows the inverse of that fraction as its distance from the roofline, not 1.
2. **A decode step's key write, by key layout** (`sampling.key_layout`): 8 layers of Llama-3.1-8B's cache on one
   v5p chip at data 4 x tensor 8 (128 rows, one kv head, 1,024 slots), one slot written a layer.
3. **The draw** (`rl_lm.rollout.draw.sample_token`) of 512 rows over Llama-3's 128,256 tokens, the vocabulary split
   over tensor 8 (v5p-64, data 4 x tensor 8), with the inverse CDF's blocks a multiple of 8 (as rl_lm draws) and
   not (251 blocks).
4. With `--rows`: Llama-3.1-8B's whole decode step (`configs/pod.py`, v5p-64, data 4 x tensor 8, all 32 layers
   unrolled, as `python -m rl_lm.aot` costs it) at each number of rows (prompts of 8 samples): bytes, seconds and
   the distance from the HBM roofline. About 2-4 minutes each here.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from rl_lm import mesh as mesh_lib  # noqa: E402
from rl_lm.aot import chips  # noqa: E402

BF16 = jnp.bfloat16


def _cost(fn: Any, args: list[jax.ShapeDtypeStruct], donate: tuple[int, ...] = ()) -> tuple[float, float]:
  """(XLA's optimal seconds, bytes accessed) of `fn` compiled for the arguments' devices."""
  compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list | tuple) else analysis
  return float(analysis["optimal_seconds"]), float(analysis["bytes accessed"])


def _one_chip() -> tuple[Mesh, chips.Chip]:
  topology = chips.resolve("v5p-8")
  return Mesh(np.array(chips.devices(topology)[:1]), ("x",)), topology.chip


def _sds(mesh: Mesh, shape: tuple[int, ...], dtype: Any, spec: P | None = None) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec or P()))


def bandwidth() -> None:
  mesh, chip = _one_chip()
  print("1. XLA's bandwidth (one v5p chip):")
  seconds, read = _cost(lambda x: jnp.sum(x.astype(jnp.float32), axis=0), [_sds(mesh, (8192, 65536), BF16)])
  print(f"   1 GiB reduction: {read / 1e9:.3f} GB in {seconds * 1e6:.0f} us = {read / seconds / 1e12:.3f} TB/s, "
        f"{read / seconds / chip.hbm_bandwidth:.1%} of {chip.hbm_bandwidth / 1e9:,.0f} GB/s")
  seconds, read = _cost(lambda x, w: x @ w, [_sds(mesh, (128, 8192), BF16), _sds(mesh, (8192, 8192), BF16)])
  print(f"   [128, 8192] x [8192, 8192]: {read / 1e6:.1f} MB in {seconds * 1e6:.1f} us = "
        f"{read / seconds / 1e12:.3f} TB/s")


KEY_WRITE = (8, 128, 1024, 128)  # layers, rows, slots, head dim: Llama-3.1-8B's cache on a v5p-64 chip, 8 layers


def key_writes() -> dict[str, tuple[float, float]]:
  """{layout: (bytes, seconds)} a layer, by XLA's count, of writing one slot of keys into each of 8 layers."""
  mesh, _ = _one_chip()
  L, B, S, Dh = KEY_WRITE

  def by_slot(cache: jax.Array, new: jax.Array, i: jax.Array) -> jax.Array:  # cache [L, B, 1, S, Dh]
    for layer in range(L):
      cache = jax.lax.dynamic_update_slice(cache, new[layer][None], (layer, 0, 0, i, 0))
    return cache

  def transposed(cache: jax.Array, new: jax.Array, i: jax.Array) -> jax.Array:  # cache [L, B, 1, Dh, S]
    for layer in range(L):
      cache = jax.lax.dynamic_update_slice(cache, new[layer][None], (layer, 0, 0, 0, i))
    return cache

  index = _sds(mesh, (), jnp.int32)
  out = {}
  for name, fn, cache, new in [
      ("transposed", transposed, (L, B, 1, Dh, S), (L, B, 1, Dh, 1)),
      ("by_slot", by_slot, (L, B, 1, S, Dh), (L, B, 1, 1, Dh))]:
    seconds, read = _cost(fn, [_sds(mesh, cache, BF16), _sds(mesh, new, BF16), index], donate=(0,))
    out[name] = (read / L, seconds / L)
  return out


def draws() -> dict[int, tuple[float, float]]:
  """{blocks: (bytes, seconds)} per chip of a draw of 512 rows over Llama-3's vocabulary split over tensor 8, with
  the inverse CDF's block count as rl_lm pads it and not padded."""
  from rl_lm.rollout import draw
  from rl_lm.rollout.types import SamplingConfig

  topology = chips.resolve("v5p-64")
  mesh = mesh_lib.make_mesh(4, 1, 8, devices=chips.devices(topology))
  B, V = 512, 128256
  cfg = SamplingConfig(max_new_tokens=1, temperature=1.0)
  keys = jax.eval_shape(lambda: jax.vmap(jax.random.key)(jnp.arange(B)))
  args = [_sds(mesh, (B, V), jnp.float32, P("data", "tensor")), _sds(mesh, keys.shape, keys.dtype, P("data"))]
  kept, out = draw.BLOCK_MULTIPLE, {}
  size = 1 << int(np.ceil(np.log2(np.sqrt(V))))
  try:
    for multiple in (1, kept):
      draw.BLOCK_MULTIPLE = multiple
      seconds, read = _cost(lambda x, k: draw.sample_token(x, None, cfg, row_keys=k), args)
      out[-(-V // (size * multiple)) * multiple] = (read, seconds)
  finally:
    draw.BLOCK_MULTIPLE = kept
  return out


def decode_steps(rows: list[int]) -> None:
  import importlib.util

  from rl_lm import config as config_lib
  from rl_lm.aot import measure, programs, stages
  from rl_lm.runs import ROOT

  spec = importlib.util.spec_from_file_location("pod_config", ROOT / "configs" / "pod.py")
  pod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(pod)

  topology = chips.resolve("v5p-64")
  devices = chips.devices(topology)
  print("4. Llama-3.1-8B's decode step (configs/pod.py, v5p-64, data 4 x tensor 8, all 32 layers), per chip:")
  for n in rows:
    config = pod.get_config("model=llama-3.1-8b,recipe=grpo")
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 4, 1, 8
    config.rl.prompts_per_step = n // config.rl.group_size
    config_lib.validate(config, num_devices=topology.chips)
    mesh = mesh_lib.make_mesh(4, 1, 8, devices=devices)
    a = programs.context(config, mesh)
    decode = next(p for p in stages.rl_stage(a).programs if p.name.endswith(":decode"))
    compiler = measure.Compiler(1, topology)
    try:
      done = compiler.submit("decode", decode.cost[0].build(a.model), cost_piece=True,
                             unroll=max(measure.UNROLL_LIMIT, a.model.n_layers)).result()
    finally:
      compiler.close()
    if done.cost is None:
      print(f"   {n} rows: {done.error}")
      continue
    roofline = decode.roofline_bytes / a.chips
    print(f"   {n:5d} rows: {done.cost.bytes / 1e9:6.2f} GB counted, roofline {roofline / 1e9:5.2f} GB; "
          f"{done.cost.seconds * 1e3:.3f} ms = {done.cost.seconds / (roofline / topology.chip.hbm_bandwidth):.2f}x "
          f"the HBM roofline ({done.seconds:.0f} s to compile)", flush=True)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", default="", help="decode steps of Llama-3.1-8B at these rows, comma-separated")
  args = parser.parse_args(argv)
  bandwidth()
  L, B, S, Dh = KEY_WRITE
  print(f"2. One key written a layer ({L} layers of {B} rows x 1 kv head x {S} slots x {Dh}, bf16, one v5p chip):")
  for name, (read, seconds) in key_writes().items():
    print(f"   {name:12s} {read / 1e6:6.2f} MB and {seconds * 1e6:5.1f} us a layer "
          f"(the key itself: {B * Dh * 2 / 1e6:.3f} MB)")
  print("3. The draw of 512 rows over 128,256 tokens, v5p-64 at data 4 x tensor 8 (vocabulary over tensor), per chip:")
  for blocks, (read, seconds) in draws().items():
    print(f"   {blocks} blocks: {read / 1e6:6.1f} MB, {seconds * 1e6:5.1f} us")
  if args.rows:
    decode_steps([int(r) for r in args.rows.split(",")])
  return 0


if __name__ == "__main__":
  sys.exit(main())
