"""What a compiled program's HLO text says about communication: its collectives, by kind, with their bytes.

XLA:TPU writes a collective either at once (`all-gather(...)`, `all-reduce(...)`) or as an asynchronous pair
(`all-gather-start` ... `all-gather-done`); the start is counted. Bytes: the largest array the op moves
(an all-gather's gathered result, a reduce-scatter's input, a permute's message), summed over the arrays of a
variadic op. A collective inside a loop body appears once in the text: `loops` says whether any loop remains
(the cost programs unroll theirs, so their counts are per run). A collective XLA:TPU continues through a chain of
async fusions is written once per fusion and counted once (`_written`).

Across hosts: GPUs of one host talk over NVLink, GPUs of different hosts over the network, an order of magnitude
slower. `across_hosts` sums the bytes of the collectives whose device groups hold devices of more than one host.
XLA writes the groups three ways: listed (`replica_groups={{0,1},{2,3}}`, a permute's `source_target_pairs`), as
an iota (`replica_groups=[G,S]<=[dims]T(perm)`), or over the axes of a mesh (`replica_groups=mesh['axis_0'=2,
'axis_1'=8], device_ids=([8,2]T(1,0)) {'axis_1'}`: the devices laid out on the mesh, one group per position of
the other axes; `'axis_1':(2)4` is the middle part of that axis split as 2 x 4 x rest). The ids are the program's
devices in order (SPMD partitions, `use_global_device_ids`), which `rl_lm.mesh.make_mesh` lays out host by host:
id // (devices per host) is the host.
"""

from __future__ import annotations

import math
import re

import numpy as np

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


def _moved(line: str) -> tuple[str, int] | None:
  """(kind, bytes) of the collective an HLO instruction line is, or None."""
  m = _OP.search(line)
  if m is None:
    return None
  shape, kind, start = m.group(1), m.group(2), m.group(3)
  sizes = _arrays(shape)
  if not sizes:
    return None
  return kind, max(sizes) if start or not shape.startswith("(") else sum(sizes)


_CHAIN = re.compile(r'channel_id=(\d+).*chain_id="(\d+)"')


def _written(text: str) -> list[tuple[str, str, int]]:
  """(line, kind, bytes) of each collective the module's text holds, once. XLA:TPU may overlap one collective with
  the compute around it by continuing it through a chain of async collective fusions: the same instruction (one
  channel id, a `chain_id` attribute) is then written into every fusion of the chain, 11 times for the table's
  all-gather of a Qwen2.5-0.5B decode step, yet it runs once. Such a copy counts once."""
  out, seen = [], set()
  for line in text.splitlines():
    moved = _moved(line)
    if moved is None:
      continue
    chained = _CHAIN.search(line)
    if chained is not None:
      if chained.groups() in seen:
        continue
      seen.add(chained.groups())
    out.append((line, *moved))
  return out


def collectives(text: str) -> dict[str, list[float]]:
  """{kind: [count, bytes]} over the collectives of an HLO module's text (each once, `_written`)."""
  found = {k: [0.0, 0.0] for k in KINDS}
  for _, kind, size in _written(text):
    found[kind][0] += 1
    found[kind][1] += size
  return found


_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((?:\[([\d,]+)\](?:T\(([\d,]+)\))?|"
                          r"([\d,\s]+))\))?\s*\{([^}]*)\}")
_GROUPS = re.compile(r"(?:replica_groups|source_target_pairs)=(\{[\d,{}\s]*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)")
_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def _iota(dims: list[int], perm: list[int] | None) -> np.ndarray:
  ids = np.arange(math.prod(dims)).reshape(dims)
  return ids.transpose(perm) if perm else ids


def _ints(text: str | None) -> list[int]:
  return [int(x) for x in (text or "").split(",") if x.strip()]


def _mesh_groups(m: re.Match) -> list[list[int]]:
  """The groups of `replica_groups=mesh[...] device_ids=(...) {axes}` (see the module docstring)."""
  axes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
  sizes = [size for _, size in axes]
  if m.group(2):
    ids = _iota(_ints(m.group(2)), _ints(m.group(3)) or None).reshape(sizes)
  elif m.group(4):
    ids = np.asarray(_ints(m.group(4))).reshape(sizes)
  else:
    ids = np.arange(math.prod(sizes)).reshape(sizes)
  shape, over = [], []  # each axis split into its parts, and which parts the collective runs over
  for name, size in axes:
    part = re.search(rf"'{re.escape(name)}'(?::\((\d+)\)(\d+))?", m.group(5))
    if part is None:
      shape.append(size)
    elif part.group(1) is None:
      over.append(len(shape))
      shape.append(size)
    else:
      before, middle = int(part.group(1)), int(part.group(2))
      over.append(len(shape) + 1)
      shape += [before, middle, size // (before * middle)]
  ids = ids.reshape(shape)
  rest = [i for i in range(len(shape)) if i not in over]
  return ids.transpose(rest + over).reshape(-1, math.prod(shape[i] for i in over)).tolist()


def groups(line: str) -> list[list[int]] | None:
  """The device groups of a collective's line: its replica groups (or a permute's source-target pairs); [] for
  `replica_groups={}` (every device, one group); None when the line names none."""
  m = _MESH_GROUPS.search(line)
  if m is not None:
    return _mesh_groups(m)
  m = _GROUPS.search(line)
  if m is None:
    return None
  text = m.group(1)
  iota = _IOTA.fullmatch(text)
  if iota is None:
    return [[int(i) for i in g.split(",") if i.strip()] for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
  return _iota(_ints(iota.group(2)), _ints(iota.group(3)) or None).reshape(_ints(iota.group(1))).tolist()


def across_hosts(text: str, per_host: int, devices: int) -> float:
  """Bytes of the collectives (counted as `collectives` counts them) whose groups span more than one host of
  `per_host` devices, in a program over `devices` devices."""
  total = 0.0
  for line, _, size in _written(text):
    found = groups(line)
    spans = [list(range(devices))] if not found else found  # no groups, or {}: every device together
    if any(len({i // per_host for i in g}) > 1 for g in spans):
      total += size
  return total


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
