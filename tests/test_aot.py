"""Ahead-of-time compilation for TPU slices on this CPU (rl_lm/aot), and the pod launcher's pre-flight.

The compile tests need libtpu (requirements-test.txt pins it); without it they are skipped, saying so. The
unit tests of names, parsing and the analytic count need nothing.
"""

from __future__ import annotations

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


@pytest.mark.parametrize("name, match", [
  ("v5p-3", "count TensorCores"), ("v5p-384", "give its shape as jax names it"), ("v7-8", "unknown topology"),
  ("v5e:2x2x2", "has 2 sides"), ("tpu", "unknown topology"),
])
def test_bad_topology_names(name, match):
  with pytest.raises(chips.TopologyError, match=match):
    chips.resolve(name)


def test_chip_facts_are_complete_and_sourced():
  for chip in chips.CHIPS.values():
    assert chip.peak_flops > 1e14 and chip.hbm_bandwidth > 5e11 and chip.ici_bandwidth > 1e11
    assert 0.9 * chip.hbm_gib < chip.usable_gib < 1.02 * chip.hbm_gib  # XLA keeps a little for itself
    assert "cloud.google.com/tpu/docs/" in chip.source


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


def test_model_config_comes_from_a_checkpoints_config_json_alone(tmp_path):
  import json

  from rl_lm.models import build, hf

  (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(presets.get("qwen2.5-32b"))))  # no weights
  model = ml_collections.ConfigDict({"preset": "tiny", "hf_checkpoint": str(tmp_path), "dtype": "bfloat16",
                                     "param_dtype": "float32", "remat": True, "logit_chunk": 64})
  assert build.config_of(model) == presets.get("qwen2.5-32b", dtype="bfloat16", remat=True, logit_chunk=64)


@pytest.mark.parametrize("config_name, overrides", [
  ("ppo:smoke", {"model.lora.rank": 4, "rl.sampler_dtype": "bfloat16"}),  # sft, rl: a value model, LoRA adapters
  ("rlhf_ppo:smoke", {"sampling.slots": 8}),  # sft, reward_model, rl on the learned reward; continuous batching
  ("dpo:smoke", {}),
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
        call = t.build(a.model.replace(n_layers=1) if t.layers else a.model)
        with measure.unrolled_loops():
          call.fn.lower(*call.args)
      assert p.expected > 0 or not p.cost, p.label
  expected = {"ppo": {"sft/update", "rl/generate", "rl/generate:decode", "rl/prepare", "rl/update", "rl/eval"},
              "rlhf_ppo": {"reward_model/update", "reward_model/score", "rl/reward_score", "rl/generate:decode"},
              "dpo": {"dpo/update", "dpo/reference_logprobs"}}
  assert expected[module] <= names, names


# ------------------------------------------------------------------------------------------------
# Compiling for TPU slices (libtpu)


def _aot(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}  # the tool sets its own
  return subprocess.run([sys.executable, "-m", "rl_lm.aot", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def _rl_results(topology: str, tmp_path: Path) -> tuple[dict, chips.Topology]:
  """The RL step of a small preset, its weights over every chip (fsdp), compiled and costed for `topology`."""
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
  if topology == "v5e:2x2":  # one attention window (two decode pieces fewer); v5p:2x2x2 interpolates between two
    config.sampling.window = config.sampling.max_new_tokens
  t = chips.resolve(topology)
  config_lib.validate(config, num_devices=t.chips)
  mesh = mesh_lib.make_mesh(1, -1, 1, devices=chips.devices(t))
  a = programs.context(config, mesh)
  measured = measure.measure(stages.configured(a), a.model, workers=2, log=lambda *_: None)
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
  # analytic count. Its time estimate too where it gives one: for some of these tiny v5e programs it says -1 (an
  # op it cannot model), and the row is flagged instead of shown.
  for name in ("rl/generate", "rl/generate:prefill", "rl/generate:decode", "rl/prepare", "rl/update"):
    row = rows[name]
    assert report.FLAG_LOW <= row.ratio <= report.FLAG_HIGH, (name, row.ratio)
    if topology == "v5p:2x2x2" or row.checked:
      assert row.checked and row.seconds > 0 and row.tokens_per_s > 0, (name, row.why)
    else:
      assert row.why == "flagged: XLA gave no time estimate (optimal_seconds < 0) for a piece" and row.mfu is None
  if topology == "v5p:2x2x2":
    assert 0 < rows["rl/update"].mfu < 1 and 0 < rows["rl/prepare"].mfu < 1
    assert rows["rl/generate:decode"].roofline >= 1.0  # no program beats the HBM roofline
  # The generate call is its prefill plus every decode step: more than either, less than N full-cache steps.
  gen, dec = rows["rl/generate"].result.cost, rows["rl/generate:decode"].result.cost
  assert rows["rl/generate:prefill"].result.cost.flops + dec.flops < gen.flops
  assert gen.flops < rows["rl/generate:prefill"].result.cost.flops + a.config.sampling.max_new_tokens * dec.flops
  # FSDP gathers the weights: the update's pieces all-gather (and reduce) them.
  assert update.cost.collectives["all-gather"][0] > 0


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
    "rl_lm.aot: unknown topology 'v9-8': give an accelerator type (v5p-64, v5litepod-8, v5e-8, v6e-8, v4-32) or a "
    "jax topology (v5e:2x2, v5p:2x2x2)"]
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
