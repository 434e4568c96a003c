"""Maths verifier: extract the final answer, normalise it, compare it with the gold answer.

Extraction looks for explicit answer markers in priority order (configurable): "#### x" (GSM8K),
"\\boxed{x}", "The (final) answer is x", a line "A: x" / "Answer: x"; the last number of the text is
an opt-in fallback. The first marker kind present decides; within it, every occurrence must agree.

Strictness (what the policy could otherwise exploit):
* the answer text must hold exactly one number: "#### 17 or 18", "#### 16-3-4", "\\boxed{17, 18}" and
  "The answer is 18, or maybe 20." score 0 (reason "ambiguous"), even when one of them is right;
* several answers of the same marker kind that disagree score 0 ("#### 17 ... #### 18");
* an empty marker is ignored, never matched; a number elsewhere in the text never counts unless
  the last-number fallback is switched on.

Normalisation: thousands separators ("1,000"), currency signs and unit words ("$18", "18 dollars"),
trailing zeros ("18.00"), fractions ("3/4", "\\frac{3}{4}"), percentages ("25%" equals gold 25 and
gold 0.25), LaTeX wrappers ($...$, \\text{...}, \\left/\\right). Plain numbers are compared exactly as
fractions, in process. Anything symbolic (LaTeX expressions, roots, powers, variables) goes to the
`math-verify` library in worker processes with a wall-clock timeout (`SymbolicPool`); math-verify
can hang on adversarial input, and its own timeout is signal-based, so it is switched off and the
worker is killed instead. A symbolic timeout or crash is reported as status "timeout" / "error"
(valid=False), never as a silent 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

from rl_lm.rewards.registry import RewardResult, register
from rl_lm.tasks import arithmetic
from rl_lm.tasks.base import Problem

MARKERS = ("hashes", "boxed", "answer_is", "answer_colon")
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER_RE = re.compile(rf"(?<![\w.])-?(?:{_NUM})(?:\s*/\s*(?:{_NUM}))?(?![\w])|(?<![\w.])-?(?:{_NUM})")
_SYMBOLIC_RE = re.compile(r"\\|\^|sqrt|\bpi\b|π|√|(?<![a-zA-Z])[a-zA-Z](?![a-zA-Z])")
_MARKER_RES = {
  "hashes": re.compile(r"####[ \t]*([^\n]*)"),
  "answer_is": re.compile(r"(?i)\b(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*([^\n]*)"),
  "answer_colon": re.compile(r"(?im)^[ \t>*]*(?:A|Answer|Final answer)[ \t*]*:[ \t]*(.*)$"),
}
_SENTENCE_END_RE = re.compile(r"(?<!\d)\.(?!\d)|\.(?=\s|$)")
_WORKER_MEMORY_BYTES = 4 << 30
_UNICODE = {"\u2212": "-", "\u2013": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u00d7": "*"}


@dataclasses.dataclass(frozen=True)
class MathsConfig:
  """How answers are extracted and compared.

  Attributes:
    markers: answer markers to look for, in priority order (subset of MARKERS).
    last_number_fallback: with no marker, take the last number of the text (lenient; off by default).
    symbolic: send non-numeric answers (LaTeX, expressions) to math-verify; otherwise they score 0.
    timeout_s: wall-clock limit of one symbolic comparison.
    workers: symbolic worker processes (and threads for batches).
  """

  markers: tuple[str, ...] = MARKERS
  last_number_fallback: bool = False
  symbolic: bool = True
  timeout_s: float = 5.0
  workers: int = 1


@dataclasses.dataclass(frozen=True)
class Extraction:
  """The answer text found in a completion, the marker that found it, or why there is none."""

  text: str | None
  method: str
  reason: str = ""


@dataclasses.dataclass(frozen=True)
class Answer:
  """An interpreted answer: kind "number" (exact `value`, `percent` flag), "symbolic" (text), or invalid."""

  kind: str
  value: Fraction | None = None
  percent: bool = False
  text: str = ""


# --- extraction ----------------------------------------------------------------------------------


def _boxed_contents(text: str) -> list[str]:
  out = []
  for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
    depth, i = 1, m.end()
    while i < len(text) and depth:
      depth += {"{": 1, "}": -1}.get(text[i], 0)
      i += 1
    if depth == 0:
      out.append(text[m.end() : i - 1])
  return out


def _captures(completion: str, marker: str) -> list[str]:
  if marker == "boxed":
    found = _boxed_contents(completion)
  elif marker in _MARKER_RES:
    found = _MARKER_RES[marker].findall(completion)
  else:
    raise ValueError(f"unknown answer marker {marker!r}; known: {MARKERS}")
  if marker == "answer_is":  # the answer runs to the end of its sentence
    found = [_SENTENCE_END_RE.split(f, maxsplit=1)[0] for f in found]
  return [f.strip() for f in found if f.strip()]


def extract_answer(completion: str, config: MathsConfig = MathsConfig()) -> Extraction:
  """The final-answer text of a completion (see the module docstring for the rules)."""
  for marker in config.markers:
    found = _captures(completion, marker)
    if not found:
      continue
    answers = [interpret(f) for f in found]
    if any(a.kind == "ambiguous" for a in answers):
      return Extraction(None, marker, "ambiguous")
    keys = {(a.kind, a.value, a.percent) if a.kind == "number" else (a.kind, a.text) for a in answers}
    if len(keys) > 1:
      return Extraction(None, marker, "conflicting")
    return Extraction(found[-1], marker)
  if config.last_number_fallback:
    numbers = _NUMBER_RE.findall(_clean(completion))
    if numbers:
      return Extraction(numbers[-1], "last_number")
  return Extraction(None, "none", "no_answer")


# --- normalisation -------------------------------------------------------------------------------


def _clean(text: str) -> str:
  for k, v in _UNICODE.items():
    text = text.replace(k, v)
  return text


def _strip_wrappers(s: str) -> str:
  s = s.strip()
  while True:
    before = s
    s = s.strip().strip("*").strip()
    s = re.sub(r"^\\\[(.*)\\\]$|^\\\((.*)\\\)$", lambda m: m.group(1) or m.group(2) or "", s, flags=re.S)
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$" and s.count("$") == 2 and re.search(r"\\|[{}^]", s):
      s = s[1:-1]  # LaTeX delimiters (a currency "$" is dropped later)
    boxed = _boxed_contents(s)
    if len(boxed) == 1 and re.fullmatch(r"\\(?:boxed|fbox)\s*\{.*\}", s, re.S):
      s = boxed[0]
    s = s.rstrip(".").strip()
    if s == before:
      return s


def _delatex(s: str) -> str:
  s = re.sub(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{([^{}]*)\}", r" \1 ", s)
  s = re.sub(r"\\[dt]frac", r"\\frac", s)
  s = s.replace("\\$", " ").replace("\\%", "%").replace("{,}", ",").replace("\\left", "").replace("\\right", "")
  s = re.sub(r"\\[,!;: ]|~", "", s)
  s = re.sub(r"\^\s*\{?\\circ\}?|\\circ|\\degree", "", s)
  s = re.sub(r"\\frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}", r"\1/\2", s)
  return s


def _to_fraction(token: str) -> Fraction | None:
  token = re.sub(r"\s+", "", token).replace(",", "")
  try:
    if "/" in token:
      num, den = token.split("/")
      return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
    return Fraction(token)
  except (ValueError, ZeroDivisionError):
    return None


def interpret(text: str) -> Answer:
  """Interprets an answer text: one number, a symbolic expression, empty, or ambiguous (a list)."""
  s = _strip_wrappers(_clean(text))
  if "\\" in s:
    s = _strip_wrappers(_delatex(s))
  if not s:
    return Answer("empty")
  numbers = list(_NUMBER_RE.finditer(s))
  rest = _NUMBER_RE.sub(" ", s)
  if len(numbers) == 1 and not re.search(r"[=+*^\\/<>]|\d|sqrt|\bpi\b|π|√|[(){}\[\]]", rest):
    value = _to_fraction(numbers[0].group())
    if value is not None:
      percent = bool(re.match(r"\s*(?:%|percent\b)", s[numbers[0].end() :]))
      return Answer("number", value, percent, s)
  if re.search(r"(?i)\bor\b|\band\b|;", rest) or (len(numbers) > 1 and not _SYMBOLIC_RE.search(rest)):
    return Answer("ambiguous", text=s)
  if "," in rest and not re.search(r"\\?\{.*,.*\\?\}|\(.*,.*\)|\[.*,.*\]", s):
    return Answer("ambiguous", text=s)
  if numbers or _SYMBOLIC_RE.search(s):
    return Answer("symbolic", text=s)
  return Answer("empty", text=s)


def numbers_match(gold: Answer, pred: Answer) -> bool:
  """Exact comparison of two numeric answers; a percentage also matches its value over 100."""
  if pred.value == gold.value:
    return True
  return pred.percent and pred.value / 100 == gold.value


# --- symbolic comparison in worker processes -----------------------------------------------------


def serve() -> None:
  """Worker loop: one JSON request {"gold", "pred"} per line in, {"match"} or {"error"} per line out."""
  import logging
  import resource

  resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))  # 9^9^9^9 must not eat the host
  logging.disable(logging.CRITICAL)
  from math_verify import parse, verify

  out = sys.stdout
  out.write('{"ready": true}\n')
  out.flush()
  for line in sys.stdin:
    try:
      req = json.loads(line)
      gold = parse(f"${req['gold']}$", parsing_timeout=None)
      pred = parse(f"${req['pred']}$", parsing_timeout=None)
      reply = {"match": bool(gold and pred and verify(gold, pred, timeout_seconds=None))}
    except Exception as e:  # noqa: BLE001 - reported to the parent as a verifier error
      reply = {"error": f"{type(e).__name__}: {e}"[:500]}
    out.write(json.dumps(reply) + "\n")
    out.flush()


class _Worker:
  def __init__(self, startup_timeout_s: float) -> None:
    root = str(Path(__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(0, {root!r}); from rl_lm.rewards.maths import serve; serve()"
    self.proc = subprocess.Popen(
      [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      start_new_session=True,
    )
    self._buf = b""
    self.eof = False  # the worker closed its stdout: it died
    if self.readline(time.monotonic() + startup_timeout_s) is None:
      self.kill()
      raise RuntimeError("math-verify worker did not start")

  def readline(self, deadline: float) -> bytes | None:
    fd = self.proc.stdout.fileno()
    while b"\n" not in self._buf:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        return None
      chunk = os.read(fd, 65536)
      if not chunk:
        self.eof = True
        return None
      self._buf += chunk
    line, self._buf = self._buf.split(b"\n", 1)
    return line

  def kill(self) -> None:
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    self.proc.wait()
    for stream in (self.proc.stdin, self.proc.stdout):
      try:
        stream.close()
      except OSError:  # a request still buffered for the dead worker
        pass


class SymbolicPool:
  """A few math-verify worker processes; a comparison that overruns `timeout_s` kills its worker.

  A worker that dies (killed by a signal, the OOM killer, a crash in math-verify) is replaced by a
  fresh one at the next comparison. If it dies during a comparison, that comparison is a verifier
  fault: status "error", detail "math-verify worker died" (the episode is masked, not scored 0).
  A worker found dead while idle costs nothing: the comparison runs on its replacement.
  `restarts` counts the workers replaced after dying or overrunning.
  """

  def __init__(self, workers: int = 1, timeout_s: float = 5.0, startup_timeout_s: float = 60.0) -> None:
    self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
    self.restarts = 0
    self._idle: queue.Queue[_Worker | None] = queue.Queue()
    for _ in range(max(1, workers)):
      self._idle.put(None)  # started lazily

  def compare(self, gold: str, pred: str) -> tuple[bool | None, str, str]:
    """(match, status, detail): status "ok", or "timeout" / "error" with match None."""
    worker = self._idle.get()
    try:
      if worker is not None and worker.proc.poll() is not None:  # died while idle: replace it, nothing is lost
        worker.kill()
        worker = None
        self.restarts += 1
      if worker is None:
        worker = _Worker(self.startup_timeout_s)
      try:
        worker.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
        worker.proc.stdin.flush()
      except BrokenPipeError:  # died just now
        line, worker.eof = None, True
      else:
        line = worker.readline(time.monotonic() + self.timeout_s)
      if line is None:
        died = worker.eof or worker.proc.poll() is not None
        worker.kill()
        worker = None
        self.restarts += 1
        if died:
          return None, "error", "math-verify worker died"
        return None, "timeout", f"math-verify overran {self.timeout_s:g}s"
      reply = json.loads(line)
      if "error" in reply:
        return None, "error", str(reply["error"])
      return bool(reply["match"]), "ok", ""
    except (OSError, RuntimeError, ValueError) as e:
      if worker is not None:
        worker.kill()
        worker = None
      return None, "error", f"{type(e).__name__}: {e}"
    finally:
      self._idle.put(worker)

  def pids(self) -> list[int]:
    """Process ids of the started workers that are idle now."""
    with self._idle.mutex:
      return [w.proc.pid for w in self._idle.queue if w is not None]

  def close(self) -> None:
    """Stops the workers."""
    while not self._idle.empty():
      worker = self._idle.get_nowait()
      if worker is not None:
        worker.kill()


_SHARED_POOLS: dict[tuple[int, float], SymbolicPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(workers: int, timeout_s: float) -> SymbolicPool:
  """One pool per (workers, timeout) per process, so rewards built many times share their workers."""
  with _POOLS_LOCK:
    key = (workers, timeout_s)
    if key not in _SHARED_POOLS:
      _SHARED_POOLS[key] = SymbolicPool(workers, timeout_s)
    return _SHARED_POOLS[key]


# --- the verifier --------------------------------------------------------------------------------


def verify_answer(
  gold: str, completion: str, config: MathsConfig = MathsConfig(), pool: SymbolicPool | None = None
) -> RewardResult:
  """Scores `completion` against the gold answer text: 1.0 / 0.0 with status "ok", or a verifier fault."""
  ext = extract_answer(completion, config)
  info = {"extracted": ext.text, "method": ext.method}
  if ext.text is None:
    return RewardResult(0.0, "ok", {**info, "reason": ext.reason})
  pred, want = interpret(ext.text), interpret(gold)
  if want.kind not in ("number", "symbolic"):
    return RewardResult(0.0, "error", {**info, "reason": f"gold answer {gold!r} is not a single answer"})
  if pred.kind == "number" and want.kind == "number":
    ok = numbers_match(want, pred)
    return RewardResult(float(ok), "ok", {**info, "reason": "match" if ok else "mismatch", "path": "exact"})
  if pred.kind not in ("number", "symbolic"):
    return RewardResult(0.0, "ok", {**info, "reason": pred.kind})
  if not config.symbolic:
    return RewardResult(0.0, "ok", {**info, "reason": "symbolic answers disabled"})
  pool = pool or shared_pool(config.workers, config.timeout_s)
  match, status, detail = pool.compare(want.text or gold, pred.text)
  if status != "ok":
    return RewardResult(0.0, status, {**info, "reason": detail, "path": "symbolic"})
  return RewardResult(float(match), "ok", {**info, "reason": "match" if match else "mismatch", "path": "symbolic"})


class MathsReward:
  """The maths verifier as a reward: gold is `problem.answer`."""

  name = "maths"

  def __init__(self, pool: SymbolicPool | None = None, **config: object) -> None:
    self.config = MathsConfig(**config)  # type: ignore[arg-type]
    self.pool = pool

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    try:
      return verify_answer(problem.answer, completion, self.config, self.pool)
    except Exception as e:  # a verifier bug is a verifier fault, not a 0
      return RewardResult(0.0, "error", {"error": f"{type(e).__name__}: {e}"})

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    if self.config.workers <= 1 or len(problems) <= 1:
      return [self(p, c) for p, c in zip(problems, completions, strict=True)]
    with ThreadPoolExecutor(self.config.workers) as ex:  # only the symbolic path leaves this process
      return list(ex.map(self, problems, completions))


register("maths")(MathsReward)


class ArithmeticReward:
  """Exact check of the built-in arithmetic task (`rl_lm.tasks.arithmetic.is_correct`)."""

  name = "arithmetic"

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    got = arithmetic.parse_completion(completion)
    return RewardResult(float(got == problem.answer), "ok", {"extracted": got})

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    return [self(p, c) for p, c in zip(problems, completions, strict=True)]


register("arithmetic")(ArithmeticReward)
