"""Where a compiled JAX call spends its time, by source line: the JAX profiler's per-op events, attributed
through the compiled HLO's stack frames to the lines of rl_lm that emitted each op.

  from experiments.benchmarks import xla_trace
  rows = xla_trace.profile(jitted, *args)      # [Row(function, place, ms per call, executions per call)]

On XLA:CPU the profiler records one event per executed thunk (a fusion, a matmul, a copy), named as the HLO
instruction. The compiled module's text carries, for most instructions, the stack of Python frames that emitted
it; the innermost frame inside `rl_lm/` names the place ('transformer.py:297  scores = jnp.einsum(...)') and its
function. Small wrappers (`_dense`, `_project`) are skipped for the line that called them where the stack has it;
where it does not, and for ops with no rl_lm frame, the place is the op and its output shape. Control flow
(`while`, `call`) is left out: its time is the time of the ops inside it, which are counted themselves.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import linecache
import os
import re
import tempfile
from typing import Any, NamedTuple

import jax

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+\[[\d,]*\])?\S* ([\w\-]+)\(")
_METADATA = re.compile(r"metadata=\{op_name=\"([^\"]*)\"(?: stack_frame_id=(\d+))?")
_TABLE_ROW = re.compile(r"^(\d+) (.*)$")
_CONTROL = ("while", "call", "conditional", "tuple", "get-tuple-element", "parameter", "constant", "bitcast")
_HELPERS = ("_dense", "_project")  # small wrappers: the op is named after the line that called them


class Row(NamedTuple):
  function: str  # the rl_lm function that emitted the ops ('' when none did)
  place: str  # 'module.py:line  source', or 'op: <name> -> <shape>'
  ms: float  # per call
  executions: float  # per call


def _places(hlo: str) -> dict[str, tuple[str, str]]:
  """Compiled HLO text -> {instruction name: (function, place)}."""
  section, files, functions, locations, frames = None, {}, {}, {}, {}
  ops = {}  # name -> (opcode or op name, shape, frame id)
  for line in hlo.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = line
      continue
    row = _TABLE_ROW.match(line) if section else None
    if row:
      key, rest = int(row.group(1)), row.group(2)
      fields = dict(re.findall(r"(\w+)=(\d+)", rest))
      if section == "FileNames":
        files[key] = rest.strip('"')
      elif section == "FunctionNames":
        functions[key] = rest.strip('"')
      elif section == "FileLocations":
        locations[key] = (int(fields["file_name_id"]), int(fields["function_name_id"]), int(fields["line"]))
      else:
        frames[key] = (int(fields["file_location_id"]), int(fields["parent_frame_id"]))
      continue
    section = None
    m = _INSTRUCTION.match(line)
    if m:
      meta = _METADATA.search(line)
      op = meta.group(1).rsplit("/", 1)[-1] if meta else m.group(3)
      ops[m.group(1)] = (op, m.group(2) or "", int(meta.group(2)) if meta and meta.group(2) else -1)

  def place(frame_id: int) -> tuple[str, str]:
    """The innermost rl_lm frame of a stack (helpers skipped where a caller is recorded) as (function, place)."""
    seen, helper = set(), ("", "")
    while frame_id in frames and frame_id not in seen:
      seen.add(frame_id)
      loc, parent = frames[frame_id]
      file_id, fn_id, line = locations[loc]
      path, function = files.get(file_id, ""), functions.get(fn_id, "?")
      if f"{os.sep}rl_lm{os.sep}" in path:
        if function not in _HELPERS:
          return function, f"{os.path.basename(path)}:{line}  {linecache.getline(path, line).strip()[:70]}"
        if not helper[0]:
          helper = (function, f"{os.path.basename(path)}:{function}")
      frame_id = parent if parent != frame_id else -1
    return helper

  where = {}
  for name, (op, shape, frame_id) in ops.items():
    function, p = place(frame_id)
    if not p or function in _HELPERS:  # name the product by its shape
      p = f"{p or 'op: ' + op} -> {shape}"
    where[name] = (function, p)
  return where


def profile(jitted: Any, *args: Any, calls: int = 1) -> list[Row]:
  """Runs `jitted(*args)` `calls` times under the profiler (after one warm-up call) and returns one Row per
  place, most costly first, with milliseconds and executions per call."""
  places = _places(jitted.lower(*args).compile().as_text())
  jax.block_until_ready(jitted(*args))
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(calls):
        jax.block_until_ready(jitted(*args))
    with gzip.open(glob.glob(os.path.join(tmp, "**", "*.trace.json.gz"), recursive=True)[0]) as f:
      events = json.load(f)["traceEvents"]
  total, count = collections.Counter(), collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") != "X" or name not in places or name.split(".")[0] in _CONTROL:
      continue
    total[places[name]] += e["dur"] / 1e3 / calls
    count[places[name]] += 1 / calls
  return [Row(function, p, ms, count[function, p]) for (function, p), ms in total.most_common()]


def table(rows: list[Row], per: float = 1.0, top: int = 25) -> str:
  """Markdown rows 'place | ms | share | executions', times and counts divided by `per` (e.g. decode steps)."""
  whole = sum(r.ms for r in rows)
  lines = ["place (innermost rl_lm line) | ms | share | executions", "--- | --- | --- | ---"]
  for r in rows[:top]:
    lines.append(f"{r.place} | {r.ms / per:.3f} | {r.ms / whole:.1%} | {r.executions / per:.2f}")
  rest = sum(r.ms for r in rows[top:])
  if rest:
    lines.append(f"everything else ({len(rows) - top} places) | {rest / per:.3f} | {rest / whole:.1%} |")
  lines.append(f"all ops | {whole / per:.3f} | 100% |")
  return "\n".join(lines)
