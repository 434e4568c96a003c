"""What `python -m rl_lm.aot` says: the console tables, the JSON record, and the one-line refusal.

Per program and chip: the memory it needs while the run holds the rest of its stage (arguments + outputs -
donated + temporaries + code + the stage's other buffers) against the HBM XLA allots a program; XLA's FLOPs,
bytes and `optimal_seconds` with the loops accounted for; the collectives; MFU on paper (model FLOPs over
optimal_seconds x chips x peak) and tokens/s; for a decode step, how far it is from the HBM roofline (every
weight and the cache window read once per step, spread over the slice).

An estimate is shown only when XLA's FLOPs agree with the analytic count (rl_lm/aot/flops.py) within
[`FLAG_LOW`, `FLAG_HIGH`] and its optimal_seconds is positive; otherwise the row says "flagged" and why, and
the JSON keeps the raw numbers under "unchecked".
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from rl_lm.aot import hlo
from rl_lm.aot.chips import GIB, Topology
from rl_lm.aot.measure import Measured, Result

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
    ratio, checked, why, seconds = None, False, "", None
    if r.cost is None:
      why = r.cost_error
    else:
      ratio = r.cost.flops * topology.chips / p.expected if p.expected else None
      if ratio is None:
        why = "no analytic count"
      elif not FLAG_LOW <= ratio <= FLAG_HIGH:
        why = f"flagged: XLA counts {ratio:.2f}x the analytic FLOPs"
      elif not r.cost.seconds > 0:  # NaN: a piece had no time estimate
        why = "flagged: XLA gave no time estimate (optimal_seconds < 0) for a piece"
      else:
        checked, seconds = True, r.cost.seconds
    mfu = p.model_flops / (seconds * topology.chips * chip.peak_flops) if seconds and p.model_flops else None
    tps = p.tokens / seconds if seconds and p.tokens else None
    roofline_s = p.roofline_bytes / (topology.chips * chip.hbm_bandwidth)
    roofline = seconds / roofline_s if seconds and roofline_s else None
    out.append(Row(r, needed, fits, ratio, checked, why, seconds, mfu, tps, roofline))
  return out


def _gib(x: float | None) -> str:
  return "-" if x is None else f"{x / GIB:.2f}"


def _num(x: float | None, fmt: str) -> str:
  return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def tables(all_rows: list[Row], topology: Topology) -> str:
  """Two markdown tables: memory per chip, then cost per call."""
  usable = topology.chip.usable_gib
  chip = topology.chip
  lines = [f"memory per chip (GiB; fits: need <= {usable:g} GiB usable of {chip.hbm_gib:g} GiB {chip.name} HBM)",
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
  lines += ["", "cost per call and chip, loops accounted for (XLA's cost analysis, checked against the analytic count)",
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
      _num(row.seconds, ".4g") if row.checked else "flagged", _num(row.mfu and 100 * row.mfu, ".1f") + (
        "%" if row.mfu else ""), _num(row.tokens_per_s, ",.0f"), _num(row.roofline, ".2f"),
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
  out.append("more chips")
  out.append("mesh.fsdp=-1 (the weights over every chip)" if mesh_shape.get("fsdp", 1) < topology.chips
             else "another mesh shape (--search)")
  return out


def refusal(all_rows: list[Row], config: Any, topology: Topology, mesh_shape: dict[str, int]) -> str | None:
  """The one line `python -m rl_lm.aot` exits 2 with, or None when every program compiles and fits."""
  bad = [r for r in all_rows if r.result.compiled is not None and (r.fits is False or r.fits is None)]
  if not bad:
    return None
  row = bad[0]
  more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
  c = row.result.compiled
  if row.fits is None:
    return f"rl_lm.aot: does not compile: {row.label}: {c.error}{more}"
  chip = topology.chip
  return (f"rl_lm.aot: does not fit: {row.label} needs {row.needed / GIB:.1f} GiB per chip of {chip.usable_gib:g} "
          f"GiB ({chip.name}): try {', '.join(knobs(row, config, topology, mesh_shape))}{more}")


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
              "collectives": {k: {"count": v[0], "bytes": v[1]} for k, v in r.cost.collectives.items()},
              "loops_left": r.cost.loops}
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
      "mfu": "model_flops / (optimal_seconds x chips x peak bf16 FLOP/s)",
      "x_roofline": "optimal_seconds / ((weights + KV window bytes) / (chips x HBM bandwidth))"},
    **extra,
  }


def write(path: str, data: dict[str, Any]) -> None:
  with open(path, "w") as f:
    json.dump(data, f, indent=1)
