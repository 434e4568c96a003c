"""The pod-scale table: every model x TPU slice x recipe compiled ahead of time on this CPU, in one command.
`--topologies=h100-8` makes the same table for one host of 8 H100 GPUs (rl_lm/aot/chips.py).

  python -m experiments.pod_scale.run [--workdir=experiments/pod_scale/results] [--only=MODEL,...]
      [--topologies=...] [--recipes=grpo,lora,ppo] [--report]

Each cell is one `python -m rl_lm.aot` command (`configs/pod.py`: 512 rows of 256 + 768 tokens; printed with the
table). Its mesh is the first of `meshes(chips, model)` that fits: the first candidate is compiled with costs at
once (memory-only first when its weights and optimizer state alone take 30% of a chip, `unlikely`); when it does
not fit, the others are tried memory-only (`--nocost`) and the first that fits is compiled with costs. A cell where
none fits shows the refusal of the candidate that came closest. A cell takes 10 seconds to 45 minutes on 2 cores
(the 7B and 8B models on v6e-8 the longest: XLA:TPU takes up to 15 minutes over a program near or past a chip's
HBM). Its summary (`<cell>/cell.json`, the whole `rl_lm.aot` record of the mesh chosen inside) is kept in the
repository, so a rerun compiles only what is missing (a cell cut short resumes its search; a cell kept from an
earlier way, `COSTING`, is costed again on its mesh alone, or searched again where the way changed its programs'
memory: `stale`) and `--report` rebuilds the tables from what is there; the compile logs beside it are not kept.
Writes `pod_scale.md` (the tables and the commands) and `pod_scale.json` in the workdir.

The mesh is a rule, not a search (`python -m rl_lm.aot ... --search` ranks every mesh of a slice, at ~10x the
compile time): for a model of 3B parameters or more, tensor parallelism over the 8 chips of a host for the
weights and data parallelism across hosts, the shape that served Llama-3.1-8B best on v5p-64 (README, "At pod
scale"); for a smaller one, FSDP over a host and data across hosts (tensor parallelism of a 0.5B model is all
collectives), the sampler holding the weights gathered over fsdp (`rl.sampler_gather`, set by configs/pod.py).
The same rule holds for GPUs, 8 to a host: tensor parallelism over a host's NVLink, data across hosts.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rl_lm.aot import chips as chips_lib
from rl_lm.metrics import format_duration
from rl_lm.models import presets
from rl_lm.models.presets import ModelConfig
from rl_lm.runs import ROOT

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b", "qwen2.5-32b")
TOPOLOGIES = ("v5e-8", "v5p-8", "v6e-8", "v5p-64", "v5p-256")
RECIPES = ("grpo", "lora", "ppo")
RECIPE_NAMES = {"grpo": "GRPO (policy + reference)", "lora": "GRPO with LoRA rank 16",
                "ppo": "PPO (policy, reference, value and reward model)"}
PHASES = (("rl/generate", "generate"), ("rl/prepare", "prepare"), ("rl/update", "update"),
          ("reward_model/update", "reward model step"))


SMALL = 3e9  # parameters: below this, tensor parallelism costs more in collectives than it saves in memory


def meshes(chips: int, model: ModelConfig) -> list[tuple[int, int, int]]:
  """(data, fsdp, tensor) candidates in order. The tensor size t is the largest power of two up to a host (8
  chips) that divides both head counts (Qwen2.5-7B's 28 query and 4 KV heads: 4; split unevenly, XLA pads the
  heads and counts ~2x the FLOPs). A model of 3B parameters or more: tensor over t chips and data over the rest,
  then the same with FSDP in place of data, then FSDP over the whole slice. A smaller one: FSDP over a host and
  data across hosts first, then FSDP over the slice, then tensor parallelism."""
  host = min(8, chips)
  t = host
  while model.n_heads % t or model.n_kv_heads % t:
    t //= 2
  big = [(chips // t, 1, t), (1, chips // t, t), (1, chips, 1)]
  small = [(chips // host, host, 1), (1, chips, 1), (chips // t, 1, t)]
  return list(dict.fromkeys(big if model.num_params() >= SMALL else small))


# Bytes a run holds per parameter whatever its batch (configs/pod.py: float32 weights, Adam's two float32 moments):
# GRPO the policy, its optimizer state and the reference; LoRA the frozen base alone (the adapters are small); PPO
# adds the value model with its optimizer state and the reward model.
STATE_BYTES = {"grpo": 4 + 8 + 4, "lora": 4, "ppo": 4 + 8 + 4 + 4 + 8 + 4}
# The way the cells' programs are built (rl_lm/aot), and what each way changed, for which recipes. 2: prepare's row
# chunks are costed a few at a time (`stages.prepare_piece`), not all unrolled in one piece: the costs only, so a
# kept cell that fits is costed again on its mesh (`recost`). 3: a learned reward scores the rollout in prepare's
# row chunks, not all its rows at once: the memory, so a kept cell is searched again, a refusal too (`stale`).
COSTING = 3
CHANGES = {2: ("cost", ("grpo", "lora", "ppo")), 3: ("memory", ("ppo",))}
# Of a chip's usable HBM: past it, the activations, rollouts and cache often do not fit in the rest. Every valid first
# mesh kept under 0.3 fits; near it, either way (on tensor 4 of v5p-8, Qwen2.5-7B GRPO at 0.297 fits and
# Llama-3.1-8B at 0.313 does not; Llama-3.1-8B PPO on v5p-64 at 0.312 fits); Qwen2.5-7B PPO on v5p-64 at 0.59 does
# not. Memory-only first costs a third of a compile with costs on a mesh that fits and saves two thirds on one that
# does not: worth it from about even odds.
UNLIKELY = 0.3


def unlikely(model: ModelConfig, recipe: str, chip: chips_lib.Chip, mesh: tuple[int, int, int]) -> bool:
  """True when the weights and optimizer state alone, over the mesh's fsdp x tensor chips, take more than
  `UNLIKELY` of a chip's usable HBM: such a first candidate is compiled memory-only first (about a third of the
  time of a compile with costs), not with costs at once. Only the order of the compiles depends on it, not the cell."""
  return STATE_BYTES[recipe] * model.num_params() / (mesh[1] * mesh[2]) > UNLIKELY * chip.usable_bytes


def _hopeless(record: dict[str, Any] | None, mesh: tuple[int, int, int], chips: int) -> bool:
  """True when a mesh that shards the weights over every chip failed with the update's arguments alone (weights,
  optimizer state, batch) over the usable memory: no other candidate shards them further."""
  if not record or record.get("fits") or mesh[1] * mesh[2] != chips:
    return False
  update = _program(record, "rl/update") or {}
  memory = update.get("memory") or {}
  return bool(memory.get("argument") and memory.get("usable") and memory["argument"] > memory["usable"])


def command(model: str, recipe: str, topology: str, mesh: tuple[int, int, int], workdir: Path,
            cost: bool) -> list[str]:
  data, fsdp, tensor = mesh
  cmd = [sys.executable, "-m", "rl_lm.aot", f"--config=configs/pod.py:model={model},recipe={recipe}",
         f"--topology={topology}", f"--config.mesh.data={data}", f"--config.mesh.fsdp={fsdp}",
         f"--config.mesh.tensor={tensor}", f"--workdir={workdir}"]
  return cmd if cost else [*cmd, "--nocost"]


def shown(cmd: list[str]) -> str:
  """The command as a reader types it: `python -m ...`, without the workdir."""
  return " ".join(["python", *(a for a in cmd[1:] if not a.startswith("--workdir="))])


def _aot(cmd: list[str], folder: Path, reuse: bool = False) -> dict[str, Any] | None:
  """Runs one rl_lm.aot command; its JSON record (with the refusal line, if any), or None when it wrote none. With
  `reuse`, the record an interrupted run of the table left in `folder` instead, if any (memory-only compiles: the
  costing does not change them; a cell whose search was cut short resumes where it stopped)."""
  folder.mkdir(parents=True, exist_ok=True)
  found = sorted(folder.glob("aot_*.json"))
  if reuse and found:
    return json.loads(found[0].read_text())
  for stale in found:  # an earlier run's record is not this one's
    stale.unlink()
  with open(folder / "log.txt", "w") as log:
    run = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.PIPE, text=True)
  found = sorted(folder.glob("aot_*.json"))
  record = json.loads(found[0].read_text()) if found else None
  if record is None and run.returncode:
    return {"fits": False, "refusal": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else
            f"exit status {run.returncode}", "programs": []}
  return record


def _max_need(record: dict[str, Any]) -> float:
  needs = [p["memory"]["needed"] for p in record.get("programs", []) if p.get("memory") and p["memory"]["needed"]]
  return max(needs) if needs else math.inf


def _done(root: Path, model: str, recipe: str, topology: str) -> Path:
  """Where a cell's summary is kept."""
  return root / f"{model}__{topology}__{recipe}" / "cell.json"


def _mesh_folder(root: Path, model: str, recipe: str, topology: str, mesh: tuple[int, ...]) -> Path:
  """Where a cell's compiles of one mesh write their records and logs (not kept in the repository)."""
  return _done(root, model, recipe, topology).parent / f"mesh_{'x'.join(map(str, mesh))}"


def _standing(root: Path, model: str, recipe: str, topology: str) -> bool:
  """Whether the cell is kept and `current`: nothing to compile for it."""
  done = _done(root, model, recipe, topology)
  return done.exists() and current(json.loads(done.read_text()))


def stale(kept: dict[str, Any]) -> str | None:
  """What a kept cell of an earlier way (`COSTING`, `CHANGES`) needs: "memory" (its recipe's programs changed what
  they hold: searched again, a refusal too), "cost" (fitting, costed again on its mesh; a refusal is the memory of
  the programs, which the costing does not touch), or None (it stands)."""
  way = kept.get("costing", 1)
  needs = {what for w, (what, recipes) in CHANGES.items() if w > way and kept["recipe"] in recipes}
  if "memory" in needs:
    return "memory"
  return "cost" if "cost" in needs and (kept.get("record") or {}).get("fits") else None


def current(kept: dict[str, Any]) -> bool:
  """Whether a kept cell stands as it is (`stale`)."""
  return stale(kept) is None


def recost(kept: dict[str, Any], root: Path) -> dict[str, Any]:
  """A kept cell costed an earlier way, costed again on the mesh it fits with (its search is not repeated)."""
  mesh = tuple(kept["mesh"])
  where = _mesh_folder(root, kept["model"], kept["recipe"], kept["topology"], mesh)
  cmd = command(kept["model"], kept["recipe"], kept["topology"], mesh, where / "cost", cost=True)
  start = time.perf_counter()
  record = _aot(cmd, where / "cost")
  if not (record and record.get("fits")):  # the memory programs are unchanged: it fitted, it must fit again
    raise RuntimeError(f"{kept['model']} {kept['topology']} {kept['recipe']}: mesh {mesh} fitted, and now does not: "
                       f"{(record or {}).get('refusal')}")
  return {**kept, "record": record, "command": shown(cmd), "costing": COSTING,
          "seconds": time.perf_counter() - start, "searched_before": kept.get("searched_before", kept["seconds"])}


def cell(model: str, recipe: str, topology: str, root: Path) -> dict[str, Any]:
  """Compiles one cell (see the module docstring) and returns its summary; cached in <root>/<cell>/cell.json."""
  done = _done(root, model, recipe, topology)
  if done.exists():
    kept = json.loads(done.read_text())
    need = stale(kept)
    if need is None:
      return kept
    if need == "cost":
      out = recost(kept, root)
      done.write_text(json.dumps(out, indent=1))
      return out
    for old in done.parent.glob("mesh_*"):  # their records hold the programs as they were: none is reused
      shutil.rmtree(old)
  slice_ = chips_lib.resolve(topology)
  chips, config = slice_.chips, presets.get(model)
  tried, best = [], None
  start = time.perf_counter()
  for k, mesh in enumerate(meshes(chips, config)):
    where = _mesh_folder(root, model, recipe, topology, mesh)
    # The first candidate usually fits: compiled with costs at once, unless its state alone all but fills a chip.
    cost = k == 0 and not unlikely(config, recipe, slice_.chip, mesh)
    cmd = command(model, recipe, topology, mesh, where / ("cost" if cost else "memory"), cost=cost)
    record = _aot(cmd, where / ("cost" if cost else "memory"), reuse=not cost)
    tried.append({"mesh": mesh, "fits": bool(record and record.get("fits")), "refusal": record and record["refusal"]})
    if record and record.get("fits"):
      if not cost:
        cmd = command(model, recipe, topology, mesh, where / "cost", cost=True)
        record = _aot(cmd, where / "cost")
      best = {"mesh": mesh, "record": record, "command": shown(cmd)}
      break
    if best is None or _max_need(record or {}) < _max_need(best["record"] or {}):
      best = {"mesh": mesh, "record": record, "command": shown(cmd)}
    if _hopeless(record, mesh, chips):
      break
  out = {"model": model, "recipe": recipe, "topology": topology, "chips": chips, "tried": tried,
         "seconds": time.perf_counter() - start, "costing": COSTING, **best}
  done.parent.mkdir(parents=True, exist_ok=True)
  done.write_text(json.dumps(out, indent=1))
  return out


def _program(record: dict[str, Any], function: str) -> dict[str, Any] | None:
  return next((p for p in record.get("programs", []) if p["function"] == function), None)


def _flagged(program: dict[str, Any]) -> bool:
  """XLA's counts of the program disagree with the analytic FLOPs (rl_lm/aot/report.py): no figure shown."""
  return str((program.get("analytic") or {}).get("why") or "").startswith("flagged")


def row(c: dict[str, Any]) -> list[str]:
  """One table row: model, slice, fits, GiB per chip, estimated seconds per phase, MFU, decode, mesh."""
  r = c["record"] or {"programs": [], "fits": False, "refusal": "no record"}
  fits = bool(r.get("fits"))
  usable = (r.get("chip") or {}).get("usable_gib")
  need = _max_need(r) / 2**30
  gib = f"{need:.1f}" + (f" / {usable:.4g}" if usable else "") if need < math.inf else "-"
  phases = []
  for function, label in PHASES:
    p = _program(r, function)
    if p is None:
      continue
    cost = p.get("cost_per_chip") or {}
    secs = cost.get("seconds")
    mark = "" if cost.get("seconds_basis") == "xla" else " (roofline)"
    phases.append(f"{label} {secs:.3g}{mark}" if secs else f"{label} {'flagged' if _flagged(p) else '-'}")
  update = _program(r, "rl/update") or {}
  decode = _program(r, "rl/generate:decode") or {}
  mfu = f"{update['mfu']:.1%}" if update.get("mfu") else "-"
  tok = decode.get("tokens_per_s")
  roof = decode.get("x_roofline")
  dec = f"{tok:,.0f} ({roof:.2f}x roofline)" if tok and roof else "-"
  if _flagged(decode) and decode.get("tokens") and decode.get("roofline_seconds"):  # the bound alone
    dec = f"flagged (the HBM roofline: {decode['tokens'] / decode['roofline_seconds']:,.0f})"
  mesh = "x".join(map(str, c["mesh"])) if fits else "-"
  verdict = "yes" if fits else f"no: {(r.get('refusal') or '').removeprefix('rl_lm.aot: ')[:160]}"
  if not fits:  # the closest mesh's figures are of a program that does not run: not shown
    phases, mfu, dec = [], "-", "-"
  need = stale(c)  # until `python -m experiments.pod_scale.run` compiles it again
  if need == "memory":
    phases.append("compiled before the rollout's reward was scored in row chunks†")
  elif need == "cost":
    phases.append("costed the earlier way*")
  return [c["model"], f"{c['topology']} ({c['chips']})", verdict, gib, "; ".join(phases) or "-", mfu, dec, mesh]


def report(cells: list[dict[str, Any]], root: Path) -> str:
  head = ["model", "slice (chips)", "fits?", "GiB per chip (need / usable)",
          "est. seconds per call (XLA; roofline where marked)", "update MFU", "decode tokens/s",
          "mesh (data x fsdp x tensor), by rule"]
  out = []
  for recipe in RECIPES:
    mine = [c for c in cells if c["recipe"] == recipe]
    if not mine:
      continue
    out += [f"### {RECIPE_NAMES[recipe]}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join(row(c)) + " |" for c in mine]
    out.append("")
  if any(stale(c) == "cost" for c in cells):
    out += ["\\* Costed the earlier way (`COSTING` < 2): prepare's row chunks all in one piece, which counts the",
            "FSDP weights' all-gathers once where the run makes them once a chunk.", ""]
  if any(stale(c) == "memory" for c in cells):
    out += ["† Compiled the earlier way (`COSTING` < 3): the learned reward scored all the rollout's rows at once,",
            "where the run now scores them in prepare's row chunks; its memory (and the verdict) as it was then.", ""]
  out += ["Each cell is one command (the mesh is the one the cell fits with):", "", "```"]
  out += [c["command"] for c in cells]
  out += ["```", ""]
  text = "\n".join(out)
  (root / "pod_scale.md").write_text(text)
  (root / "pod_scale.json").write_text(json.dumps(cells, indent=1))
  return text


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", default=str(Path(__file__).parent / "results"))
  parser.add_argument("--only", default=",".join(MODELS), help="models, comma-separated")
  parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
  parser.add_argument("--recipes", default=",".join(RECIPES))
  parser.add_argument("--report", action="store_true", help="only rebuild the tables from the cells done")
  args = parser.parse_args(argv)
  root = Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  # Recipe by recipe, slice by slice: an interrupted run leaves whole rows of the first tables.
  grid = [(m, r, t) for r in args.recipes.split(",") for t in args.topologies.split(",") for m in args.only.split(",")]
  cells, start = [], time.perf_counter()
  todo = [g for g in grid if not _standing(root, *g)]
  compiled = 0
  for i, (model, recipe, topology) in enumerate(grid):
    done = _done(root, model, recipe, topology)
    if args.report:
      if done.exists():
        cells.append(json.loads(done.read_text()))
      continue
    cached = _standing(root, model, recipe, topology)
    c = cell(model, recipe, topology, root)
    cells.append(c)
    if cached:
      continue
    compiled += 1
    spent = time.perf_counter() - start  # the ETA counts the cells compiled in this run, not those found done
    print(f"[{compiled}/{len(todo)}; cell {i + 1} of {len(grid)}] {model} {topology} {recipe}: {row(c)[2][:60]} "
          f"({c['seconds']:.0f}s; {format_duration(spent)} so far, "
          f"ETA {format_duration(spent / compiled * (len(todo) - compiled))})", flush=True)
  print(report(cells, root))
  return 0


if __name__ == "__main__":
  sys.exit(main())
