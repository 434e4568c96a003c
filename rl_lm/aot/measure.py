"""Compiling the programs of rl_lm/aot/programs.py for a TPU slice or GPUs, and what XLA says about each.

Memory: each program as the run calls it is compiled once; `memory_analysis()` gives its per-chip arguments,
outputs, temporaries, aliased (donated) bytes and code. A program too large for the chip fails to compile with
RESOURCE_EXHAUSTED; the message ("... HLO temporaries (35.11G) exceeds available HBM (15.75G)") is parsed into
the same figures.

Cost: XLA's `cost_analysis()` (FLOPs, bytes accessed, `optimal_seconds`) counts the body of a loop once, not
times its trip count, so a 2-layer and an 8-layer model report the same. Each cost piece (`programs.Term`) is
therefore compiled twice, with 1 and with 2 layers, with every loop of at most `UNROLL_LIMIT` iterations unrolled
while it is traced (the layer scan, logit chunks, the top-k bisection); cost(L) = c1 + (L - 1) (c2 - c1), exact
for a model whose layers are identical and whose layers XLA treats alike. XLA:TPU's counts of a memory-bound
decode step do not grow evenly with its depth (Llama-3.1-8B on v5p-64, 1 to 8 layers: +37, +131, +39, +117, +74
us a layer; 1.56 ms extrapolated from 1 and 2 layers, 3.13 ms compiled with all 32), so a decode step's pieces
are compiled once with every layer unrolled (`Term.whole`; 20-100 s each), not extrapolated. An update's
micro-batch grows evenly (+14.0, +14.1, +14.2 ms a layer, same model). Collective matmuls (windowed einsums,
XLA:TPU's loops that overlap an all-gather with the matmul it feeds) are switched off for these pieces: a loop
again, and the same FLOPs without it. The collectives counted are the pieces' too. A loop longer than the limit
(PPO's GAE over the sequence) stays a loop and is counted once; `Cost.loops` says how many remained. XLA:TPU
gives some programs a negative `optimal_seconds` (-1 per op its model does not cover; seen on v5e and v6e
programs): such a piece's time is unknown (NaN), and so is every sum it enters, which the report flags.

XLA:GPU has no cost analysis of a compiled executable (it returns None) and no time estimate at all. Its FLOPs
and bytes are XLA's HloCostAnalysis run over the optimised, partitioned module of one GPU (through the CPU
client, which has the pass), and its time is the report's roofline. Matmuls XLA hands to cuBLAS as custom calls
would not be counted there; without a GPU to autotune on, XLA:GPU emits its matmuls as Triton fusions, which are,
and the analytic check catches the day that changes. XLA:GPU has no windowed einsums unless asked
(`xla_gpu_threshold_for_windowed_einsum_mib`), so its cost pieces need no options of their own.

Compiles run in a pool of threads (XLA releases the GIL while it compiles); tracing stays in the caller's thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import jax

from rl_lm.aot import hlo
from rl_lm.aot.chips import Topology, compile_options
from rl_lm.aot.programs import Call, Program, Stage, Term
from rl_lm.models.presets import ModelConfig

UNROLL_LIMIT = 64
WHOLE = "all"  # the layer count of a piece compiled with all its layers (`Term.whole`), in its key
# The cost pieces' compiler options, by platform: no collective matmul loops (their bodies would be counted once).
COST_OPTIONS = {"tpu": {"xla_tpu_enable_windowed_einsum_for_all_gather": False,
                        "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False},
                "cuda": {}}


@dataclasses.dataclass
class Cost:
  """XLA's estimate for one chip: FLOPs, bytes accessed, optimal seconds, collectives {kind: [count, bytes]}, and
  the bytes of those collectives that cross hosts (GPUs of more than one host; 0 for TPU slices)."""

  flops: float = 0.0
  bytes: float = 0.0
  seconds: float = 0.0
  collectives: dict[str, list[float]] = dataclasses.field(default_factory=lambda: {k: [0.0, 0.0] for k in hlo.KINDS})
  loops: int = 0
  across_hosts: float = 0.0

  def combine(self, other: Cost, a: float = 1.0, b: float = 1.0) -> Cost:
    """a * self + b * other."""
    return Cost(a * self.flops + b * other.flops, a * self.bytes + b * other.bytes,
                a * self.seconds + b * other.seconds,
                {k: [a * self.collectives[k][i] + b * other.collectives[k][i] for i in range(2)] for k in hlo.KINDS},
                max(self.loops, other.loops), a * self.across_hosts + b * other.across_hosts)


@dataclasses.dataclass
class Memory:
  """memory_analysis() of one compiled program, bytes per chip."""

  argument: float
  output: float
  alias: float
  temp: float
  code: float

  @property
  def total(self) -> float:
    """What the program holds at its peak: arguments and outputs (donated ones once), temporaries, code."""
    return self.argument + self.output - self.alias + self.temp + self.code


@dataclasses.dataclass
class Compiled:
  """One compile: its memory, cost and collectives, or the error (one line) and, for RESOURCE_EXHAUSTED, the
  temporaries it asked for and the HBM XLA had."""

  memory: Memory | None = None
  cost: Cost | None = None
  error: str = ""
  exhausted: tuple[float, float] | None = None
  seconds: float = 0.0
  text: str = ""


_SIZE = r"([\d.]+)\s*([KMGT]?)i?B?"
_EXHAUSTED = (re.compile(rf"temporaries \({_SIZE}\) exceeds available HBM \({_SIZE}\)"),
              re.compile(rf"Used {_SIZE} of {_SIZE} hbm"))


def _bytes(number: str, unit: str) -> float:
  return float(number) * 1024.0 ** "BKMGT".index(unit or "B") if unit else float(number)


def parse_exhausted(message: str) -> tuple[float, float] | None:
  """(needed, available) bytes from XLA's out-of-memory message, or None when it says neither."""
  for pattern in _EXHAUSTED:
    m = pattern.search(message)
    if m:
      return _bytes(m.group(1), m.group(2)), _bytes(m.group(3), m.group(4))
  return None


@contextlib.contextmanager
def unrolled_loops(limit: int = UNROLL_LIMIT) -> Iterator[None]:
  """While tracing: `lax.scan`, `lax.map` and `lax.fori_loop` of at most `limit` iterations unroll fully."""
  lax = jax.lax
  scan, fori_loop, lax_map = lax.scan, lax.fori_loop, lax.map

  def scan_(f: Any, init: Any, xs: Any = None, length: int | None = None, reverse: bool = False, unroll: Any = 1,
            **kw: Any) -> Any:
    leaves = jax.tree.leaves(xs)
    n = length if length is not None else (leaves[0].shape[0] if leaves else None)
    return scan(f, init, xs, length, reverse, unroll=True if n is not None and n <= limit else unroll, **kw)

  def map_(f: Any, xs: Any, **kw: Any) -> Any:
    return scan_(lambda carry, x: (carry, f(x)), None, xs)[1]

  def fori_loop_(lower: Any, upper: Any, body: Any, init: Any, **kw: Any) -> Any:
    if isinstance(lower, int) and isinstance(upper, int) and upper - lower <= limit:
      kw["unroll"] = True
    return fori_loop(lower, upper, body, init, **kw)

  lax.scan, lax.map, lax.fori_loop = scan_, map_, fori_loop_
  try:
    yield
  finally:
    lax.scan, lax.map, lax.fori_loop = scan, lax_map, fori_loop


def _cost_analysis(compiled: Any) -> dict[str, float]:
  """XLA's cost analysis of one device's program: the executable's own (TPU), or HloCostAnalysis over its optimised
  module where the executable has none (GPU)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, list | tuple):
    analysis = analysis[0] if analysis else {}
  if analysis is None:
    from jax._src.lib import _jax

    module = compiled.runtime_executable().hlo_modules()[0]
    analysis = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
  return analysis


def _analyse(lowered: Any, options: dict[str, Any] | None, want_text: bool, hosts: tuple[int, int] | None = None
             ) -> Compiled:
  """Compiles `lowered`; `hosts` = (devices per host, devices) when collectives across hosts are to be told apart."""
  start = time.perf_counter()
  try:
    compiled = lowered.compile(options) if options else lowered.compile()
  except Exception as e:  # noqa: BLE001 -- XlaRuntimeError and friends: reported, one line
    message = str(e).strip()
    return Compiled(error=message.splitlines()[0][:400] if message else type(e).__name__,
                    exhausted=parse_exhausted(message), seconds=time.perf_counter() - start)
  seconds = time.perf_counter() - start
  m = compiled.memory_analysis()
  memory = Memory(float(m.argument_size_in_bytes), float(m.output_size_in_bytes), float(m.alias_size_in_bytes),
                  float(m.temp_size_in_bytes), float(m.generated_code_size_in_bytes))
  analysis = _cost_analysis(compiled)
  text = compiled.as_text()
  estimate = float(analysis.get("optimal_seconds", math.nan))
  # XLA:TPU's time estimate is negative (-1 per op it cannot model) for some programs: unknown, not a time.
  cost = Cost(float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0)),
              estimate if estimate > 0 else math.nan, hlo.collectives(text), hlo.loops(text),
              hlo.across_hosts(text, *hosts) if hosts else 0.0)
  return Compiled(memory, cost, seconds=seconds, text=text if want_text else "")


class Compiler:
  """Lowers in this thread, compiles in a pool; results by key, each piece compiled once."""

  def __init__(self, workers: int = 2, topology: Topology | None = None):
    self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers))
    self.futures: dict[Any, concurrent.futures.Future[Compiled]] = {}
    self.options = compile_options(topology) if topology is not None else {}  # every compile's
    self.cost_options = {**self.options, **COST_OPTIONS[topology.chip.platform if topology is not None else "tpu"]}
    self.hosts = None  # GPUs on several hosts: NVLink within one, the network between them
    if topology is not None and topology.gpu and topology.hosts > 1:
      self.hosts = (topology.chip.per_host, topology.chips)

  def submit(self, key: Any, call: Call, cost_piece: bool = False, want_text: bool = False,
             unroll: int = UNROLL_LIMIT) -> concurrent.futures.Future[Compiled]:
    if key not in self.futures:
      with unrolled_loops(unroll) if cost_piece else contextlib.nullcontext():
        try:
          lowered = call.fn.lower(*call.args)
        except Exception as e:  # noqa: BLE001 -- a program that does not even trace: reported like a failed compile
          future: concurrent.futures.Future[Compiled] = concurrent.futures.Future()
          future.set_result(Compiled(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
          self.futures[key] = future
          return future
      options = self.cost_options if cost_piece else self.options
      self.futures[key] = self.pool.submit(_analyse, lowered, options or None, want_text, self.hosts)
    return self.futures[key]

  def close(self) -> None:
    self.pool.shutdown(wait=True, cancel_futures=True)


class Coster:
  """The loop-accounted cost of `Term`s for one model: pieces compiled at 1 and 2 layers, extrapolated."""

  def __init__(self, compiler: Compiler, model: ModelConfig):
    self.compiler, self.model = compiler, model

  def _layers(self, n: int, term: Term | None = None) -> ModelConfig:
    return self._model(term).replace(n_layers=n)

  def _model(self, term: Term | None) -> ModelConfig:
    return term.model if term is not None and term.model is not None else self.model

  def _piece(self, term: Term, layers: int | None) -> Compiled:
    return self.compiler.futures[(term.key, layers)].result()

  def submit(self, term: Term) -> None:
    if term.between is not None:
      self.submit(term.between[0])
      self.submit(term.between[1])
    elif term.per_parameter:
      self.compiler.submit((term.key, 1), term.build(self._layers(1, term)), cost_piece=True)
    elif term.whole:  # every layer, unrolled however many there are
      model = self._model(term)
      self.compiler.submit((term.key, WHOLE), term.build(model), cost_piece=True,
                           unroll=max(UNROLL_LIMIT, model.n_layers))
    elif term.layers:
      for n in (1, 2):
        self.compiler.submit((term.key, n), term.build(self._layers(n, term)), cost_piece=True)
    else:
      self.compiler.submit((term.key, None), term.build(self._model(term)), cost_piece=True)

  def cost(self, term: Term) -> tuple[Cost | None, str]:
    """(count x the piece's cost, "") or (None, why not)."""
    if term.between is not None:  # cost linear in a size between two built ends (a decode step's window)
      near, far, w = term.between
      (a, why_a), (b, why_b) = self.cost(near), self.cost(far)
      if a is None or b is None:
        return None, why_a or why_b
      return a.combine(b, term.count * (1 - w), term.count * w), ""  # the ends are one run each
    if term.per_parameter:
      done = self._piece(term, 1)
      if done.cost is None:
        return None, f"{term.key}: {done.error}"
      scale = self._model(term).num_params() / self._layers(1, term).num_params()
      return Cost().combine(done.cost, 0.0, term.count * scale), ""
    if term.whole or not term.layers:
      done = self._piece(term, WHOLE if term.whole else None)
      if done.cost is None:
        return None, f"{term.key}: {done.error}"
      return Cost().combine(done.cost, 0.0, term.count), ""
    one, two = (self._piece(term, n) for n in (1, 2))
    if one.cost is None or two.cost is None:
      return None, f"{term.key}: {one.error or two.error}"
    L = self._model(term).n_layers
    per_layer = two.cost.combine(one.cost, 1.0, -1.0)  # c2 - c1
    # XLA may merge or split a piece's collectives differently at 2 layers than at 1 (seen on a chunked prepare:
    # fewer all-gather bytes at 2 layers): a layer adds no negative traffic, so such a difference counts as 0.
    per_layer.collectives = {k: [max(0.0, v) for v in c] for k, c in per_layer.collectives.items()}
    per_layer.across_hosts = max(0.0, per_layer.across_hosts)
    return one.cost.combine(per_layer, term.count, term.count * (L - 1)), ""


@dataclasses.dataclass
class Result:
  """Everything measured about one program."""

  program: Program
  compiled: Compiled | None  # the program as the run calls it (None: a piece of another)
  resident: float  # bytes per chip of the stage's buffers that are not its arguments
  cost: Cost | None
  cost_error: str = ""

  @property
  def needed(self) -> float | None:
    """Per-chip bytes the program needs while the run holds the rest of its stage; None when unknown."""
    c = self.compiled
    if c is None:
      return None
    if c.memory is not None:
      return c.memory.total + self.resident
    if c.exhausted is not None:  # arguments are not in the message: counted from the abstract ones
      return c.exhausted[0] + self.arguments + self.resident
    return None

  @property
  def arguments(self) -> float:
    from rl_lm.aot.programs import per_chip_bytes

    return per_chip_bytes([x for x in jax.tree.leaves(self.program.memory.args) if hasattr(x, "sharding")])


@dataclasses.dataclass
class Measured:
  results: list[Result]
  memory_s: float  # compile seconds of the programs as the run calls them
  pieces_s: float  # of the cost pieces
  wall_s: float
  pieces: dict[str, float]  # compile seconds of each cost piece ("<key> L=<layers>")


def measure(stages: list[Stage], model: ModelConfig, workers: int = 2, log: Any = print,
            topology: Topology | None = None) -> Measured:
  """Compiles every program (and its cost pieces) of `stages` for `topology` (None: a TPU slice); the results in
  order."""
  wall = time.perf_counter()
  compiler = Compiler(workers, topology)
  coster = Coster(compiler, model)
  try:
    for stage in stages:  # everything is traced and queued first; the pool compiles while this thread traces
      for p in stage.programs:
        if p.memory is not None:
          compiler.submit(("memory", p.label), p.memory)
        for term in p.cost:
          coster.submit(term)
    results = []
    for stage in stages:
      for p in stage.programs:
        start = time.perf_counter()
        compiled = compiler.futures[("memory", p.label)].result() if p.memory is not None else None
        resident = sum(v for k, v in stage.resident.items() if k not in p.uses)
        total, why = Cost(), ""
        for term in p.cost:
          c, why = coster.cost(term)
          if c is None:
            total = None
            break
          total = total.combine(c)
        results.append(Result(p, compiled, resident, total if p.cost else None, why))
        if compiled is not None:
          log(f"rl_lm.aot: compiled {p.label} in {compiled.seconds:.0f}s (waited {time.perf_counter() - start:.0f}s)")
    seconds = {k: f.result().seconds for k, f in compiler.futures.items()}
    pieces = {f"{k[0]} L={k[1] or model.n_layers}": v for k, v in seconds.items() if k[0] != "memory"}
    return Measured(results, sum(v for k, v in seconds.items() if k[0] == "memory"), sum(pieces.values()),
                    time.perf_counter() - wall, pieces)
  finally:
    compiler.close()
