"""Code sandbox: runs model-written programs against tests, contained, and says what happened.

Design. Each candidate gets two fresh processes, both started with `python -I -S` (no user site, no
environment variables read, no site-packages), a scrubbed environment and their own session:

* the candidate process runs the untrusted program (`sandbox_child.py candidate`). Before any of it
  runs, the harness applies every layer the kernel allows: new network, pid and mount namespaces
  (a user namespace too when not root); a private mount tree where everything is read-only except
  the fresh temporary directory, the project and shared-data folders are hidden under empty tmpfs,
  and /proc shows only the sandbox; a random unprivileged uid (when root), which makes
  RLIMIT_NPROC bite and other users' processes unreachable; rlimits on CPU time, address space,
  file size, open files, processes and core dumps; no_new_privs; and a Python audit hook that
  refuses sockets, process creation, signals, ctypes, rlimit changes, heap introspection and file
  changes outside the directory (the second layer where the kernel layers exist, the only one where
  they do not).
* the checker process (`sandbox_child.py checker`) runs the trusted prelude and tests. The tests call
  the candidate's entry point through a proxy: arguments and return values cross a pipe as plain
  data and are rebuilt as plain built-in objects, so the program cannot reach the tests, the
  `check` function, `assert`, the test file or the marker, and cannot return an object whose
  `__eq__` always says yes.

Success needs all of: the checker's `check(...)` returned; the checker then wrote, on a pipe only it
holds, a marker carrying a random nonce it got from this process on its stdin; the checker exited 0;
the wall clock had not run out. Exiting early with status 0, `os._exit`, killing a parent, deleting
files, redefining `check` all leave the marker unwritten. On timeout, or when the verdict is in,
both process groups are killed with SIGKILL; the candidate is pid 1 of its pid namespace (with a
parent-death signal), so killing it takes every process it made with it.

Statuses: passed, failed (an assertion or other error in the tests), syntax_error, runtime_error
(the program raised, exited or died), timeout, memory_limit, sandbox_error (the sandbox itself
failed; the result is not a verdict on the program).

Threat model, honestly. The layers aim at a policy that stumbles on hacks, and at ordinary
malicious programs; the parent never trusts anything the candidate process says except to lower a
score. The checker runs the tests as the calling user (root here) without namespaces: the tests
are trusted, and only plain data reaches it, through a strict decoder. A program that escapes the
Python audit hook (e.g. through a CPython memory-corruption bug) still faces the namespaces,
read-only file system, uid and rlimits; where the kernel refuses namespaces (no root, no
unprivileged user namespaces) the audit hook and rlimits are the only walls, and a determined
attacker could then write to world-writable places like /tmp or kill processes of the same user.
Only data can be passed to and returned from the function under test: mutation of arguments is not
seen by the tests, and tests that pass functions or other objects get a sandbox_error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rl_lm.rewards.registry import RewardResult, register
from rl_lm.tasks.base import Problem, shared_data_dir

STATUSES = ("passed", "failed", "syntax_error", "runtime_error", "timeout", "memory_limit", "sandbox_error")
_CHILD = str(Path(__file__).with_name("sandbox_child.py"))
_REPO_ROOT = Path(__file__).resolve().parents[2]
_UID_BASE, _UID_SPAN = 1_000_000, 1 << 24


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Resource limits of one run.

  Attributes:
    timeout_s: wall-clock limit for the whole run (both processes, start to verdict).
    cpu_s: CPU-time limit of the candidate (SIGKILL one second later); default ceil(timeout_s) + 1.
    memory_bytes: address-space limit of the candidate (RLIMIT_AS).
    file_size_bytes: largest file the candidate may write (RLIMIT_FSIZE; stdout and stderr included).
    max_processes: processes and threads of the candidate's uid (RLIMIT_NPROC, where enforceable).
    open_files: RLIMIT_NOFILE.
    max_message_bytes: largest value that may cross the pipe between the processes.
    checker_memory_bytes: address-space limit of the checker.
  """

  timeout_s: float = 10.0
  cpu_s: int | None = None
  memory_bytes: int = 1 << 30
  file_size_bytes: int = 16 << 20
  max_processes: int = 16
  open_files: int = 64
  max_message_bytes: int = 16 << 20
  checker_memory_bytes: int = 2 << 30

  def child_limits(self, checker: bool) -> dict[str, int]:
    cpu = self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s) + 1
    return {
      "cpu_s": cpu,
      "memory_bytes": self.checker_memory_bytes if checker else self.memory_bytes,
      "file_size_bytes": self.file_size_bytes,
      "max_processes": self.max_processes,
      "open_files": max(self.open_files, 16),
      "max_message_bytes": self.max_message_bytes,
    }


@dataclasses.dataclass(frozen=True)
class SandboxPolicy:
  """Which isolation layers to use (tests switch one off to check that the others hold alone).

  Attributes:
    namespaces: network, pid and mount namespaces (user namespace when not root), if the kernel allows.
    switch_uid: when root, run the candidate as a random unprivileged uid.
    audit_hook: the in-process Python audit hook.
    hide: folders to hide from the candidate (default: the repository and ../shared).
  """

  namespaces: bool = True
  switch_uid: bool = True
  audit_hook: bool = True
  hide: tuple[str, ...] | None = None

  def hidden(self) -> list[str]:
    if self.hide is not None:
      return list(self.hide)
    return [str(_REPO_ROOT), os.path.realpath(shared_data_dir())]


@dataclasses.dataclass(frozen=True)
class CodeJob:
  """One program to test.

  Attributes:
    program: the candidate's full source (e.g. HumanEval prompt + completion).
    tests: trusted test source (HumanEval: defines `check(candidate)`).
    entry_point: the function the tests call; also bound to the name `candidate`.
    prelude: trusted source run in the checker before the tests (HumanEval: the prompt, for helpers).
    check_call: statement run after the tests are loaded; default "check(candidate)" when the tests
      define `check`, else nothing (the tests' top-level asserts are the check).
  """

  program: str
  tests: str
  entry_point: str
  prelude: str = ""
  check_call: str | None = None

  def resolved_check_call(self) -> str:
    if self.check_call is not None:
      return self.check_call
    return "check(candidate)" if re.search(r"^def check\(", self.tests, re.M) else ""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """What happened to one program."""

  status: str
  duration_s: float
  detail: str = ""
  stdout: str = ""
  stderr: str = ""
  layers: tuple[str, ...] = ()

  @property
  def passed(self) -> bool:
    return self.status == "passed"


def _tail(path: Path, n: int = 2000) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - n))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return ""


def _kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _stop_supervisor(proc: subprocess.Popen) -> None:
  """Asks the candidate's supervisor to kill its pid namespace and reap it (no zombie left behind)."""
  try:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=0.5)
  except (ProcessLookupError, subprocess.TimeoutExpired):
    pass


def _kill_uid(uid: int) -> None:
  """Kills every process of `uid` (used only when no pid namespace could hold them)."""
  code = f"import os\nos.setgid({uid})\nos.setuid({uid})\nos.kill(-1, 9)"
  subprocess.run([sys.executable, "-I", "-S", "-c", code], timeout=10, check=False, capture_output=True)


def _read_until_eof(fd: int, deadline: float, limit: int = 1 << 20) -> tuple[bytes, bool]:
  """Reads `fd` until end of file or the deadline; returns (data, reached_eof)."""
  chunks, size = [], 0
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      return b"".join(chunks), False
    ready, _, _ = select.select([fd], [], [], left)
    if not ready:
      continue
    chunk = os.read(fd, 65536)
    if not chunk:
      return b"".join(chunks), True
    size += len(chunk)
    if size <= limit:
      chunks.append(chunk)


def _parse_report(data: bytes) -> dict | None:
  if len(data) < 4:
    return None
  n = int.from_bytes(data[:4], "big")
  try:
    report = json.loads(data[4 : 4 + n])
  except ValueError:
    return None
  return report if isinstance(report, dict) else None


class Sandbox:
  """Runs `CodeJob`s, each in its own pair of processes; `run_many` keeps at most `workers` in flight."""

  def __init__(
    self, limits: SandboxLimits | None = None, policy: SandboxPolicy | None = None, workers: int = 1
  ) -> None:
    self.limits = limits or SandboxLimits()
    self.policy = policy or SandboxPolicy()
    self.workers = max(1, int(workers))
    self._root = os.geteuid() == 0

  def run_many(self, jobs: Sequence[CodeJob]) -> list[SandboxResult]:
    """Runs jobs in a bounded pool of `workers` threads (each drives two processes); keeps order."""
    if self.workers == 1 or len(jobs) <= 1:
      return [self.run(j) for j in jobs]
    with ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox") as pool:
      return list(pool.map(self.run, jobs))

  def run(self, job: CodeJob) -> SandboxResult:
    """Runs one job; never raises for anything the program does (sandbox failures -> sandbox_error)."""
    start = time.monotonic()
    try:
      return self._run(job, start)
    except Exception as e:
      return SandboxResult("sandbox_error", time.monotonic() - start, f"{type(e).__name__}: {e}")

  def _run(self, job: CodeJob, start: float) -> SandboxResult:
    deadline = start + self.limits.timeout_s
    nonce = secrets.token_hex(16)
    switch = self._root and self.policy.switch_uid
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if switch else None
    base = Path(tempfile.mkdtemp(prefix="rl_lm_sandbox_"))
    try:
      report, timed_out, rcs = self._drive(job, base, deadline, nonce, uid)
      layers = tuple(str(x) for x in (report or {}).get("layers", ()))
      if uid is not None and "pidns" not in layers and ("uid" in layers or report is None):
        _kill_uid(uid)  # no pid namespace held its processes: sweep the uid
      status, detail = self._classify(report, nonce, rcs[0], rcs[1], timed_out, base)
      return SandboxResult(
        status, time.monotonic() - start, detail, _tail(base / "candidate.out"), _tail(base / "candidate.err"), layers
      )
    finally:
      shutil.rmtree(base, ignore_errors=True)

  def _drive(
    self, job: CodeJob, base: Path, deadline: float, nonce: str, uid: int | None
  ) -> tuple[dict | None, bool, tuple[int | None, int | None]]:
    """Starts both processes, waits for the verdict or the deadline, kills both groups."""
    procs: list[subprocess.Popen] = []
    fds: list[int] = []
    report, timed_out = None, True
    try:
      os.chmod(base, 0o711)
      cand_dir, check_dir, stage = base / "candidate", base / "checker", base / "stage"
      for d in (cand_dir, check_dir, stage):
        d.mkdir(mode=0o700)
      if uid is not None:
        os.chown(cand_dir, uid, uid)
      for _ in range(3):
        fds += os.pipe()
      call_r, call_w, reply_r, reply_w, result_r, result_w = fds
      policy = {
        "namespaces": self.policy.namespaces, "switch_uid": uid is not None, "audit_hook": self.policy.audit_hook,
      }
      common = {"policy": policy, "entry_points": [job.entry_point]}
      cand_cfg = {
        **common, "role": "candidate", "program": job.program, "workdir": str(cand_dir), "stage_dir": str(stage),
        "uid": uid, "hide": self.policy.hidden(), "limits": self.limits.child_limits(False),
        "call_fd": call_r, "reply_fd": reply_w,
      }
      check_cfg = {
        **common, "role": "checker", "prelude": job.prelude, "tests": job.tests,
        "check_call": job.resolved_check_call(), "nonce": nonce, "workdir": str(check_dir),
        "limits": self.limits.child_limits(True), "call_fd": call_w, "reply_fd": reply_r, "result_fd": result_w,
      }
      procs.append(self._spawn("candidate", cand_cfg, cand_dir, base, (call_r, reply_w)))
      procs.append(self._spawn("checker", check_cfg, check_dir, base, (call_w, reply_r, result_w)))
      for fd in (call_r, call_w, reply_r, reply_w, result_w):
        os.close(fd)
        fds.remove(fd)
      for proc, cfg in zip(procs, (cand_cfg, check_cfg), strict=True):
        try:
          proc.stdin.write(json.dumps(cfg).encode())
          proc.stdin.close()
        except BrokenPipeError:
          pass
      data, eof = _read_until_eof(result_r, deadline)
      report = _parse_report(data)
      candidate, checker = procs
      timed_out = not eof
      if not timed_out:
        try:
          checker.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
          timed_out = True
      if report is not None and report.get("status") == "candidate_died" and not timed_out:
        try:  # its exit status tells a CPU-limit kill from a crash
          candidate.wait(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
          pass
    finally:
      if procs and self.policy.namespaces:
        _stop_supervisor(procs[0])
      for proc in procs:
        _kill_group(proc)
      for proc in procs:
        proc.wait()
      for fd in fds:
        os.close(fd)
    rcs = tuple(p.returncode for p in procs) + (None,) * (2 - len(procs))
    return report, timed_out, rcs  # type: ignore[return-value]

  def _spawn(self, role: str, cfg: dict, cwd: Path, base: Path, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "TMPDIR": str(cwd), "LANG": "C.UTF-8"}
    with open(base / f"{role}.out", "wb") as out, open(base / f"{role}.err", "wb") as err:
      return subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", _CHILD, role],
        stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd, env=env,
        pass_fds=pass_fds, start_new_session=True, close_fds=True,
      )

  def _classify(
    self, report: dict | None, nonce: str, cand_rc: int | None, check_rc: int | None, timed_out: bool, base: Path
  ) -> tuple[str, str]:
    if report is None:
      if timed_out:
        return "timeout", f"no verdict within {self.limits.timeout_s:g}s"
      return "sandbox_error", f"checker exited ({check_rc}) without a verdict: {_tail(base / 'checker.err', 500)}"
    status, detail = str(report.get("status")), str(report.get("detail", ""))
    if status == "passed":
      if report.get("nonce") == nonce and check_rc == 0 and not timed_out:
        return "passed", ""
      return "sandbox_error", "pass marker without a clean checker exit"
    if status == "candidate_died":
      err = _tail(base / "candidate.err", 4000)
      if cand_rc in (128 + signal.SIGXCPU, -signal.SIGXCPU, 128 + signal.SIGKILL, -signal.SIGKILL):
        return "timeout", f"candidate killed by the CPU-time limit (exit {cand_rc})"
      if "MemoryError" in err:
        return "memory_limit", "candidate ran out of memory"
      return "runtime_error", f"candidate exited (status {cand_rc}) before the tests finished"
    if status == "sandbox_error":
      return status, f"{detail} | candidate stderr: {_tail(base / 'candidate.err', 600)}"
    if status in STATUSES:
      return status, detail
    return "sandbox_error", f"unknown checker status {status[:40]!r}"


# --- the code reward -----------------------------------------------------------------------------

_FENCE_RE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.S)


def build_program(problem: Problem, completion: str) -> str:
  """The candidate program for a code problem.

  A completion with a fenced code block that defines the entry point is a whole solution: it
  follows the part of the prompt before the entry point's stub (imports, helpers). Otherwise the
  completion continues the prompt (the HumanEval convention).
  """
  prompt = problem.metadata.get("prompt", problem.prompt)
  entry = re.escape(problem.metadata["entry_point"])
  blocks = [b for b in _FENCE_RE.findall(completion) if re.search(rf"^\s*def {entry}\(", b, re.M)]
  if blocks:
    stub = re.search(rf"^def {entry}\(", prompt, re.M)
    return (prompt[: stub.start()] if stub else "") + blocks[-1]
  return prompt + completion


def trusted_prelude(prompt: str) -> str:
  """The prompt as runnable source for the checker (helpers some tests call); a bare trailing
  signature gets a `pass` body; a prompt that still does not compile contributes nothing."""
  for suffix in ("", "\n    pass\n", "\n  pass\n", "\n\tpass\n"):
    try:
      compile(prompt + suffix, "<prelude>", "exec", dont_inherit=True)
      return prompt + suffix
    except (SyntaxError, ValueError):
      continue
  return ""


def job_for(problem: Problem, completion: str) -> CodeJob:
  """The sandbox job that tests `completion` on a code problem."""
  meta = problem.metadata
  return CodeJob(
    program=build_program(problem, completion),
    tests=meta["tests"],
    entry_point=meta["entry_point"],
    prelude=meta["prelude"] if "prelude" in meta else trusted_prelude(meta.get("prompt", "")),
    check_call=meta.get("check_call"),
  )


class CodeReward:
  """1.0 when the program passes every test, else 0.0; status is the sandbox status.

  Timeouts are masked (valid=False) by default, as verifier-side failures are: under load a correct
  program can run out of time. Set `mask_timeouts=False` to score them 0 instead.
  """

  name = "code"

  def __init__(
    self,
    workers: int = 1,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    mask_timeouts: bool = True,
    sandbox: Sandbox | None = None,
  ) -> None:
    self.sandbox = sandbox or Sandbox(SandboxLimits(timeout_s=timeout_s, memory_bytes=memory_mb << 20), workers=workers)
    self.mask_timeouts = mask_timeouts

  def _result(self, r: SandboxResult) -> RewardResult:
    valid = r.status != "sandbox_error" and not (r.status == "timeout" and self.mask_timeouts)
    info = {"detail": r.detail, "duration_s": round(r.duration_s, 4)}
    return RewardResult(1.0 if r.passed else 0.0, r.status, info, valid=valid)

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    return self._result(self.sandbox.run(job_for(problem, completion)))

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    jobs = [job_for(p, c) for p, c in zip(problems, completions, strict=True)]
    return [self._result(r) for r in self.sandbox.run_many(jobs)]


register("code")(CodeReward)
