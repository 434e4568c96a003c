"""What `python -m rl_lm.aot` says: the console tables, the JSON record, and the one-line refusal.

Per program and chip: the memory it needs while the run holds the rest of its stage (arguments + outputs -
donated + temporaries + code + the stage's other buffers) against the HBM XLA allots a program; XLA's FLOPs,
bytes and `optimal_seconds` with the loops accounted for; the collectives; MFU on paper (model FLOPs over
optimal_seconds x chips x peak) and tokens/s; for a decode step, how far it is from the HBM roofline (every
weight and the cache window read once per step, spread over the slice).

An estimate is shown only when XLA's FLOPs agree with the analytic count (rl_lm/aot/flops.py) within
[`FLAG_LOW`, `FLAG_HIGH`]; otherwise the row says "flagged" and why, and the JSON keeps the raw numbers under
"unchecked". Where XLA gives no time (a piece's optimal_seconds is negative, as on v5e and v6e programs), the
time is the roofline of XLA's own counts instead, and says so ("roofline" in the table, `seconds_basis` in the
JSON): the slowest of FLOPs / peak, bytes accessed / HBM bandwidth and collective bytes / ICI bandwidth, per chip,
each as if nothing else ran. It is a lower bound on the time, not XLA's estimate.

GPUs: XLA:GPU gives no time estimate, so every GPU row's time is that roofline, with NVLink in place of ICI and,
on several hosts, the collectives that cross hosts at the network's bandwidth (one 400 Gb/s port per GPU, as a
DGX H100 has) added to those within one at NVLink's. Fits are judged against the share of memory JAX's allocator
takes (rl_lm/aot/chips.py), not a compiler's refusal: XLA:GPU compiles a program larger than the GPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from rl_lm.aot import hlo
from rl_lm.aot.chips import GIB, Topology
from rl_lm.aot.measure import Cost, Measured, Result

FLAG_LOW, FLAG_HIGH = 0.85, 1.35


@dataclasses.dataclass
class Row:
  """The figures of one program, derived from its Result."""

  result: Result
  needed: float | None
  fits: bool | None
  ratio: float | None  # XLA FLOPs (whole slice) / analytic
  checked: bool
  why: str  # why not checked
  seconds: float | None
  mfu: float | None
  tokens_per_s: float | None
  roofline: float | None  # seconds / roofline seconds (decode)
  basis: str = ""  # "xla" (optimal_seconds) | "roofline" (see roofline_seconds) | "" (no time)

  @property
  def label(self) -> str:
    return self.result.program.label


def rows(measured: Measured, topology: Topology) -> list[Row]:
  out = []
  chip = topology.chip
  for r in measured.results:
    p = r.program
    needed = r.needed
    fits = None if needed is None else needed <= chip.usable_bytes
    if r.compiled is not None and r.compiled.error and r.compiled.exhausted is None:
      fits = None
    ratio, checked, why, seconds, basis = None, False, "", None, ""
    if r.cost is None:
      why = r.cost_error
    else:
      ratio = r.cost.flops * topology.chips / p.expected if p.expected else None
      if ratio is None:
        why = "no analytic count"
      elif not FLAG_LOW <= ratio <= FLAG_HIGH:
        why = f"flagged: XLA counts {ratio:.2f}x the analytic FLOPs"
      elif r.cost.seconds > 0:
        checked, seconds, basis = True, r.cost.seconds, "xla"
      else:  # NaN: a piece had no time estimate (XLA:GPU has none at all; the tables say so once)
        checked, seconds, basis = True, roofline_seconds(r.cost, topology), "roofline"
        why = "" if topology.gpu else "XLA gave no time for a piece (optimal_seconds < 0): roofline time of its counts"
    mfu = p.model_flops / (seconds * topology.chips * chip.peak_flops) if seconds and p.model_flops else None
    tps = p.tokens / seconds if seconds and p.tokens else None
    roofline_s = p.roofline_bytes / (topology.chips * chip.hbm_bandwidth)
    roofline = seconds / roofline_s if seconds and roofline_s else None
    out.append(Row(r, needed, fits, ratio, checked, why, seconds, mfu, tps, roofline, basis))
  return out


def roofline_seconds(cost: Cost, topology: Topology) -> float:
  """The slowest of one chip's FLOPs at peak, its bytes at HBM bandwidth and its collectives' bytes at ICI (NVLink)
  bandwidth, those across hosts at the network's: a lower bound on the time of a program whose parts did not
  overlap better than perfectly."""
  chip = topology.chip
  moved = sum(b for _, b in cost.collectives.values())
  links = (moved - cost.across_hosts) / chip.ici_bandwidth
  if cost.across_hosts:
    links += cost.across_hosts / chip.host_bandwidth
  return max(cost.flops / chip.peak_flops, cost.bytes / chip.hbm_bandwidth, links)


def _gib(x: float | None) -> str:
  return "-" if x is None else f"{x / GIB:.2f}"


def _num(x: float | None, fmt: str) -> str:
  return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def tables(all_rows: list[Row], topology: Topology) -> str:
  """Two markdown tables: memory per chip, then cost per call."""
  chip = topology.chip
  usable = (f"{chip.usable_gib:.2f} GiB usable ({chip.usable_note}) of {chip.hbm_gib:.2f} GiB {chip.name}"
            if topology.gpu else f"{chip.usable_gib:g} GiB usable of {chip.hbm_gib:g} GiB {chip.name} HBM")
  lines = [f"memory per chip (GiB; fits: need <= {usable})",
           "function | arguments | outputs | donated | temporaries | held by the run | need | fits | compile s",
           "--- | --- | --- | --- | --- | --- | --- | --- | ---"]
  for row in all_rows:
    r = row.result
    c = r.compiled
    if c is None:
      continue
    m = c.memory
    fits = {True: "yes", False: "NO", None: "error"}[row.fits]
    if m is None:
      lines.append(f"{row.label} | {_gib(r.arguments)} | - | - | "
                   f"{_gib(c.exhausted[0]) if c.exhausted else '-'} | {_gib(r.resident)} | {_gib(row.needed)} | "
                   f"{fits} | {c.seconds:.0f}")
    else:
      lines.append(f"{row.label} | {_gib(m.argument)} | {_gib(m.output)} | {_gib(m.alias)} | {_gib(m.temp)} | "
                   f"{_gib(r.resident)} | {_gib(row.needed)} | {fits} | {c.seconds:.0f}")
  source = ("XLA's HloCostAnalysis of each GPU's optimised program, checked against the analytic count; seconds: "
            "the roofline of those counts, XLA:GPU gives no estimate" if topology.gpu else
            "XLA's cost analysis, checked against the analytic count")
  lines += ["", f"cost per call and chip, loops accounted for ({source})",
            "function | TFLOP | XLA / analytic | GB accessed | est. seconds | MFU | tokens/s | x roofline | "
            "collectives | note",
            "--- | --- | --- | --- | --- | --- | --- | --- | --- | ---"]
  for row in all_rows:
    r, p = row.result, row.result.program
    cost = r.cost
    note = "; ".join(x for x in (row.why, p.note) if x)
    if cost is None:
      lines.append(f"{row.label} | - | - | - | - | - | - | - | - | {note}")
      continue
    lines.append(" | ".join([
      row.label, f"{cost.flops / 1e12:.3f}", _num(row.ratio, ".2f"), f"{cost.bytes / 1e9:.2f}",
      (_num(row.seconds, ".4g") + (" (roofline)" if row.basis == "roofline" else "")) if row.checked else "flagged",
      _num(row.mfu and 100 * row.mfu, ".1f") + ("%" if row.mfu else ""), _num(row.tokens_per_s, ",.0f"),
      _num(row.roofline, ".2f"),
      hlo.describe(cost.collectives), note]))
  return "\n".join(lines)


def knobs(row: Row, config: Any, topology: Topology, mesh_shape: dict[str, int]) -> list[str]:
  """The settings that would shrink what this program needs, most specific first."""
  p, m = row.result.program, config.model
  out = []
  training = p.name == "update"
  if training and not m.remat:
    out.append("model.remat=True")
  if (training or p.name == "prepare") and not m.logit_chunk:
    out.append("model.logit_chunk=128")
  if training and p.stage == "rl":
    rl = config.rl
    out.append(f"rl.grad_accum={2 * rl.grad_accum} (or rl.minibatches)")
  elif training:
    out.append(f"{p.stage}.batch_size={max(1, config[p.stage].batch_size // 2)}")
  if p.name.startswith(("generate", "eval")):
    if not config.sampling.cache_dtype and m.dtype == "float32":
      out.append("sampling.cache_dtype=bfloat16")
    if p.stage == "rl" and not config.rl.sampler_dtype and m.dtype == "float32":
      out.append("rl.sampler_dtype=bfloat16")
    if p.name.startswith("eval"):
      out.append(f"eval.rows={max(1, config.eval.rows // 2)}")
  if p.stage == "rl" and not m.lora.rank:
    out.append("model.lora.rank=16")
  chip = topology.chip
  if topology.gpu and row.needed is not None and row.needed <= 0.9 * chip.hbm_gib * GIB:
    out.append(f"XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 ({0.9 * chip.hbm_gib:.1f} GiB)")
  out.append("more GPUs" if topology.gpu else "more chips")
  # fsdp=-1 takes the chips tensor parallelism leaves: it spreads the weights further only where some are left.
  spread = mesh_shape.get("fsdp", 1) * mesh_shape.get("tensor", 1)
  out.append("mesh.fsdp=-1 (the weights over every chip)" if spread < topology.chips
             else "another mesh shape (--search)")
  return out


def refusal(all_rows: list[Row], config: Any, topology: Topology, mesh_shape: dict[str, int]) -> str | None:
  """The one line `python -m rl_lm.aot` exits 2 with, or None when every program compiles and fits. It names a
  program that does not compile, if any, else the one that needs the most memory: how far the run is from fitting,
  and the knobs for that program."""
  bad = [r for r in all_rows if r.result.compiled is not None and (r.fits is False or r.fits is None)]
  if not bad:
    return None
  broken = [r for r in bad if r.fits is None]
  row = broken[0] if broken else max(bad, key=lambda r: r.needed)
  more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
  c = row.result.compiled
  if row.fits is None:
    return f"rl_lm.aot: does not compile: {row.label}: {c.error}{more}"
  chip = topology.chip
  return (f"rl_lm.aot: does not fit: {row.label} needs {row.needed / GIB:.1f} GiB per chip of "
          f"{chip.usable_gib:.4g} GiB ({chip.name}): try {', '.join(knobs(row, config, topology, mesh_shape))}{more}")


def record(all_rows: list[Row], measured: Measured, topology: Topology, mesh_shape: dict[str, int], model: Any,
           line: str | None, extra: dict[str, Any]) -> dict[str, Any]:
  """The JSON record of one run of the tool."""
  chip = topology.chip
  programs = []
  for row in all_rows:
    r, p = row.result, row.result.program
    entry: dict[str, Any] = {"function": row.label, "part_of": p.part_of or None, "note": p.note or None}
    c = r.compiled
    if c is not None:
      m = c.memory
      entry["memory"] = {
        "argument": m.argument if m else r.arguments, "output": m.output if m else None,
        "alias": m.alias if m else None, "temp": m.temp if m else (c.exhausted[0] if c.exhausted else None),
        "code": m.code if m else None, "held_by_run": r.resident, "needed": row.needed,
        "usable": chip.usable_bytes, "fits": row.fits, "error": c.error or None, "compile_seconds": c.seconds}
    if r.cost is not None:
      cost = {"flops": r.cost.flops, "bytes_accessed": r.cost.bytes,
              "optimal_seconds": r.cost.seconds if math.isfinite(r.cost.seconds) else None,
              "seconds": row.seconds, "seconds_basis": row.basis or None,
              "collectives": {k: {"count": v[0], "bytes": v[1]} for k, v in r.cost.collectives.items()},
              "collective_bytes_across_hosts": r.cost.across_hosts, "loops_left": r.cost.loops}
      entry["cost_per_chip" if row.checked else "unchecked"] = cost
    entry["analytic"] = {"expected_flops": p.expected, "xla_over_analytic": row.ratio, "checked": row.checked,
                         "why": row.why or None}
    entry.update({"model_flops": p.model_flops or None, "mfu": row.mfu, "tokens": p.tokens or None,
                  "tokens_per_s": row.tokens_per_s,
                  "roofline_seconds": p.roofline_bytes / (topology.chips * chip.hbm_bandwidth) or None,
                  "x_roofline": row.roofline})
    programs.append(entry)
  return {
    "topology": {"given": topology.given, "jax": topology.jax_name, "accelerator_type": topology.accelerator_type,
                 "chips": topology.chips, "hosts": topology.hosts},
    "chip": dataclasses.asdict(chip), "mesh": mesh_shape, "model": model,
    "programs": programs,
    "compile_seconds": {"programs": measured.memory_s, "cost_pieces": measured.pieces_s, "wall": measured.wall_s,
                        "each_piece": measured.pieces},
    "fits": line is None, "refusal": line,
    "definitions": {
      "needed": "arguments + outputs - donated + temporaries + code + the stage's other buffers the run holds",
      "flops": "XLA cost_analysis per chip; loops unrolled (1 and 2 layers, extrapolated) and multiplied out",
      "model_flops": "6 N per trained token + 12 L H Dh per key attended (forward only: 2 N + 4 L H Dh); N = matmul "
                     "parameters; 4 N for a frozen LoRA base; no rematerialisation",
      "seconds": "optimal_seconds (seconds_basis xla), or where XLA gave none (always on GPUs) the roofline of the "
                 "counts (seconds_basis roofline): max(flops / peak, bytes_accessed / HBM bandwidth, collective bytes "
                 "/ ICI or NVLink bandwidth + collective bytes across hosts / host network bandwidth)",
      "mfu": "model_flops / (seconds x chips x peak bf16 FLOP/s)",
      "x_roofline": "seconds / ((weights + KV window bytes) / (chips x HBM bandwidth))"},
    **extra,
  }


def write(path: str, data: dict[str, Any]) -> None:
  with open(path, "w") as f:
    json.dump(data, f, indent=1)
