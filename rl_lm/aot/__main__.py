"""`python -m rl_lm.aot --config=configs/<x>.py[:variant] --topology=v5p-64 [--search] [--config.key=value ...]`.

Compiles every jitted function of the run's stages for a TPU slice, on this CPU (libtpu compiles for devices
it never touches), and says whether each fits the chip's HBM and how fast XLA expects it to be. With
`--topology=h100-8` (or h100-16: two hosts) it compiles for H100 GPUs instead, through the CUDA plugin (no GPU
needed), and the time is a roofline of XLA's counts (XLA:GPU gives no estimate of its own). The config is
parsed and validated as `rl_lm.main` does, for the slice's chip count. Prints the slice it resolved (chips,
hosts), then a memory table and a cost table (rl_lm/aot/report.py), and writes them as JSON to
<workdir>/aot_<topology>.json (--workdir, default a folder under the system's temporary directory).

  --search      try every (data, fsdp, tensor) mesh that divides the slice and report, per stage, the fastest
                that fits by XLA's estimate (rl_lm/aot/search.py); the config's own mesh is one of them
  --nocost      memory only: the programs as the run calls them, no cost pieces (a quicker pre-flight)
  --workers=N   compiles at once (default 2)

Exit status: 0 when everything compiles and fits; 2 with one line on stderr when anything does not fit
(`rl_lm.aot: does not fit: <stage>/<function> needs X GiB per chip of Y GiB (<chip>): try <knobs>`), does
not compile, or the config or topology is invalid; 1 for a bug (traceback in <workdir>/error.log). Nothing runs:
it is the check `launch/tpu_pod.sh` makes before it starts a job.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # it compiles for TPUs or GPUs and never needs a device of its own
# XLA's C++ logs would only repeat on stderr, unasked, what the tool reports itself (XLA:GPU logs an error for a
# program bigger than the GPU, and its rematerialisation's warnings); read when the backends load, so set here.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tempfile  # noqa: E402
from typing import Any  # noqa: E402

from absl import app, flags  # noqa: E402

from rl_lm import errors  # noqa: E402
from rl_lm import main as main_lib  # noqa: E402 -- its --config and --workdir flags, and their parsing

_TOPOLOGY = flags.DEFINE_string("topology", None, "The TPU slice (v5p-64, v5litepod-8, v6e-8, v4-32, v5e:2x2 ...) or "
                                 "GPUs (h100-8: one host of 8 H100s; h100-16: two)")
_SEARCH = flags.DEFINE_bool("search", False, "Try every mesh shape that divides the slice; report the fastest.")
_COST = flags.DEFINE_bool("cost", True, "Estimate cost (FLOPs, seconds, MFU); --nocost: memory only.")
_WORKERS = flags.DEFINE_integer("workers", 2, "Compiles run at once.")


def refuse(line: str) -> None:
  print(line, file=sys.stderr, flush=True)
  sys.exit(2)


def model_summary(config: Any, model: Any) -> dict[str, Any]:
  m = config.model
  return {"name": m.hf_checkpoint or m.preset, "params": model.num_params(), "layers": model.n_layers,
          "dtype": model.dtype, "param_dtype": model.param_dtype, "remat": model.remat,
          "logit_chunk": model.logit_chunk, "lora_rank": m.lora.rank}


def run(config: Any, topology_name: str, workdir: str, search: bool, cost: bool, workers: int) -> str | None:
  """The tool; returns the refusal line, or None when everything fits."""
  from rl_lm import config as config_lib
  from rl_lm import mesh as mesh_lib
  from rl_lm.aot import chips, measure, programs, report
  from rl_lm.aot import stages as stages_lib

  try:
    topology = chips.resolve(topology_name)
  except chips.TopologyError as e:
    return f"rl_lm.aot: {e}"
  try:
    config_lib.validate(config, num_devices=topology.chips)
  except config_lib.ConfigError as e:
    return f"rl_lm.aot: invalid configuration: {e}"
  print(f"rl_lm.aot: {topology.describe()}", flush=True)
  try:
    devices = chips.devices(topology)
  except chips.TopologyError as e:
    return f"rl_lm.aot: {e}"
  os.makedirs(workdir, exist_ok=True)
  if search:
    from rl_lm.aot import search as search_lib

    return search_lib.run(config, topology, devices, workdir, workers)
  mesh = mesh_lib.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices=devices)
  a = programs.context(config, mesh)
  shape = dict(mesh.shape)
  print(f"rl_lm.aot: mesh {shape}; model {config.model.hf_checkpoint or config.model.preset} "
        f"({a.model.num_params() / 1e9:.2f}B parameters, {a.model.dtype} compute, {a.model.param_dtype} weights); "
        f"stages {', '.join(config.stages)}", flush=True)
  measured = measure.measure(stages_lib.configured(a, cost), a.model, workers, topology=topology)
  rows = report.rows(measured, topology)
  print(report.tables(rows, topology), flush=True)
  line = report.refusal(rows, config, topology, shape)
  path = os.path.join(workdir, f"aot_{topology.given.replace(':', '_')}.json")
  report.write(path, report.record(rows, measured, topology, shape, model_summary(config, a.model), line, {}))
  print(f"rl_lm.aot: compiled in {measured.wall_s:.0f}s ({measured.memory_s:.0f}s of programs, "
        f"{measured.pieces_s:.0f}s of cost pieces, {workers} at once); wrote {path}", flush=True)
  return line


def main(argv: list[str]) -> None:
  del argv
  config, workdir = main_lib._CONFIG.value, main_lib._WORKDIR.value
  if config is None:
    refuse("rl_lm.aot: --config is required, e.g. --config=configs/gsm8k_qwen.py")
  if not _TOPOLOGY.value:
    refuse("rl_lm.aot: --topology is required, e.g. --topology=v5p-64 (or v5litepod-8, v6e-8, v4-32, v5e:2x2, h100-8)")
  workdir = workdir or os.path.join(tempfile.gettempdir(), "rl_lm_aot")
  try:
    line = run(config, _TOPOLOGY.value, workdir, _SEARCH.value, _COST.value, _WORKERS.value)
  except SystemExit:
    raise
  except BaseException as e:  # noqa: BLE001 -- one line; the traceback goes to error.log
    sys.exit(errors.report(e, workdir))
  if line:
    refuse(line)


if __name__ == "__main__":
  app.run(main, flags_parser=main_lib._parse_flags)
