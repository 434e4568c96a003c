"""What a compiled program's HLO text says about communication: its collectives, by kind, with their bytes.

XLA:TPU writes a collective either at once (`all-gather(...)`, `all-reduce(...)`) or as an asynchronous pair
(`all-gather-start` ... `all-gather-done`); the start is counted. Bytes: the largest array the op moves
(an all-gather's gathered result, a reduce-scatter's input, a permute's message), summed over the arrays of a
variadic op. A collective inside a loop body appears once in the text: `loops` says whether any loop remains
(the cost programs unroll theirs, so their counts are per run).
"""

from __future__ import annotations

import math
import re

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
SHORT = {"all-gather": "AG", "reduce-scatter": "RS", "all-reduce": "AR", "all-to-all": "A2A",
         "collective-permute": "CP"}

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(KINDS) + r")(-start)?\(")


def _arrays(shape: str) -> list[int]:
  """Bytes of each array in an HLO shape string (one array, or a tuple of them)."""
  out = []
  for dtype, dims in _ARRAY.findall(shape):
    if dtype in _BYTES:
      out.append(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d))
  return out


def collectives(text: str) -> dict[str, list[float]]:
  """{kind: [count, bytes]} over the instructions of an HLO module's text (each written instruction once)."""
  found = {k: [0.0, 0.0] for k in KINDS}
  for line in text.splitlines():
    m = _OP.search(line)
    if m is None:
      continue
    shape, kind, start = m.group(1), m.group(2), m.group(3)
    sizes = _arrays(shape)
    if not sizes:
      continue
    found[kind][0] += 1
    found[kind][1] += max(sizes) if start or not shape.startswith("(") else sum(sizes)
  return found


def loops(text: str) -> int:
  """How many while loops the module's text holds."""
  return len(re.findall(r"\swhile\(", text))


def describe(found: dict[str, list[float]]) -> str:
  """'AG 64 x 1.2 GiB, AR 3 x 0.1 MiB' style: count and total bytes of each kind present."""
  parts = []
  for kind in KINDS:
    count, size = found.get(kind, (0, 0))
    if count:
      parts.append(f"{SHORT[kind]} {count:.0f}: {_size(size)}")
  return ", ".join(parts) or "none"


def _size(n: float) -> str:
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= scale:
      return f"{n / scale:.1f} {unit}"
  return f"{n:.0f} B"
