"""Symbolic comparison: math-verify in worker processes, with a wall-clock limit and blame for overruns.

math-verify can hang, and its own timeout is signal-based, so it is switched off and the worker is killed
after `timeout_s` of wall-clock time. The worker's CPU time (/proc/<pid>/stat) says who caused an overrun:
if it ran for at least `cpu_share` of the limit, the answer was too costly to check, the completion's
doing: status "timeout", score 0, valid. If it mostly waited (an overloaded host, a stopped worker,
unreadable /proc), status "overloaded", masked (valid=False). A worker that crashes or does not start:
status "error", masked.
"""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_WORKER_MEMORY_BYTES = 4 << 30


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


def cpu_seconds(pid: int) -> float | None:
  """User + system CPU time of a process so far (/proc/<pid>/stat), or None where it can't be read."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return None


def _runqueue_seconds(pid: int) -> float | None:
  """Time the process spent runnable but waiting for a CPU (/proc/<pid>/schedstat), or None."""
  try:
    with open(f"/proc/{pid}/schedstat") as f:
      return int(f.read().split()[1]) / 1e9
  except (OSError, ValueError, IndexError):
    return None


def overrun_status(cpu_s: float | None, timeout_s: float, cpu_share: float) -> str:
  """Who caused a symbolic overrun: "timeout" (the worker computed for `cpu_share` of the limit: the answer's
  fault, a valid 0) or "overloaded" (it mostly waited, or its CPU time is unknown: the host's fault, masked)."""
  return "timeout" if cpu_s is not None and cpu_s >= cpu_share * timeout_s else "overloaded"


class _Worker:
  def __init__(self, startup_timeout_s: float) -> None:
    root = str(Path(__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(0, {root!r}); from rl_lm.rewards.symbolic import serve; serve()"
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

  An overrun is "timeout" (the worker was on a CPU for `cpu_share` of the limit: the answer is too costly, a
  valid 0) or "overloaded" (it mostly waited: a host fault, masked); see `overrun_status`. A worker that dies
  (killed by a signal, the OOM killer, a crash in math-verify) is replaced by a fresh one at the next
  comparison. If it dies during a comparison, that comparison is a verifier fault: status "error", detail
  "math-verify worker died" (masked, not scored 0). A worker found dead while idle costs nothing: the
  comparison runs on its replacement. `restarts` counts the workers replaced after dying or overrunning.
  """

  def __init__(
    self, workers: int = 1, timeout_s: float = 5.0, startup_timeout_s: float = 60.0, cpu_share: float = 0.5
  ) -> None:
    self.timeout_s, self.startup_timeout_s, self.cpu_share = timeout_s, startup_timeout_s, cpu_share
    self.restarts = 0
    self._idle: queue.Queue[_Worker | None] = queue.Queue()
    for _ in range(max(1, workers)):
      self._idle.put(None)  # started lazily

  def compare(self, gold: str, pred: str) -> tuple[bool | None, str, str]:
    """(match, status, detail): status "ok", or "timeout" / "overloaded" / "error" with match None."""
    worker = self._idle.get()
    try:
      if worker is not None and worker.proc.poll() is not None:  # died while idle: replace it, nothing is lost
        worker.kill()
        worker = None
        self.restarts += 1
      if worker is None:
        worker = _Worker(self.startup_timeout_s)
      pid = worker.proc.pid
      cpu0, wait0 = cpu_seconds(pid), _runqueue_seconds(pid)
      try:
        worker.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
        worker.proc.stdin.flush()
      except BrokenPipeError:  # died just now
        line, worker.eof = None, True
      else:
        line = worker.readline(time.monotonic() + self.timeout_s)
      if line is None:
        died = worker.eof or worker.proc.poll() is not None
        cpu1, wait1 = cpu_seconds(pid), _runqueue_seconds(pid)
        worker.kill()
        worker = None
        self.restarts += 1
        if died:
          return None, "error", "math-verify worker died"
        cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        waited = None if wait0 is None or wait1 is None else wait1 - wait0
        status = overrun_status(cpu, self.timeout_s, self.cpu_share)
        on_cpu = "unknown" if cpu is None else f"{cpu:.2f}s"
        queued = "" if waited is None else f", {waited:.2f}s waiting for a CPU"
        return None, status, f"math-verify overran {self.timeout_s:g}s ({on_cpu} on a CPU{queued})"
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


_SHARED_POOLS: dict[tuple[int, float, float], SymbolicPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(workers: int, timeout_s: float, cpu_share: float = 0.5) -> SymbolicPool:
  """One pool per (workers, timeout, cpu share) per process, so rewards built many times share their workers."""
  with _POOLS_LOCK:
    key = (workers, timeout_s, cpu_share)
    if key not in _SHARED_POOLS:
      _SHARED_POOLS[key] = SymbolicPool(workers, timeout_s, cpu_share=cpu_share)
    return _SHARED_POOLS[key]
