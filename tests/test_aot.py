"""Ahead-of-time compilation for TPU slices and H100 GPUs on this CPU (rl_lm/aot), and the pod launcher's pre-flight.

The compile tests need libtpu, or for GPUs the CUDA plugin and ptxas (requirements-test.txt pins them); without
them they are skipped, saying so. The unit tests of names, parsing and the analytic count need nothing.
"""

from __future__ import annotations

import math
import os
import shlex
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rl_lm.aot import chips, flops, hlo, measure
from rl_lm.models import presets

ROOT = Path(__file__).resolve().parents[1]

try:
  import libtpu  # noqa: F401

  HAVE_LIBTPU = True
except ImportError:
  HAVE_LIBTPU = False
needs_libtpu = pytest.mark.skipif(not HAVE_LIBTPU, reason="libtpu is not installed (pip install -r "
                                  "requirements-test.txt pins libtpu==0.0.42.1): nothing to compile for TPUs with")
HAVE_CUDA = chips._spec("jax_plugins.xla_cuda12") is not None and chips.cuda_data_dir() is not None
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="the CUDA plugin or ptxas is not installed (pip install -r "
                                "requirements-test.txt pins them): nothing to compile for GPUs with")


# ------------------------------------------------------------------------------------------------
# Names, parsing, counting: no compiler


@pytest.mark.parametrize("name, chip, shape, n_chips, hosts", [
  ("v5p-64", "v5p", (2, 4, 4), 32, 8),  # v5p and v4 accelerator types count TensorCores, two per chip
  ("v5p-8", "v5p", (2, 2, 1), 4, 1),
  ("v4-32", "v4", (2, 2, 4), 16, 4),
  ("v5litepod-8", "v5e", (2, 4), 8, 1),  # v5e and v6e count chips; up to 8 chips are one host
  ("v5e-16", "v5e", (4, 4), 16, 4),
  ("v6e-8", "v6e", (2, 4), 8, 1),
  ("v5e-1", "v5e", (1, 1), 1, 1),
  ("v5e:2x2", "v5e", (2, 2), 4, 1),  # jax's names
  ("v5p:2x2x2", "v5p", (2, 2, 2), 8, 2),
  ("v5:4x4x12", "v5p", (4, 4, 12), 192, 48),
  ("V6E:4x4", "v6e", (4, 4), 16, 4),
])
def test_topology_names(name, chip, shape, n_chips, hosts):
  t = chips.resolve(name)
  assert (t.chip.name, t.shape, t.chips, t.hosts) == (chip, shape, n_chips, hosts)
  if not t.chips & (t.chips - 1):  # a standard shape: its accelerator type names it again
    assert chips.resolve(t.accelerator_type).shape == shape


@pytest.mark.parametrize("name, shape, jax_name", [
  ("h100-8", (1, 8), "1x1x8"),  # one host of 8
  ("h100-16", (2, 8), "1x2x8"),  # two hosts of 8
  ("H100-4", (1, 4), "1x1x4"),  # part of a host
  ("h100-64", (8, 8), "1x8x8"),
])
def test_gpu_topology_names(name, shape, jax_name):
  t = chips.resolve(name)
  assert t.gpu and t.chip.name == "h100" and t.chip.platform == "cuda"
  assert (t.shape, t.chips, t.hosts, t.jax_name) == (shape, shape[0] * shape[1], shape[0], jax_name)
  assert t.accelerator_type == f"h100-{t.chips}"
  assert not chips.resolve("v5e-8").gpu


@pytest.mark.parametrize("name, match", [
  ("v5p-3", "count TensorCores"), ("v5p-384", "give its shape as jax names it"), ("v7-8", "unknown topology"),
  ("v5e:2x2x2", "has 2 sides"), ("tpu", "unknown topology"), ("h100-12", "come 8 to a host"),
  ("h100-0", "come 8 to a host"), ("a100-8", "unknown topology"),
])
def test_bad_topology_names(name, match):
  with pytest.raises(chips.TopologyError, match=match):
    chips.resolve(name)


def test_chip_facts_are_complete_and_sourced():
  for chip in chips.CHIPS.values():
    assert chip.peak_flops > 1e14 and chip.hbm_bandwidth > 5e11 and chip.ici_bandwidth > 1e11
    assert 0.9 * chip.hbm_gib < chip.usable_gib < 1.02 * chip.hbm_gib  # XLA keeps a little for itself
    assert "cloud.google.com/tpu/docs/" in chip.source


def test_gpu_facts_agree_with_the_description_xla_compiles_for():
  """The H100's figures (chips.py) and its description (h100_sxm.txtpb) say the same, and the dense bf16 peak is
  what the SMs make: 132 SMs x 4 tensor cores x 512 FMA per clock at the 1.83 GHz boost NVIDIA rates it at."""
  import re

  chip = chips.GPUS["h100"]
  text = chips.TARGET_CONFIGS["h100"].read_text()

  def field(name: str) -> float:
    return float(re.search(rf"^\s*{name}: ([\d.]+)", text, re.M).group(1))

  assert field("device_memory_size") == chip.hbm_gib * chips.GIB
  assert field("memory_bandwidth") == chip.hbm_bandwidth == 3.35e12
  assert chip.usable_gib == pytest.approx(0.75 * chip.hbm_gib) and 59 < chip.usable_gib < 60
  assert f'name: "{chip.device_kind}"' in text and f'device_description_str: "{chip.device_kind}"' in text
  assert field("core_count") * 4 * 512 * 2 * 1.83e9 == pytest.approx(chip.peak_flops, rel=1e-3)
  assert (chip.ici_bandwidth, chip.host_bandwidth, chip.per_host) == (900e9, 100e9, 8)
  assert "nvidia.com" in chip.source


def test_out_of_memory_messages_parse():
  message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
             "(35.11G) exceeds available HBM (15.75G).")
  assert measure.parse_exhausted(message) == pytest.approx((35.11 * 2**30, 15.75 * 2**30))
  assert measure.parse_exhausted("XLA:TPU compile permanent error. Used 20.5G of 15.75G hbm.") == pytest.approx(
    (20.5 * 2**30, 15.75 * 2**30))
  assert measure.parse_exhausted("INVALID_ARGUMENT: something else") is None


HLO = textwrap.dedent("""\
  ENTRY %main (p: bf16[4096,128]) -> bf16[4096,512] {
    %p = bf16[4096,128]{1,0:T(8,128)(2,1)} parameter(0)
    %ag = (bf16[4096,128]{1,0}, bf16[4096,512]{1,0}) all-gather-start(%p), channel_id=1, dimensions={1}
    %agd = bf16[4096,512]{1,0} all-gather-done(%ag)
    %ar = (f32[]{:T(128)}, f32[1024]{0:T(1024)}) all-reduce(%x, %y), channel_id=2, to_apply=%add
    %cp = (bf16[8,128]{1,0}, bf16[8,128]{1,0}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%p), channel_id=3
    %rs = f32[16,64]{1,0} reduce-scatter(%z), channel_id=4, dimensions={0}
    %w = (s32[], bf16[2]) while(%t), condition=%cond, body=%body
  }
""")


def test_collectives_are_counted_with_their_bytes():
  found = hlo.collectives(HLO)
  assert found["all-gather"] == [1, 4096 * 512 * 2]  # the gathered result; the -done is not counted again
  assert found["all-reduce"] == [1, 4 + 1024 * 4]  # a variadic all-reduce moves all its arrays
  assert found["collective-permute"] == [1, 8 * 128 * 2]
  assert found["reduce-scatter"] == [1, 16 * 64 * 4]
  assert found["all-to-all"] == [0, 0]
  assert hlo.loops(HLO) == 1
  assert hlo.describe(found) == "AG 1: 4.0 MiB, RS 1: 4.0 KiB, AR 1: 4.0 KiB, CP 1: 2.0 KiB"


def test_a_collective_continued_through_a_chain_of_fusions_counts_once():
  """XLA:TPU writes one all-gather (one channel id, a chain_id) into each async collective fusion of its chain, as in a
  Qwen2.5-0.5B decode step's table gather: it runs once. Unchained instructions all count, even alike ones."""
  gather = ("  %all-gather.{i} = bf16[151936,896]{{0,1:T(8,128)(2,1)}} all-gather(%param_0.{i}), channel_id=25, "
            "replica_groups=mesh['axis_0'=1,'axis_1'=8] {{'axis_1'}}, dimensions={{1}}, use_global_device_ids=true, "
            'frontend_attributes={{chain_id="0"}}, metadata={{op_name="jit(wrapped)/btd,vd->btv/dot_general"}}')
  other = ("  %all-gather.9{i} = bf16[896,896]{{0,1}} all-gather(%p.{i}), channel_id=1{i}, "
           "replica_groups=mesh['axis_0'=1,'axis_1'=8] {{'axis_1'}}, dimensions={{1}}")
  text = "\n".join([gather.format(i=i) for i in range(11)] + [other.format(i=i) for i in range(2)])
  assert hlo.collectives(text)["all-gather"] == [3, 151936 * 896 * 2 + 2 * 896 * 896 * 2]
  assert hlo.across_hosts(text, per_host=4, devices=8) == 151936 * 896 * 2 + 2 * 896 * 896 * 2


@pytest.mark.parametrize("line, expected", [
  ("replica_groups={{0,2},{1,3}}, dimensions={0}", [[0, 2], [1, 3]]),
  ("source_target_pairs={{0,1},{1,0}}, channel_id=3", [[0, 1], [1, 0]]),
  ("replica_groups={}, to_apply=%add", []),
  ("replica_groups=[2,4]<=[8], use_global_device_ids=true", [[0, 1, 2, 3], [4, 5, 6, 7]]),
  ("replica_groups=[2,4]<=[4,2]T(1,0), use_global_device_ids=true", [[0, 2, 4, 6], [1, 3, 5, 7]]),
  # over mesh axes: the devices laid out on the mesh (here transposed), one group per position of the other axes
  ("replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, dimensions={0}",
   [[0, 1, 2, 3], [4, 5, 6, 7]]),
  ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, to_apply=%add", [[0, 4], [1, 5], [2, 6], [3, 7]]),
  ("replica_groups=mesh['a'=16] {'a':(2)4}, dimensions={0}", [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14],
                                                              [9, 11, 13, 15]]),
  ("dimensions={0}", None),
])
def test_collective_groups_parse(line, expected):
  assert hlo.groups(line) == expected


def test_collectives_across_hosts_are_told_apart():
  text = textwrap.dedent("""\
    %a = bf16[1024]{0} all-reduce-start(%x), channel_id=1, replica_groups=[2,8]<=[16], to_apply=%add
    %b = bf16[2048]{0} all-reduce-start(%y), channel_id=2, replica_groups=[8,2]<=[2,8]T(1,0), to_apply=%add
    %c = f32[8]{0} all-reduce(%z), channel_id=3, replica_groups={}, to_apply=%add
    %d = (f32[4]{0}, f32[4]{0}) collective-permute-start(%w), channel_id=4, source_target_pairs={{7,8},{8,7}}
  """)
  # %a within each host of 8; %b pairs GPU i with GPU i + 8; %c every GPU; %d GPU 7 with GPU 8
  assert hlo.across_hosts(text, per_host=8, devices=16) == 2048 * 2 + 8 * 4 + 4 * 4
  assert hlo.across_hosts(text, per_host=16, devices=16) == 0


def test_gpu_roofline_puts_collectives_across_hosts_on_the_network():
  from rl_lm.aot import report

  cost = measure.Cost(flops=989e9, bytes=3.35e9)  # 1 ms of FLOPs at peak, 1 ms of HBM traffic
  cost.collectives["all-reduce"] = [2.0, 0.9e9 + 0.05e9]  # 1 ms of NVLink, and 0.5 ms of the network's
  one_host, two_hosts = chips.resolve("h100-8"), chips.resolve("h100-16")
  assert report.roofline_seconds(cost, one_host) == pytest.approx(0.95e9 / 900e9)
  cost.across_hosts = 0.05e9
  assert report.roofline_seconds(cost, two_hosts) == pytest.approx(0.9e9 / 900e9 + 0.05e9 / 100e9)
  cost.collectives["all-reduce"][1] = cost.across_hosts = 0.0
  assert report.roofline_seconds(cost, two_hosts) == pytest.approx(1e-3)


def test_a_refusal_suggests_fsdp_only_where_it_spreads_the_weights_further():
  """`mesh.fsdp=-1` takes the chips tensor parallelism leaves: with the weights already over every chip by
  tensor parallelism (Qwen2.5-32B with LoRA over tensor 8 on v5e-8) it would change nothing."""
  from types import SimpleNamespace

  from rl_lm.aot import report

  config = ml_collections.ConfigDict({
      "model": {"remat": False, "logit_chunk": 128, "dtype": "float32", "lora": {"rank": 16}},
      "sampling": {"cache_dtype": "bfloat16"}, "rl": {"sampler_dtype": "bfloat16", "grad_accum": 2}})
  row = SimpleNamespace(result=SimpleNamespace(program=SimpleNamespace(name="generate", stage="rl")), needed=None)
  v5e = chips.resolve("v5e-8")

  def last(mesh):
    return report.knobs(row, config, v5e, mesh)[-1]

  assert last({"data": 1, "fsdp": 1, "tensor": 8}) == "another mesh shape (--search)"
  assert last({"data": 1, "fsdp": 8, "tensor": 1}) == "another mesh shape (--search)"
  assert last({"data": 2, "fsdp": 1, "tensor": 4}) == "mesh.fsdp=-1 (the weights over every chip)"
  assert last({"data": 8, "fsdp": 1, "tensor": 1}) == "mesh.fsdp=-1 (the weights over every chip)"


def test_a_refusal_names_the_program_that_needs_the_most():
  """Of the programs that do not fit, the line names the largest (how far the run is from fitting, with that
  program's knobs), not the first compiled; a program that does not compile comes before any that does not fit."""
  from types import SimpleNamespace

  from rl_lm.aot import report

  config = ml_collections.ConfigDict({
      "model": {"remat": True, "logit_chunk": 128, "dtype": "bfloat16", "lora": {"rank": 0}},
      "sampling": {"cache_dtype": "bfloat16"}, "rl": {"sampler_dtype": "bfloat16", "grad_accum": 2},
      "reward_model": {"batch_size": 64}})

  def row(stage, name, gib, fits=False, error=""):
    program = SimpleNamespace(stage=stage, name=name, label=f"{stage}/{name}")
    return SimpleNamespace(result=SimpleNamespace(program=program, compiled=SimpleNamespace(error=error)),
                           needed=gib * 2**30, fits=fits, label=program.label)

  v6e, mesh = chips.resolve("v6e-8"), {"data": 1, "fsdp": 8, "tensor": 1}
  rows = [row("reward_model", "update", 35.0), row("rl", "generate", 38.3), row("rl", "update", 69.1),
          row("rl", "prepare", 12.0, fits=True)]
  assert report.refusal(rows, config, v6e, mesh) == (
    "rl_lm.aot: does not fit: rl/update needs 69.1 GiB per chip of 31.25 GiB (v6e): try rl.grad_accum=4 "
    "(or rl.minibatches), model.lora.rank=16, more chips, another mesh shape (--search) (and 2 more)")
  rows.append(row("rl", "eval", 0.0, fits=None, error="INTERNAL: no layout"))
  assert report.refusal(rows, config, v6e, mesh) == (
    "rl_lm.aot: does not compile: rl/eval: INTERNAL: no layout (and 3 more)")
  assert report.refusal(rows[3:4], config, v6e, mesh) is None


def test_analytic_count_by_hand():
  cfg = presets.get("test")  # V 128, D 64, L 2, H 4, K 2, Dh 16, F 128, tied
  layer = 64 * 16 * (4 + 2 * 2) + 4 * 16 * 64 + 3 * 64 * 128
  assert flops.layer_params(cfg) == layer == 36864
  assert flops.matmul_params(cfg) == 2 * layer + 64 * 128
  f = flops.forward(cfg, rows=3, length=10, keys=10, logits=9)
  assert f == {"layers": 2.0 * 30 * 2 * layer, "attention": 4.0 * 30 * 2 * 4 * 16 * 10, "head": 2.0 * 3 * 9 * 64 * 128}
  hardware, model = flops.training(cfg, 3, 10)
  assert model == 3 * flops.total(f) and hardware == model  # no remat, no logit chunks
  hardware, model = flops.training(cfg.replace(remat=True, logit_chunk=4), 3, 10)
  assert hardware == model + f["layers"] + f["attention"] + f["head"]  # one more forward of each


def test_unrolled_loops_make_xla_count_every_iteration():
  """XLA counts a loop's body once; inside `unrolled_loops` a short scan is unrolled and counted n times."""

  def count(n: int) -> float:  # a new function each time: jit caches what it traced
    f = lambda x: jax.lax.scan(lambda c, _: (c @ c, None), x, None, length=n)[0]
    return jax.jit(f).lower(jax.ShapeDtypeStruct((64, 64), jnp.float32)).compile().cost_analysis()["flops"]

  one = count(1)
  assert count(4) == pytest.approx(one, rel=0.05)  # rolled: the body once, whatever n
  with measure.unrolled_loops():
    assert count(4) == pytest.approx(4 * one, rel=0.05)
    assert count(1000) == pytest.approx(one, rel=0.05)  # past the limit: left rolled
  with measure.unrolled_loops(100):  # a whole decode step's limit: its layer count
    assert count(100) == pytest.approx(100 * one, rel=0.05)
  assert count(4) == pytest.approx(one, rel=0.05)  # and afterwards, as before
  originals = (jax.lax.scan, jax.lax.map, jax.lax.fori_loop)
  with measure.unrolled_loops():
    assert (jax.lax.scan, jax.lax.map, jax.lax.fori_loop) != originals
  assert (jax.lax.scan, jax.lax.map, jax.lax.fori_loop) == originals


def test_cost_extrapolates_linearly_in_layers():
  one = measure.Cost(10.0, 100.0, 1.0)
  two = measure.Cost(14.0, 130.0, 1.5)
  one.collectives["all-gather"] = [2.0, 8.0]
  two.collectives["all-gather"] = [3.0, 12.0]
  per_layer = two.combine(one, 1.0, -1.0)
  total = one.combine(per_layer, 1.0, 31.0)  # 32 layers
  assert (total.flops, total.bytes, total.seconds) == (10 + 31 * 4, 100 + 31 * 30, 1 + 31 * 0.5)
  assert total.collectives["all-gather"] == [2 + 31, 8 + 31 * 4]


def test_a_decode_step_is_costed_with_all_its_layers_not_extrapolated():
  """XLA:TPU's counts of a decode step do not grow evenly with its depth, so its pieces (`Term.whole`) are built
  once with the model's own layers, every one unrolled, however many; other pieces with 1 and 2 layers."""
  import concurrent.futures

  from rl_lm.aot.programs import Term

  class Pieces:  # a Compiler whose compiles cost what their layer count says
    def __init__(self):
      self.futures, self.built = {}, []

    def submit(self, key, call, cost_piece=False, unroll=measure.UNROLL_LIMIT):
      self.built.append((call, unroll))
      future = concurrent.futures.Future()
      future.set_result(measure.Compiled(cost=measure.Cost(10.0 * call, 1e6 * call, 1e-4 * call)))
      self.futures[key] = future

  model = presets.get("test").replace(n_layers=80)
  decode = Term(2, "rl/generate/decode@1024", lambda m: m.n_layers, whole=True)
  coster = measure.Coster(Pieces(), model)
  coster.submit(decode)
  assert coster.compiler.built == [(80, 80)]  # 80 layers, a scan of 80 unrolled (past UNROLL_LIMIT)
  cost, why = coster.cost(decode)
  assert why == "" and (cost.flops, cost.bytes, cost.seconds) == (2 * 800.0, 2 * 80e6, pytest.approx(2 * 8e-3))
  prepare = Term(1, "rl/prepare", lambda m: m.n_layers)
  coster.submit(prepare)
  assert coster.compiler.built[1:] == [(1, 64), (2, 64)]


def test_model_config_comes_from_a_checkpoints_config_json_alone(tmp_path):
  import json

  from rl_lm.models import build, hf

  (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(presets.get("qwen2.5-32b"))))  # no weights
  model = ml_collections.ConfigDict({"preset": "tiny", "hf_checkpoint": str(tmp_path), "dtype": "bfloat16",
                                     "param_dtype": "float32", "remat": True, "logit_chunk": 64})
  assert build.config_of(model) == presets.get("qwen2.5-32b", dtype="bfloat16", remat=True, logit_chunk=64)


@pytest.mark.parametrize("config_name, overrides", [
  ("ppo:smoke", {"model.lora.rank": 4, "rl.sampler_dtype": "bfloat16"}),  # sft, rl: a value model, LoRA adapters
  ("default:smoke", {"rl.sampler_gather": True}),  # the sampler's weights gathered over fsdp
  ("rlhf_ppo:smoke", {"sampling.slots": 8}),  # sft, reward_model, rl on the learned reward; continuous batching
  ("dpo:smoke", {}),
  ("distill:gkd_smoke", {"teacher.preset": "tiny"}),  # rl with a teacher of another depth: its forward, its head
  ("rlaif:direct_smoke", {"judge.preset": "tiny"}),  # rl with the pairwise judge's score as the reward
])
def test_every_program_of_every_stage_lowers(config_name, overrides):
  """Each stage's programs and cost pieces trace with their abstract arguments (here on the 8 CPU devices)."""
  import importlib

  from rl_lm import mesh as mesh_lib
  from rl_lm.aot import programs, stages

  module, variant = config_name.split(":")
  config = importlib.import_module(f"configs.{module}").get_config(variant)
  for key, value in overrides.items():
    section, name = key.rsplit(".", 1)
    config[section][name] = value
  mesh = mesh_lib.make_mesh(2, 2, 2)
  a = programs.context(config, mesh)
  built = stages.configured(a)
  assert [s.name for s in built] == list(dict.fromkeys(config.stages))
  names = set()
  for stage in built:
    assert all(v > 0 for v in stage.resident.values()), stage.resident
    for p in stage.programs:
      names.add(p.label)
      if p.memory is not None:
        p.memory.fn.lower(*p.memory.args)
      pieces = [t for term in p.cost for t in (term.between[:2] if term.between else (term,))]
      for t in pieces:
        model = t.model or a.model  # a teacher's piece varies the teacher's layers
        call = t.build(model.replace(n_layers=1) if t.layers else model)
        with measure.unrolled_loops():
          call.fn.lower(*call.args)
      assert p.expected > 0 or not p.cost, p.label
  expected = {"ppo": {"sft/update", "rl/generate", "rl/generate:decode", "rl/prepare", "rl/update", "rl/eval"},
              "default": {"rl/generate", "rl/generate:decode", "rl/eval"},
              "rlhf_ppo": {"reward_model/update", "reward_model/score", "rl/reward_score", "rl/generate:decode"},
              "dpo": {"dpo/update", "dpo/reference_logprobs"}, "distill": {"rl/teacher", "rl/prepare", "rl/update"},
              "rlaif": {"rl/judge", "rl/update"}}
  assert expected[module] <= names, names
  if module == "default":  # the sampler's own copy of the weights, whole over fsdp; the training state split over it
    programs_ = {p.label: p for stage in built for p in stage.programs}
    spec = lambda tree: {str(x.sharding.spec) for x in jax.tree.leaves(tree)}  # noqa: E731
    assert not any("fsdp" in s for s in spec(programs_["rl/generate"].memory.args[0]))
    assert any("fsdp" in s for s in spec(programs_["rl/update"].memory.args[0]))


# ------------------------------------------------------------------------------------------------
# Compiling for TPU slices (libtpu)


# The tool sets its own (jax's import set this process's TF_CPP_MIN_LOG_LEVEL; a user's shell has none).
_TOOL_ENV = ("JAX_PLATFORMS", "XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL")


def _aot(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k not in _TOOL_ENV}
  return subprocess.run([sys.executable, "-m", "rl_lm.aot", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def _rl_results(topology: str, tmp_path: Path, keep: frozenset[str] | None = None, distill: bool = False,
                prepare_chunks: int = 1) -> tuple[dict, chips.Topology]:
  """The RL step of a small preset, its weights over every chip (fsdp), compiled and costed for `topology`; only
  the programs named in `keep`, if given; with `distill`, GKD (the JSD loss) towards a teacher of the same preset
  stored in bfloat16; prepare (and the teacher) scoring the rows in `prepare_chunks` chunks."""
  from configs import default
  from rl_lm import config as config_lib
  from rl_lm import mesh as mesh_lib
  from rl_lm.aot import programs, report, stages

  config = default.get_config("smoke")
  config.stages = ("rl",)
  config.model.preset = "bench"  # vocab 4096, d 256, 4 layers: small, and wide enough to shard
  config.mesh.data, config.mesh.fsdp = 1, -1
  config.rl.prompts_per_step, config.rl.group_size, config.rl.minibatches, config.rl.grad_accum = 8, 4, 2, 2
  config.eval.rows, config.eval.greedy = 32, False
  config.rl.prepare_chunks = prepare_chunks
  if distill:
    config.rl.distill.coef, config.rl.distill.loss, config.teacher.init_from = 1.0, "jsd", str(tmp_path)
  if topology == "v5e:2x2":  # one attention window (two decode pieces fewer); v5p:2x2x2 interpolates between two
    config.sampling.window = config.sampling.max_new_tokens
  t = chips.resolve(topology)
  config_lib.validate(config, num_devices=t.chips)
  mesh = mesh_lib.make_mesh(1, -1, 1, devices=chips.devices(t))
  a = programs.context(config, mesh)
  built = stages.configured(a)
  for stage in built:
    stage.programs = [p for p in stage.programs if keep is None or p.name in keep]
  measured = measure.measure(built, a.model, workers=2, log=lambda *_: None, topology=t)
  rows = {r.label: r for r in report.rows(measured, t)}
  return {"rows": rows, "a": a, "measured": measured}, t


@needs_libtpu
@pytest.mark.parametrize("topology", ["v5e:2x2", "v5p:2x2x2"])  # one host; two hosts
def test_rl_step_compiles_fits_and_is_sharded(topology, tmp_path):
  from rl_lm.aot import programs, report, stages

  out, t = _rl_results(topology, tmp_path)
  rows, a = out["rows"], out["a"]
  assert t.hosts == (2 if topology == "v5p:2x2x2" else 1)
  for name in ("rl/generate", "rl/prepare", "rl/update", "rl/eval"):
    r = rows[name]
    assert r.result.compiled.error == "" and r.fits, (name, r.result.compiled.error)
    assert 0 < r.needed < t.chip.usable_bytes
  # Parameters are sharded, not replicated: the update's arguments (parameters, Adam moments, batch) per chip are
  # the whole state's over the chips, within the TPU tiles' padding, far from a whole copy.
  update = rows["rl/update"].result
  state = stages.rl_state(a, a.model).state
  whole = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state))
  shards = programs.per_chip_bytes(state)
  assert shards == pytest.approx(whole / t.chips, rel=0.02)  # the norms and counters are all that is replicated
  batch = programs.per_chip_bytes(update.program.memory.args[1])
  assert shards <= update.compiled.memory.argument < 1.6 * shards + batch
  assert update.compiled.memory.argument < whole / 2
  # XLA's FLOPs, loops accounted for (1 epoch x 2 minibatches x 2 micro-batches, 32 decode steps), agree with the
  # analytic count. Its time estimate is XLA's where it gives one; for some of these tiny v5e programs it says -1
  # (an op it cannot model), and the time is the roofline of the counts instead, labelled so.
  for name in ("rl/generate", "rl/generate:prefill", "rl/generate:decode", "rl/prepare", "rl/update"):
    row = rows[name]
    assert report.FLAG_LOW <= row.ratio <= report.FLAG_HIGH, (name, row.ratio)
    assert row.checked and row.seconds > 0 and row.tokens_per_s > 0, (name, row.why)
    if topology == "v5p:2x2x2" or row.basis == "xla":
      assert row.basis == "xla" and row.seconds == row.result.cost.seconds, name
    else:
      assert row.basis == "roofline" and row.seconds == report.roofline_seconds(row.result.cost, t), name
      assert row.why.startswith("XLA gave no time for a piece")
  if topology == "v5p:2x2x2":
    assert 0 < rows["rl/update"].mfu < 1 and 0 < rows["rl/prepare"].mfu < 1
    assert rows["rl/generate:decode"].roofline >= 1.0  # no program beats the HBM roofline
  # The generate call is its prefill plus every decode step: more than either, less than N full-cache steps.
  gen, dec = rows["rl/generate"].result.cost, rows["rl/generate:decode"].result.cost
  assert rows["rl/generate:prefill"].result.cost.flops + dec.flops < gen.flops
  assert gen.flops < rows["rl/generate:prefill"].result.cost.flops + a.config.sampling.max_new_tokens * dec.flops
  # FSDP gathers the weights: the update's pieces all-gather (and reduce) them.
  assert update.cost.collectives["all-gather"][0] > 0


@pytest.mark.parametrize("rows, chunks, group, expected", [
  (512, 8, 8, 1),    # 64 rows a chip, 8 a chunk: one chunk a piece, costed 8 times
  (128, 8, 8, 4),    # 16 rows a chip: 4 chunks give 8 rows a chip
  (64, 8, 4, 8),     # 8 rows a chip: only all 8 chunks give 8
  (512, 8, 128, 2),  # a chunk of 64 rows is half a group: two chunks
  (512, 1, 8, 1),    # no chunks
])
def test_prepare_is_costed_on_the_fewest_chunks_that_give_a_chip_enough_rows(rows, chunks, group, expected):
  """Prepare scores its rows in chunks, a loop that gathers FSDP weights again in each: its cost piece holds as few
  chunks as give every chip PIECE_ROWS rows (XLA:TPU gives no time below) and whole groups, and is counted
  chunks / g times. Rows here are split over 8 chips (data 2 x fsdp 4)."""
  from configs import default
  from rl_lm import mesh as mesh_lib
  from rl_lm.aot import programs, stages

  config = default.get_config("smoke")
  a = programs.context(config, mesh_lib.make_mesh(2, 4, 1))
  assert stages.PIECE_ROWS == 8
  assert stages.prepare_piece(a, rows, chunks, group) == expected


@needs_libtpu
def test_a_distillation_step_compiles_with_its_teacher(tmp_path, monkeypatch):
  """GKD on v5e:2x2: the teacher's forward is a program of its own; it, prepare and the update (which makes the
  teacher's logits from the hidden states it made) fit with the teacher resident, its weights are sharded over the
  chips, and XLA's FLOPs agree with the analytic count, the teacher's head in the update's."""
  from rl_lm.aot import programs, report, stages
  from rl_lm.models import build

  monkeypatch.setattr(stages, "PIECE_ROWS", 4)  # v5e gives these programs no time anyway
  out, t = _rl_results("v5e:2x2", tmp_path, keep=frozenset({"teacher", "prepare", "update"}), distill=True,
                       prepare_chunks=2)
  rows, a = out["rows"], out["a"]
  assert set(rows) == {"rl/teacher", "rl/prepare", "rl/update"}
  # 32 rows in 2 chunks, 8 a chip: a chunk gives a chip 4 rows, so each is costed as 2 calls of one chunk (the FLOP
  # check below then says the count is right).
  for name in ("rl/teacher", "rl/prepare"):
    (term,) = rows[name].result.program.cost
    call = term.build(term.model or a.model)
    tokens = call.args[1] if name == "rl/teacher" else call.args[3].tokens
    assert term.count == 2 and tokens.shape[0] == 16, name
  for name, row in rows.items():
    assert row.result.compiled.error == "" and row.fits and 0 < row.needed < t.chip.usable_bytes, name
    assert report.FLAG_LOW <= row.ratio <= report.FLAG_HIGH and row.checked, (name, row.ratio, row.why)
  teacher = build.abstract_params(presets.get("bench", param_dtype="bfloat16"), a.mesh, a.rules)
  whole = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(teacher))
  assert stages.rl_stage(a, cost=False).resident["teacher"] == pytest.approx(whole / t.chips, rel=0.02)
  args = rows["rl/teacher"].result.compiled.memory.argument
  assert programs.per_chip_bytes(teacher) <= args < whole / 2  # sharded, not a whole copy on each chip


@needs_cuda
def test_rl_step_compiles_for_8_h100s_fits_and_is_sharded(tmp_path):
  """The RL update for one host of 8 H100s, compiled here by the CUDA plugin: it fits, its state is spread over the
  GPUs, XLA's FLOPs agree with the analytic count and the time is the roofline of its counts (XLA:GPU has none)."""
  from rl_lm.aot import programs, report, stages

  out, t = _rl_results("h100-8", tmp_path, keep=frozenset({"update"}))
  rows, a = out["rows"], out["a"]
  assert set(rows) == {"rl/update"} and (t.chips, t.hosts) == (8, 1)
  row = rows["rl/update"]
  update = row.result
  assert update.compiled.error == "" and row.fits and 0 < row.needed < t.chip.usable_bytes
  state = stages.rl_state(a, a.model).state
  whole = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state))
  shards = programs.per_chip_bytes(state)
  assert shards == pytest.approx(whole / 8, rel=0.02)  # the norms and counters are all that is replicated
  batch = programs.per_chip_bytes(update.program.memory.args[1])
  assert shards <= update.compiled.memory.argument <= shards + batch + 2**20  # no tiles to pad, unlike a TPU's
  # FLOPs of 1 epoch x 2 minibatches x 2 micro-batches (HloCostAnalysis of each GPU's program) match the analytic
  # count; the time is the roofline of those counts, said so, with no note on every row.
  assert report.FLAG_LOW <= row.ratio <= report.FLAG_HIGH, row.ratio
  assert row.checked and row.basis == "roofline" and row.why == "" and math.isnan(update.cost.seconds)
  assert row.seconds == report.roofline_seconds(update.cost, t) > 0
  assert 0 < row.mfu < 1 and row.tokens_per_s > 0
  assert update.cost.collectives["all-gather"][0] > 0 and update.cost.across_hosts == 0  # FSDP, on one host
  text = report.tables(report.rows(out["measured"], t), t)
  assert "(roofline)" in text and "XLA:GPU gives no estimate" in text and "59.33 GiB usable" in text


def test_gpus_without_the_cuda_plugin_exit_2_in_one_line(tmp_path):
  """Where the CUDA plugin is not installed (hidden here), asking for GPUs says what to install, in one line."""
  hide = ("import importlib.util, runpy, sys; find = importlib.util.find_spec; importlib.util.find_spec = "
          "lambda name, *a: None if name.startswith('jax_plugins') else find(name, *a); "
          "sys.argv[0] = 'rl_lm.aot'; runpy.run_module('rl_lm.aot', run_name='__main__')")
  env = {k: v for k, v in os.environ.items() if k not in _TOOL_ENV}
  run = subprocess.run([sys.executable, "-c", hide, "--config=configs/sample.py:smoke", "--topology=h100-8",
                        f"--workdir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert run.returncode == 2 and run.stderr.strip().splitlines() == [
    f"rl_lm.aot: h100-8: compiling for GPUs needs the CUDA plugin and ptxas: pip install {chips.CUDA_PACKAGES} "
    "(requirements-test.txt)"], run.stderr[-2000:]


@needs_cuda
def test_a_config_too_big_for_the_gpus_is_refused_in_one_line(tmp_path):
  """XLA:GPU compiles a program bigger than the GPU; the tool refuses it against JAX's memory pool, in one line,
  and nothing from CUDA reaches stderr."""
  import json

  # Qwen2.5-32B's float32 weights whole on every GPU (the smoke config's mesh is all data parallel): 122 GiB each.
  run = _aot("--config=configs/sample.py:smoke", "--topology=h100-8", f"--workdir={tmp_path}", "--nocost",
             "--config.model.preset=qwen2.5-32b")
  assert run.returncode == 2, run.stderr[-2000:]
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1, run.stderr
  assert lines[0].startswith("rl_lm.aot: does not fit: sample/generate needs 12")
  assert "GiB per chip of 59.33 GiB (h100): try " in lines[0]
  assert lines[0].endswith("more GPUs, mesh.fsdp=-1 (the weights over every chip)")
  assert "8 NVIDIA H100 80GB HBM3 GPUs, 1 host of 8, 59.33 GiB usable per GPU" in run.stdout
  data = json.loads((tmp_path / "aot_h100-8.json").read_text())
  assert data["chip"]["platform"] == "cuda" and data["topology"]["jax"] == "1x1x8" and not data["fits"]


@needs_libtpu
def test_a_config_too_big_is_refused_in_one_line(tmp_path):
  run = _aot("--config=configs/sample.py:smoke", "--topology=v5e:2x2", f"--workdir={tmp_path}", "--nocost",
             "--config.model.preset=bench", "--config.sample.batch_size=131072", "--config.sampling.max_new_tokens=480")
  assert run.returncode == 2, run.stderr[-2000:]
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1, run.stderr
  assert lines[0].startswith("rl_lm.aot: does not fit: sample/generate needs ")
  assert "GiB per chip of 15.75 GiB (v5e): try " in lines[0] and "more chips" in lines[0]
  assert "4 v5e chips (v5e:2x2), 1 host" in run.stdout  # what it resolved the slice to


@needs_libtpu
def test_the_tool_prints_tables_and_writes_json(tmp_path):
  import json

  run = _aot("--config=configs/sample.py:smoke", "--topology=v5e-4", f"--workdir={tmp_path}")
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stderr == ""  # quiet: no libtpu noise
  assert "sample/generate:decode" in run.stdout and "| yes |" in run.stdout
  data = json.loads((tmp_path / "aot_v5e-4.json").read_text())
  assert data["fits"] and data["topology"]["chips"] == 4 and data["chip"]["name"] == "v5e"
  decode = next(p for p in data["programs"] if p["function"] == "sample/generate:decode")
  assert decode["analytic"]["checked"] and decode["x_roofline"] >= 1


@needs_libtpu
def test_search_finds_the_fastest_mesh_that_fits(tmp_path):
  import json

  run = _aot("--config=configs/sample.py:smoke", "--topology=v5e:2x2", f"--workdir={tmp_path}", "--search")
  assert run.returncode == 0, run.stderr[-2000:]
  data = json.loads((tmp_path / "aot_search_v5e_2x2.json").read_text())
  shapes = [e["mesh"] for e in data["estimates"]]
  assert len(shapes) == 6 and "data=4 fsdp=1 tensor=1" in shapes and "data=1 fsdp=1 tensor=4" in shapes
  seconds = [e["seconds_per_step"]["sample"] for e in data["estimates"]]
  best = data["best"]["sample"]
  assert best["seconds_per_step"] == min(s for s in seconds if s is not None)  # nothing this small fails to fit
  assert f"fastest that fits for sample: data={best['mesh']['data']}" in run.stdout


def test_bad_topology_and_config_exit_2_in_one_line(tmp_path):
  run = _aot("--config=configs/sample.py:smoke", "--topology=v9-8", f"--workdir={tmp_path}")
  assert run.returncode == 2 and run.stderr.strip().splitlines() == [
    "rl_lm.aot: unknown topology 'v9-8': give an accelerator type (v5p-64, v5litepod-8, v5e-8, v6e-8, v4-32), a "
    "jax topology (v5e:2x2, v5p:2x2x2) or GPUs (h100-8, h100-16)"]
  run = _aot("--config=configs/sample.py:smoke", "--topology=v5e:2x2", f"--workdir={tmp_path}",
             "--config.sample.batch_size=6")
  assert run.returncode == 2 and run.stderr.strip().splitlines() == [
    "rl_lm.aot: invalid configuration: config.sample.batch_size: 6 rows are not divisible by the 4-way data-parallel "
    "mesh axes"]


# ------------------------------------------------------------------------------------------------
# launch/tpu_pod.sh: the pre-flight before the job


def _fake_python(tmp_path: Path, status: int) -> Path:
  """A stand-in for the pre-flight's python: prints its arguments, says one line on stderr and exits `status`."""
  path = tmp_path / "python"
  path.write_text("#!/usr/bin/env bash\necho \"preflight: $*\"\n"
                  f"if [[ {status} != 0 ]]; then echo 'rl_lm.aot: does not fit: rl/update needs 99.0 GiB' >&2; fi\n"
                  f"exit {status}\n")
  path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return path


def _pod(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
  base = {"PATH": os.environ["PATH"], "TPU_NAME": "pod", "ZONE": "us-east5-a", "CONFIG": "configs/gsm8k_qwen.py",
          "WORKDIR": "/mnt/runs/x", "DRY_RUN": "1", "ACCELERATOR": "v5p-64"}
  return subprocess.run(["bash", "launch/tpu_pod.sh", "--config.rl.steps=5"], cwd=ROOT, env={**base, **env},
                        capture_output=True, text=True, timeout=60)


def test_pod_launcher_checks_before_it_starts(tmp_path):
  run = _pod(tmp_path, PYTHON=str(_fake_python(tmp_path, 0)))
  assert run.returncode == 0, run.stderr
  lines = run.stdout.splitlines()
  assert lines[0] == ("preflight: -m rl_lm.aot --config=configs/gsm8k_qwen.py --topology=v5p-64 --nocost "
                      "--config.rl.steps=5")
  words = shlex.split(lines[1])
  assert words[:-1] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", "--zone", "us-east5-a", "--worker=all",
                        "--command"]
  assert words[-1].strip() == ("cd ~/rl_lm && RL_LM_MULTIHOST=1 .venv/bin/python -m rl_lm.main "
                               "--config=configs/gsm8k_qwen.py --workdir=/mnt/runs/x --config.rl.steps=5")


def test_pod_launcher_stops_when_the_preflight_refuses(tmp_path):
  run = _pod(tmp_path, PYTHON=str(_fake_python(tmp_path, 2)))
  assert run.returncode == 2
  assert "gcloud" not in run.stdout  # nothing started
  assert run.stderr.splitlines() == ["rl_lm.aot: does not fit: rl/update needs 99.0 GiB",
                                     "launch/tpu_pod.sh: the pre-flight compile refused the job (exit 2); nothing was "
                                     "started"]


def test_pod_launcher_preflight_on_worker_0_and_without(tmp_path):
  run = _pod(tmp_path, PREFLIGHT="worker0")
  assert run.returncode == 0, run.stderr
  first, second = (shlex.split(line) for line in run.stdout.splitlines())
  assert first[-3:-1] == ["--worker=0", "--command"] and first[-1].strip() == (
    "cd ~/rl_lm && JAX_PLATFORMS=cpu .venv/bin/python -m rl_lm.aot --config=configs/gsm8k_qwen.py --topology=v5p-64 "
    "--nocost --config.rl.steps=5")
  assert "--worker=all" in second and "rl_lm.main" in second[-1]
  run = _pod(tmp_path, PREFLIGHT="0", ACCELERATOR="")
  assert run.returncode == 0 and len(run.stdout.strip().splitlines()) == 1 and "rl_lm.main" in run.stdout
  run = _pod(tmp_path, ACCELERATOR="")  # a dry run cannot ask gcloud for the slice's type
  assert run.returncode == 2 and "DRY_RUN needs ACCELERATOR" in run.stderr


@needs_libtpu
def test_on_a_tpu_a_key_written_by_slot_costs_a_row_and_a_draw_stays_on_its_shard():
  """The two decode-step changes the README's Llama-3.1-8B figures rest on, as XLA:TPU counts them
  (experiments/pod_scale/decode_probe.py): writing one slot of keys stored by slot touches a row of each tile, not
  a column through every tile (v5p: 0.36 against 12.68 MB a layer), and with the inverse CDF's block count padded
  to a multiple of 8 a draw over a vocabulary split over tensor 8 reads a third of what it read gathered."""
  from experiments.pod_scale import decode_probe

  writes = decode_probe.key_writes()
  assert writes["by_slot"][0] * 20 < writes["transposed"][0], writes
  draws = decode_probe.draws()
  assert set(draws) == {251, 256}, draws
  assert draws[256][0] * 2.5 < draws[251][0], draws
