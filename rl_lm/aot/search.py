"""`python -m rl_lm.aot --search`: the (data, fsdp, tensor) meshes of a slice, ranked by XLA's estimate.

Every shape whose axes multiply to the slice's chips and pass the config's validation (the batch must split over
its data-parallel axes) is a candidate. For each, the programs a stage runs every step (RL: generate, prepare,
update; SFT, DPO, reward model: the update; sample: generate) are costed as `python -m rl_lm.aot` costs them
(rl_lm/aot/measure.py), and their estimated seconds summed. Then, per stage, the candidates are compiled whole in
that order until one fits: the first is the fastest that fits, by XLA's estimate (for GPUs, which have none, by
the roofline of XLA's counts: rl_lm/aot/report.py). A candidate whose estimate is flagged (it disagrees with the
analytic count) is ranked last.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from rl_lm import mesh as mesh_lib
from rl_lm.aot import measure, programs, report
from rl_lm.aot import stages as stages_lib
from rl_lm.aot.chips import GIB, Topology


def shapes(chips: int) -> list[tuple[int, int, int]]:
  """Every (data, fsdp, tensor) with data * fsdp * tensor = chips."""
  divisors = [d for d in range(1, chips + 1) if chips % d == 0]
  return [(chips // (f * t), f, t) for t in divisors for f in divisors if (chips // t) % f == 0]


def with_mesh(config: Any, shape: tuple[int, int, int]) -> Any:
  out = copy.deepcopy(config)
  out.mesh.data, out.mesh.fsdp, out.mesh.tensor = shape
  return out


def candidates(config: Any, chips: int) -> list[tuple[int, int, int]]:
  """The shapes the config validates with (the batch splits over the data-parallel axes)."""
  from rl_lm import config as config_lib

  out = []
  for shape in shapes(chips):
    try:
      config_lib.validate(with_mesh(config, shape), num_devices=chips)
    except config_lib.ConfigError:
      continue
    out.append(shape)
  return out


def _step_programs(stage: programs.Stage) -> programs.Stage:
  """The stage with only the programs it runs every step (and their pieces)."""
  keep = {p.name for p in stage.programs if p.per_step}
  stage.programs = [p for p in stage.programs if p.per_step or p.part_of in keep]
  return stage


def _stages(config: Any, devices: list[Any], shape: tuple[int, int, int], cost: bool, memory: bool
            ) -> tuple[programs.Abstract, list[programs.Stage]]:
  mesh = mesh_lib.make_mesh(*shape, devices=devices)
  a = programs.context(with_mesh(config, shape), mesh)
  stages = [_step_programs(s) for s in stages_lib.configured(a, cost)]
  if not memory:
    for s in stages:
      for p in s.programs:
        p.memory = None
  return a, stages


def _label(shape: tuple[int, int, int]) -> str:
  return f"data={shape[0]} fsdp={shape[1]} tensor={shape[2]}"


def run(config: Any, topology: Topology, devices: list[Any], workdir: str, workers: int,
        log: Any = print) -> str | None:
  """Ranks the candidates, finds the fastest that fits per stage; returns a refusal line when a stage fits none."""
  found = candidates(config, topology.chips)
  log(f"rl_lm.aot: searching {len(found)} mesh shapes of {topology.chips} chips")
  names = list(dict.fromkeys(config.stages))
  estimates: dict[tuple[int, int, int], dict[str, float | None]] = {}
  for shape in found:
    a, stages = _stages(config, devices, shape, cost=True, memory=False)
    rows = report.rows(measure.measure(stages, a.model, workers, log=lambda *_: None, topology=topology), topology)
    per_stage: dict[str, float | None] = {}
    for name in names:
      mine = [r for r in rows if r.result.program.stage == name and r.result.program.per_step]
      per_stage[name] = sum(r.seconds for r in mine) if all(r.checked for r in mine) else None
    estimates[shape] = per_stage
    log(f"rl_lm.aot: {_label(shape)}: " + ", ".join(
      f"{n} {'flagged' if s is None else f'{s:.4g} s'}" for n, s in per_stage.items()))
  best: dict[str, Any] = {}
  fits_cache: dict[tuple[int, int, int], dict[str, tuple[bool, float]]] = {}
  line = None
  for name in names:
    ranked = sorted(found, key=lambda s: (estimates[s][name] is None, estimates[s][name] or 0.0))
    for shape in ranked:
      if shape not in fits_cache:
        a, stages = _stages(config, devices, shape, cost=False, memory=True)
        rows = report.rows(measure.measure(stages, a.model, workers, log=lambda *_: None, topology=topology), topology)
        fits_cache[shape] = {n: (all(r.fits for r in rows if r.result.program.stage == n and r.result.compiled),
                                 max((r.needed or 0.0) for r in rows if r.result.program.stage == n))
                             for n in names}
      ok, need = fits_cache[shape][name]
      log(f"rl_lm.aot: {name}: {_label(shape)} {'fits' if ok else 'does not fit'} ({need / GIB:.1f} GiB per chip)")
      if ok:
        best[name] = {"mesh": dict(zip(("data", "fsdp", "tensor"), shape, strict=True)),
                      "seconds_per_step": estimates[shape][name], "needed_gib": need / GIB}
        break
    if name not in best and line is None:
      line = (f"rl_lm.aot: does not fit: {name}: no mesh shape of {topology.given} fits ({topology.chips} chips of "
              f"{topology.chip.usable_gib:g} GiB): try model.remat=True, model.logit_chunk=128, smaller batches, "
              "model.lora.rank=16, more chips")
  own = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  lines = ["mesh | " + " | ".join(f"{n} s/step" for n in names), "--- | " + " | ".join("---" for _ in names)]
  for shape in found:
    mark = " (config)" if shape == own else ""
    lines.append(f"{_label(shape)}{mark} | " + " | ".join(
      "flagged" if estimates[shape][n] is None else f"{estimates[shape][n]:.4g}" for n in names))
  log("\n".join(lines))
  basis = "the roofline of XLA's counts" if topology.gpu else "XLA's estimate"
  for name, b in best.items():
    log(f"rl_lm.aot: fastest that fits for {name}: {' '.join(f'{k}={v}' for k, v in b['mesh'].items())} "
        f"({b['seconds_per_step']:.4g} s per step by {basis}, {b['needed_gib']:.1f} GiB per chip)")
  path = os.path.join(workdir, f"aot_search_{topology.given.replace(':', '_')}.json")
  report.write(path, {"topology": topology.given, "chips": topology.chips,
                      "estimates": [{"mesh": _label(s), "seconds_per_step": estimates[s]} for s in found],
                      "best": best, "refusal": line})
  log(f"rl_lm.aot: wrote {path}")
  return line
