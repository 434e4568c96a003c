"""The samplers' programs: the whole generate call (its memory) and its pieces (its cost).

A generate call is one prefill and up to N - 1 decode steps in segments of growing attention windows
(`rollout.engine.windows`). The call is compiled whole for its memory; its cost is the prefill plus every decode
step, each window's steps costed by interpolating between the decode step compiled at the first and at the last
window (a step's cost taken as linear in its window), all N tokens drawn. A decode step is compiled with all
the model's layers unrolled, not extrapolated from 1 and 2 (rl_lm/aot/measure.py). The decode step over the
whole cache is also reported alone, against the HBM roofline. With continuous batching (`sampling.slots`) the
cost is the refill step times the steps a queue of prompts needs at most.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.aot import flops
from rl_lm.aot.programs import Abstract, Call, Program, Term, batch_sds, by_rows, key_sds, replicated_sds, sds
from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.rollout import engine
from rl_lm.rollout import generate as drivers
from rl_lm.train import rollout


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
  """One sampler of a stage: its model (the sampler's compute dtype), settings, rows and prompt slots."""

  name: str
  model: ModelConfig
  scfg: sampling.SamplingConfig
  rows: int
  prompt_len: int
  params: Callable[[ModelConfig], Any]  # the policy's parameters, for a model config
  through_sampler: bool = True  # they pass `rollout.Sampler.params` (the "sample" stage calls generate directly)
  gather: bool = False  # `rl.sampler_gather`: the weights whole over the fsdp axis (`rollout.Sampler`)


def _rules(a: Abstract, spec: SamplerSpec) -> mesh_lib.Rules:
  """The rules the sampler's programs run by: with `gather` (and an fsdp axis), nothing but the rows over fsdp."""
  gathered = spec.gather and spec.through_sampler and a.mesh.shape.get("fsdp", 1) > 1
  return mesh_lib.without_axis(a.rules, "fsdp") if gathered else a.rules


def _inputs(a: Abstract, spec: SamplerSpec) -> tuple:
  B, P, K = spec.rows, spec.prompt_len, max(len(spec.scfg.stop_tokens), 1)
  return (batch_sds(a, (B, P), jnp.int32), batch_sds(a, (B,), jnp.int32), key_sds(a),
          replicated_sds(a, (B, K), jnp.int32), replicated_sds(a, (B,), jnp.int32))


def _cast(a: Abstract, spec: SamplerSpec, model: ModelConfig) -> Any:
  """The parameters the sampler's generate is called with: `rollout.Sampler.params` casts them to its compute dtype
  (unless float32) and holds the embedding table whole along the vocabulary."""
  params = spec.params(model)
  if not spec.through_sampler:
    return params
  rules, dtype = _rules(a, spec), model.compute_dtype
  if rules is not a.rules:  # gathered over fsdp, once a rollout
    params = jax.tree.map(lambda x: sds(x.shape, x.dtype, mesh_lib.drop_axis(x.sharding, "fsdp")), params)
  if dtype != jnp.float32:
    params = jax.tree.map(lambda x: sds(x.shape, dtype, x.sharding), params)
  embed = params["embed"]
  return {**params, "embed": sds(embed.shape, embed.dtype, rollout.embed_sharding(a.mesh, rules, embed.shape))}


def _prefill_call(a: Abstract, spec: SamplerSpec, model: ModelConfig) -> Call:
  fn = jax.jit(mesh_lib.bind(functools.partial(drivers.prefill, model, spec.scfg), a.mesh, _rules(a, spec)))
  return Call(fn, (_cast(a, spec, model), *_inputs(a, spec)))


def _step_call(a: Abstract, spec: SamplerSpec, model: ModelConfig, start: Callable, window: int, lockstep: bool,
               rows: int) -> Call:
  """One step of the engine's decode loop, on the state `start` (the static prefill, or the queue's first state)
  leaves; the state is donated, as inside the loop the cache is written in place, never copied."""
  params = _cast(a, spec, model)
  reqs, state = jax.eval_shape(start, params, *_inputs(a, spec))
  fn = jax.jit(mesh_lib.bind(functools.partial(engine.step, model, spec.scfg, window, lockstep), a.mesh,
                             _rules(a, spec)),
               donate_argnums=2)
  results = ("tokens", "logp", "valid", "stopped")  # one row per request; the rest one per cache row
  state = state._replace(**{k: by_rows(a, v, spec.rows if k in results else rows) for k, v in state._asdict().items()})
  return Call(fn, (params, by_rows(a, reqs, spec.rows), state))


def _decode_call(a: Abstract, spec: SamplerSpec, window: int, model: ModelConfig) -> Call:
  start = functools.partial(drivers.prefill, model, spec.scfg)
  return _step_call(a, spec, model, start, window, True, spec.rows)


def _refill_call(a: Abstract, spec: SamplerSpec, model: ModelConfig) -> Call:
  slots = min(spec.scfg.slots, spec.rows)
  start = lambda params, *inputs: drivers.start_queue(model, spec.scfg, slots, *inputs)  # noqa: E731
  window = spec.prompt_len + spec.scfg.max_new_tokens
  return _step_call(a, spec, model, start, window, False, slots)


def weight_bytes(model: ModelConfig) -> float:
  """Bytes of the weights a decode step reads once (whole slice): every matmul weight in the sampler's dtype."""
  return flops.matmul_params(model) * jnp.dtype(model.compute_dtype).itemsize


def cache_bytes(model: ModelConfig, scfg: sampling.SamplingConfig, rows: int, window: int) -> float:
  """Bytes of keys and values a decode step reads over a `window`-slot window (whole slice)."""
  dtype = jnp.dtype(scfg.cache_dtype) if scfg.cache_dtype else model.compute_dtype
  return 2.0 * model.n_layers * rows * model.n_kv_heads * model.head_dim * window * dtype.itemsize


def sampler_programs(a: Abstract, stage: str, spec: SamplerSpec, uses: frozenset[str], cost: bool = True,
                     per_step: bool = False, note: str = "cost not estimated") -> list[Program]:
  """The generate call (memory; cost: prefill + every decode step, all N tokens drawn), and its prefill and last
  decode step apart (cost: the decode step against the HBM roofline). Without `cost`, the call alone, `note`d."""
  model, scfg, B, P = spec.model, spec.scfg, spec.rows, spec.prompt_len
  N = scfg.max_new_tokens
  fn = drivers.jit_generate(model, scfg, a.mesh, _rules(a, spec))
  memory = Call(fn, (_cast(a, spec, model), *_inputs(a, spec)))
  name = spec.name
  if not cost:
    return [Program(stage, name, memory, [], 0.0, uses=uses, tokens=B * N, note=note, per_step=per_step)]
  if scfg.slots:  # one token through every slot a step; each prompt needs at most P + N steps of a slot
    slots = min(scfg.slots, B)
    steps = math.ceil(B * (P + N) / slots)
    step = Term(1, f"{stage}/{name}/refill_step", functools.partial(_refill_call, a, spec), whole=True)
    flop = flops.total(flops.forward(model, slots, 1, P + N, 1))
    call = Program(stage, name, memory, [dataclasses.replace(step, count=steps)], steps * flop, uses=uses,
                   tokens=B * N, note=f"continuous batching: {steps} steps of {slots} slots (every prompt P + N)",
                   per_step=per_step)
    return [call, Program(stage, f"{name}:decode", None, [step], flop, tokens=slots,
                          roofline_bytes=weight_bytes(model) + cache_bytes(model, scfg, slots, P + N), part_of=name,
                          note="one step of every slot (continuous batching)")]
  windows = engine.windows(P, P + N, scfg.window)
  # A decode step is compiled with all its layers (`Term.whole`): XLA:TPU's counts of a 1-, 2- and 3-layer step do
  # not grow evenly, and an extrapolation from two of them can be off by 2x (rl_lm/aot/measure.py).
  ends = {w: Term(1, f"{stage}/{name}/decode@{w}", functools.partial(_decode_call, a, spec, w), whole=True)
          for w in {windows[0], windows[-1]}}
  first, last = ends[windows[0]], ends[windows[-1]]
  prefill = Term(1, f"{stage}/{name}/prefill", functools.partial(_prefill_call, a, spec))
  terms, expected, i = [prefill], flops.total(flops.forward(model, B, P, P, 1)), 1
  for w in windows:
    end = min(N, w - P + 1)  # decode steps i < end run with this window
    if end > i:
      share = 0.0 if len(ends) == 1 else (w - windows[0]) / (windows[-1] - windows[0])
      terms.append(Term(end - i, f"{stage}/{name}/decode@{w}", between=(first, last, share)))
      expected += (end - i) * flops.total(flops.forward(model, B, 1, w, 1))
      i = end
  W = windows[-1]
  decode = Program(stage, f"{name}:decode", None, [last], flops.total(flops.forward(model, B, 1, W, 1)), tokens=B,
                   roofline_bytes=weight_bytes(model) + cache_bytes(model, scfg, B, W), part_of=name,
                   note=f"one step over the whole cache ({W} slots)")
  return [
    Program(stage, name, memory, terms, expected, uses=uses, tokens=B * N, note="all N tokens drawn",
            per_step=per_step),
    Program(stage, f"{name}:prefill", None, [prefill], flops.total(flops.forward(model, B, P, P, 1)), tokens=B * P,
            part_of=name),
    decode,
  ]


def sampling_config(a: Abstract, **changes: Any) -> sampling.SamplingConfig:
  """The run's SamplingConfig, its key layout resolved for the slice's chips (`key_layout` "auto" follows the platform
  the run is on, which here is this CPU, not the target)."""
  scfg = sampling.config_from(a.config.sampling, a.tokenizer)
  platform = a.mesh.devices.flat[0].platform
  layout = "by_slot" if transformer.keys_by_slot(scfg.key_layout, platform) else "transposed"
  return dataclasses.replace(scfg, key_layout=layout, **changes)
