"""Code sandbox: runs model-written programs against trusted tests, contained, and says what happened.

Design. Each program gets two fresh processes. The candidate process runs the untrusted program
(`sandbox_child.py candidate`); the checker process runs the trusted prelude and tests
(`sandbox_child.py checker`, on the host: the tests are trusted). The tests call the candidate's
entry point through a proxy: arguments and return values cross a pipe as plain data and are rebuilt
as plain built-in objects, so the program cannot reach the tests, `check`, `assert` or the pass
marker, and cannot return an object whose `__eq__` always says yes. Success needs all of: the
checker's `check(...)` returned; the checker then wrote, on a pipe only it holds, a marker carrying
a random nonce it got from this process; the checker exited 0; the program's time had not run out.

Layers around the candidate (`SandboxResult.layers` lists those in force, as the kernel reports them):

* bubblewrap (`rl_lm.rewards.jail`): new mount, pid, network, IPC, UTS and cgroup namespaces (and a
  user namespace when not run as root); a file-system allowlist: an empty read-only root holding
  only the base interpreter, its standard library (site-packages hidden), the shared libraries
  those need and the harness, all read-only, plus a minimal /dev, its own read-only /proc and one
  writable tmpfs of `disk_bytes` as /tmp (run as root, also capped at `max_files` inodes: "disk:64MiB,
  16384 files"); no host environment; a seccomp filter (EPERM for ptrace, namespaces, mounts, keyrings,
  bpf, io_uring, perf, non-Unix sockets, and for lowering its own priority or pinning itself to a CPU);
  no_new_privs; its own session; killed with its parent.
* identity: run as root, the harness drops to a fresh unprivileged host uid (uid:N in the layers)
  with no capabilities before any untrusted code; otherwise the caller's uid, without capabilities,
  in a user namespace.
* rlimits: CPU time, address space, file size, open files, processes (per run) and core dumps.
* cgroups (`rl_lm.rewards.cgroup`, where this process may make them: "cgroup:v1(cpuacct,memory)"): the
  run's processes are born in groups of their own, which count the CPU time of every task that was ever
  in them (the candidate's and the checker's) and bound the candidate's memory per run: all its
  processes, its files on the tmpfs, memfd pages and the kernel's objects for them together stay within
  `run_memory_bytes` (memory_bytes + disk_bytes unless set); the kernel's OOM killer ends a run that
  reaches it (memory_limit). Whatever is left in them when the run ends is killed.
* host-side files (the two processes' stdout/stderr) live in a fresh 0700 folder the candidate
  cannot see; its own files live on the tmpfs and vanish with its mount namespace; its SysV IPC
  objects with its IPC namespace; its processes with its pid namespace, whose end this process
  waits for. Nothing of one run is visible to another.

Fallback, only where bubblewrap cannot run (binary missing, namespaces refused): rlimits, a private
0700 folder as cwd/HOME/TMPDIR, and the Python audit hook of `sandbox_child` (reads outside the
standard library and that folder, writes outside the folder, sockets, process creation, signals,
ctypes refused). A warning is logged once and the layers say "fallback". The audit hook is a
convenience, not a wall: it runs inside the process it polices (C code goes around it); without
the jail, a determined program can read what the calling user can read.

Statuses and masking. passed; failed (a test failed); syntax_error; runtime_error (the program
raised, exited, died, or hit its file-size limit); timeout (the program did not finish within
`timeout_s` of wall time counted from when its sandbox was up, or hit its CPU-time limit);
memory_limit (RLIMIT_AS, or the run's memory bound); overloaded (it ran out of wall time while the
host kept it waiting); sandbox_error (the sandbox failed to start within `startup_timeout_s`, failed
to isolate, or the harness or protocol failed: ours). The first six are verdicts on the program and
score 0 (passed: 1) with valid=True, a program that spins, sleeps or ignores signals included; only
overloaded and sandbox_error are masked (valid=False).

Overloaded, precisely: in the window of its budget, the run got less than half the budget of CPU time
(counted by its cgroup: exited threads and children the kernel reaped itself included) while one of
its threads spent at least half the budget runnable but off a CPU (its schedstat), and no thread ran
below the priority it was started with. A single thread's wait, not the sum over threads: sixteen
threads on two CPUs wait seven times as long as they run, summed; but one thread waits only while
every CPU it may use is busy, and while they are busy with the program's own threads its CPU count
grows at least as fast. It needs the jail with its seccomp filter: that is what makes waiting never the
program's choice (no nice, SCHED_IDLE, affinity or autogroup changes, not even for a moment). Where
either the cgroup CPU count or the filter is missing (no cgroups here, the fallback, an architecture
without a filter table), no count is one the program cannot falsify, and a program that ran out its
time scores 0 (timeout) whatever the host did.

Threat model, honestly. The walls aim at a policy that stumbles on hacks and at ordinary malicious
programs; the parent trusts nothing the candidate says except to lower a score. A kernel bug
reachable through the allowed system calls would break the jail; so would a bug in bubblewrap.
Memory is bounded per run where a memory cgroup can be had (`run_memory_bytes`); elsewhere only per
process (RLIMIT_AS x RLIMIT_NPROC, and nothing bounds memfd or the kernel's objects). Only data can be
passed to and returned from the function under test: mutation of arguments is not seen by the
tests, and tests that pass functions or other objects get a sandbox_error.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
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

from rl_lm.rewards import cgroup, jail
from rl_lm.rewards.registry import RewardResult, register
from rl_lm.tasks.base import Problem

STATUSES = (
  "passed", "failed", "syntax_error", "runtime_error", "timeout", "memory_limit", "overloaded", "sandbox_error",
)
#: Statuses that are no verdict on the program (a fault of the sandbox or of the host): masked, never scored.
MASKED_STATUSES = frozenset({"overloaded", "sandbox_error"})
_CHILD = str(Path(__file__).with_name("sandbox_child.py"))
_UID_BASE, _UID_SPAN = 1_000_000, 1 << 24
_OVERLOAD_SHARE = 0.5  # share of the budget a thread waited for a CPU (and the run was not on one): the host's fault
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Resource limits of one run.

  Attributes:
    timeout_s: the program's wall-clock budget, counted from when its sandbox is up to the verdict.
    startup_timeout_s: how long the sandbox may take to come up (an overrun is a sandbox_error).
    cpu_s: CPU-time limit of the candidate (SIGKILL one second later); default ceil(timeout_s) + 1.
    memory_bytes: address-space limit of each candidate process (RLIMIT_AS).
    run_memory_bytes: memory of the whole run where a memory cgroup can be had: all the candidate's
      processes, its tmpfs files, memfd pages and the kernel's objects for them (inodes, page tables);
      default memory_bytes + disk_bytes (one process's worth of memory and a full disk).
    file_size_bytes: largest file the candidate may write (RLIMIT_FSIZE; stdout and stderr included).
    disk_bytes: size of the jail's writable tmpfs (/tmp, the candidate's cwd).
    max_files: inodes of that tmpfs (files, folders, links) where the sandbox mounts it itself (as root).
    max_processes: processes and threads of the candidate (RLIMIT_NPROC of its fresh uid).
    open_files: RLIMIT_NOFILE.
    max_message_bytes: largest value that may cross the pipe between the processes.
    checker_memory_bytes: address-space limit of the checker.
  """

  timeout_s: float = 10.0
  startup_timeout_s: float = 30.0
  cpu_s: int | None = None
  memory_bytes: int = 1 << 30
  run_memory_bytes: int | None = None
  file_size_bytes: int = 16 << 20
  disk_bytes: int = 64 << 20
  max_files: int = 16384
  max_processes: int = 16
  open_files: int = 64
  max_message_bytes: int = 16 << 20
  checker_memory_bytes: int = 2 << 30

  def run_memory(self) -> int:
    """The run's memory bound in bytes (`run_memory_bytes`, or memory_bytes + disk_bytes)."""
    return self.run_memory_bytes if self.run_memory_bytes is not None else self.memory_bytes + self.disk_bytes

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
  """Which layers to use (tests switch some off to check the others).

  Attributes:
    jail: run the candidate under bubblewrap when it can run here; False forces the fallback.
    audit_hook: the in-process Python audit hook: None = only in the fallback, True = always, False = never.
    cgroups: run each job in cgroups of its own where this process may make them (False: per-process limits
      only, and no timeout is ever blamed on the host).
  """

  jail: bool = True
  audit_hook: bool | None = None
  cgroups: bool = True


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
  """What happened to one program.

  `cpu_s` is the run's CPU time (candidate and checker) from the program's start to its verdict or
  deadline, and `peak_memory_bytes` the most memory the candidate's processes held at once, both as the
  run's cgroups counted them (None where there are none).
  """

  status: str
  duration_s: float
  detail: str = ""
  stdout: str = ""
  stderr: str = ""
  layers: tuple[str, ...] = ()
  cpu_s: float | None = None
  peak_memory_bytes: int | None = None

  @property
  def passed(self) -> bool:
    return self.status == "passed"


# --- host-side helpers ---------------------------------------------------------------------------


def _tail(path: Path, n: int = 2000) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - n))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return ""


def remove_tree(path: Path) -> None:
  """Deletes a folder tree and never raises: `shutil.rmtree` first, `rm -rf` for what it left
  (a tree too deep for its recursion, say); a warning if even that fails."""
  try:
    shutil.rmtree(path)
  except FileNotFoundError:
    return
  except (OSError, RecursionError):
    pass
  if os.path.lexists(path):
    try:
      subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
      pass
  if os.path.lexists(path):
    _log.warning("code sandbox: could not delete %s", path)


class _Frames:
  """Length-prefixed JSON messages from the checker's result pipe, read against deadlines."""

  def __init__(self, fd: int, limit: int = 1 << 20) -> None:
    self.fd, self.limit, self.buf, self.eof = fd, limit, b"", False

  def next(self, deadline: float) -> dict | None:
    """The next message; None at end of file (`self.eof`) or at the deadline."""
    while True:
      if len(self.buf) >= 4:
        n = int.from_bytes(self.buf[:4], "big")
        if n > self.limit:
          return {"t": "verdict", "status": "sandbox_error", "detail": f"oversized report ({n} bytes)"}
        if len(self.buf) >= 4 + n:
          data, self.buf = self.buf[4 : 4 + n], self.buf[4 + n :]
          try:
            msg = json.loads(data)
          except ValueError:
            msg = None
          return msg if isinstance(msg, dict) else {"t": "verdict", "status": "sandbox_error", "detail": "bad report"}
      if self.eof:
        return None
      left = deadline - time.monotonic()
      if left <= 0:
        return None
      if select.select([self.fd], [], [], left)[0]:
        chunk = os.read(self.fd, 65536)
        self.buf += chunk
        self.eof = not chunk


@functools.cache
def _warn_fallback(why: str) -> None:
  _log.warning(
    "code sandbox: bubblewrap cannot run here (%s); FALLING BACK to rlimits + a private folder + a Python audit "
    "hook: no file-system allowlist, no namespaces, no seccomp. Programs can read what this user can read.", why,
  )


def _init_pid(info_fd: int | None) -> int | None:
  """The host pid of the jail's init process, from bwrap's --info-fd, if it got that far."""
  if info_fd is None or not select.select([info_fd], [], [], 0)[0]:
    return None
  try:
    info, _ = json.JSONDecoder().raw_decode(os.read(info_fd, 65536).decode())
    return int(info["child-pid"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _stop(procs: list[subprocess.Popen], init_pid: int | None, jail_proc: subprocess.Popen | None) -> None:
  """Kills everything the run started and waits until it is gone (the jail's whole pid namespace too)."""
  pidfd = None
  if init_pid is not None and jail_proc is not None:
    try:
      pidfd = os.pidfd_open(init_pid)
      with open(f"/proc/{init_pid}/stat", "rb") as f:
        stat = f.read()
      if int(stat[stat.rfind(b")") + 2 :].split()[1]) == jail_proc.pid:  # still bwrap's child: the jail's init
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # takes every process of its pid namespace with it
    except (OSError, ValueError, IndexError):
      pass
  for proc in procs:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
  for proc in procs:
    proc.wait()
  if pidfd is not None:
    select.select([pidfd], [], [], 10.0)  # readable once the namespace's init has exited, i.e. all are gone
    os.close(pidfd)


@dataclasses.dataclass
class _Outcome:
  """What `_drive` saw."""

  verdict: dict | None = None
  started: bool = False
  timed_out: bool = False
  cand_rc: int | None = None
  check_rc: int | None = None
  layers: tuple[str, ...] = ()
  counted: bool = False  # cpu_s and wait_s come from counts the program cannot falsify (see the module docstring)
  cpu_s: float | None = None  # the run's CPU time in its budget's window (cgroup), None without a count
  wait_s: float = 0.0  # the longest any one of the run's threads waited for a CPU in that window
  deprioritised: bool = False  # a thread ran below the priority it was started with (nice, SCHED_IDLE, autogroup)
  oom_kills: int = 0  # processes the run's memory bound killed
  peak_memory_bytes: int | None = None


class Sandbox:
  """Runs `CodeJob`s, each in its own pair of processes; `run_many` keeps at most `workers` in flight."""

  def __init__(
    self, limits: SandboxLimits | None = None, policy: SandboxPolicy | None = None, workers: int = 1
  ) -> None:
    self.limits = limits or SandboxLimits()
    self.policy = policy or SandboxPolicy()
    self.workers = max(1, int(workers))
    self._root = os.geteuid() == 0
    check = jail.trial_run(_CHILD) if self.policy.jail else jail.JailCheck(None, why="switched off")
    if check.bwrap is None and self.policy.jail:
      _warn_fallback(check.why)
    self._bwrap, self._seccomp, self._fallback_reason = check.bwrap, check.seccomp, check.why
    self._private_tmpfs = check.bwrap is not None and check.private_tmpfs
    self._cgroups = cgroup.detect() if self.policy.cgroups else cgroup.Support(why="switched off")
    # Only these make a starved run's counts trustworthy: the cgroup's CPU count, and the filter that keeps the
    # program from choosing to wait.
    self._counts_overload = self.jailed and self._seccomp and self._cgroups.cpu is not None
    hook = self.policy.audit_hook
    self._audit_hook = (self._bwrap is None) if hook is None else hook

  @property
  def jailed(self) -> bool:
    """Whether programs run under bubblewrap (False: the fallback)."""
    return self._bwrap is not None

  @property
  def cgroups(self) -> cgroup.Support:
    """The cgroups this sandbox puts each run in (`Support.layer` names them; `why` says what is missing)."""
    return self._cgroups

  def run_many(self, jobs: Sequence[CodeJob]) -> list[SandboxResult]:
    """Runs jobs in a bounded pool of `workers` threads (each drives two processes); keeps order."""
    if self.workers == 1 or len(jobs) <= 1:
      return [self.run(j) for j in jobs]
    with ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox") as pool:
      return list(pool.map(self.run, jobs))

  def run(self, job: CodeJob) -> SandboxResult:
    """Runs one job; never raises for anything the program does (sandbox failures -> sandbox_error)."""
    start = time.monotonic()
    base = None
    try:
      base = Path(tempfile.mkdtemp(prefix="rl_lm_sandbox_"))  # 0700: ours alone
      nonce = secrets.token_hex(16)
      outcome = self._drive(job, base, start, nonce)
      status, detail = self._classify(outcome, base, nonce)
      return SandboxResult(
        status, time.monotonic() - start, detail, _tail(base / "candidate.out"), _tail(base / "candidate.err"),
        outcome.layers, outcome.cpu_s, outcome.peak_memory_bytes,
      )
    except Exception as e:
      return SandboxResult("sandbox_error", time.monotonic() - start, f"{type(e).__name__}: {e}")
    finally:
      if base is not None:
        remove_tree(base)

  def _host_layers(self) -> tuple[str, ...]:
    groups = (self._cgroups.layer,) if self._cgroups.layer else ()
    if self._bwrap is None:
      return (f"fallback(no jail: {self._fallback_reason[:120]})", *groups)
    spaces = "mnt+pid+net+ipc+uts+cgroup" + ("" if self._root else "+user")
    files = f",{self.limits.max_files} files" if self._private_tmpfs else ""
    disk = f"disk:{self.limits.disk_bytes >> 20}MiB{files}"
    return ("bwrap", f"ns:{spaces}", "fs:allowlist", disk, *groups)

  def _candidate_argv(self, base: Path, fds: list[int]) -> tuple[list[str], str, tuple[int, ...], int | None]:
    """(argv, cwd, extra fds to pass, info fd to read) of the candidate process."""
    python = jail.allowlist().interpreter if self._bwrap else sys.executable
    if self._bwrap is None:
      work = base / "candidate"
      work.mkdir(mode=0o700)
      return [python, "-I", "-S", "-B", _CHILD, "candidate"], str(work), (), None
    extra, seccomp_fd = [], None
    if self._seccomp:
      seccomp_fd, w = os.pipe()
      fds.append(seccomp_fd)
      os.write(w, jail.seccomp_program())
      os.close(w)
      extra.append(seccomp_fd)
    info_r, info_w = os.pipe()
    fds += [info_r, info_w]
    extra.append(info_w)
    prefix, workdir_host = [], None
    if self._private_tmpfs:  # our own tmpfs, with an inode cap, mounted where only this run's namespaces see it
      workdir_host = str(base / "work")
      os.mkdir(workdir_host, 0o700)
      prefix = jail.private_tmpfs_argv(workdir_host, self.limits.disk_bytes, self.limits.max_files) or []
    argv = prefix + jail.bwrap_argv(
      self._bwrap, _CHILD, [python, "-I", "-S", "-B", jail.SANDBOX_HARNESS, "candidate"], as_root=self._root,
      workdir_bytes=self.limits.disk_bytes, seccomp_fd=seccomp_fd, info_fd=info_w,
      workdir_host=workdir_host if prefix else None,
    )
    return argv, str(base), tuple(extra), info_r

  def _drive(self, job: CodeJob, base: Path, start: float, nonce: str) -> _Outcome:
    """Starts both processes, times the program from its start, collects the verdict, kills everything.

    (1) the run's cgroups; (2) both processes, born inside them; (3) the program's clock starts when the checker
    says the candidate is up, with the run's CPU count and each thread's wait read then, and the program runs
    only after they are read (a byte on the go pipe, passed on by the checker); (4) at the verdict or
    the deadline they are read again (at the deadline with the threads' priorities); (5) everything is stopped,
    the memory peak and OOM kills read, the groups removed.
    """
    out = _Outcome(layers=self._host_layers())
    procs: list[subprocess.Popen] = []
    fds: list[int] = []
    info_fd, jail_proc, groups = None, None, None
    try:
      groups = cgroup.RunGroups(self._cgroups, self.limits.run_memory()) if self._cgroups.layer else None  # (1)
      for _ in range(4):
        fds += os.pipe()
      call_r, call_w, reply_r, reply_w, result_r, result_w, go_r, go_w = fds[:8]
      argv, cwd, extra, info_fd = self._candidate_argv(base, fds)
      jailed = self._bwrap is not None
      cand_cfg = {
        "role": "candidate", "program": job.program, "entry_points": [job.entry_point],
        "limits": self.limits.child_limits(False), "jail": jailed, "audit_hook": self._audit_hook,
        "uid": _UID_BASE + secrets.randbelow(_UID_SPAN) if jailed and self._root else None,
        "workdir": jail.SANDBOX_WORKDIR if jailed else cwd, "call_fd": call_r, "reply_fd": reply_w,
      }
      check_dir = base / "checker"
      check_dir.mkdir(mode=0o700)
      check_cfg = {
        "role": "checker", "prelude": job.prelude, "tests": job.tests, "check_call": job.resolved_check_call(),
        "entry_points": [job.entry_point], "nonce": nonce, "limits": self.limits.child_limits(True),
        "call_fd": call_w, "reply_fd": reply_r, "result_fd": result_w, "go_fd": go_r,
      }
      checker_argv = [sys.executable, "-I", "-S", "-B", _CHILD, "checker"]
      if groups is not None:  # (2)
        argv, checker_argv = groups.join_argv("candidate", argv), groups.join_argv("checker", checker_argv)
      procs.append(self._spawn("candidate", argv, cwd, base, (call_r, reply_w, *extra)))
      jail_proc = procs[0] if jailed else None
      procs.append(self._spawn("checker", checker_argv, str(check_dir), base, (call_w, reply_r, result_w, go_r)))
      for fd in (call_r, call_w, reply_r, reply_w, result_w, go_r, *extra):
        os.close(fd)
        fds.remove(fd)
      for proc, cfg in zip(procs, (cand_cfg, check_cfg), strict=True):
        try:
          proc.stdin.write(json.dumps(cfg).encode())
          proc.stdin.close()
        except BrokenPipeError:
          pass
      reader = _Frames(result_r)
      msg = reader.next(start + self.limits.startup_timeout_s)
      if msg is not None and msg.get("t") == "started":  # (3)
        out.started = True
        t0 = time.monotonic()
        out.layers += tuple(str(x) for x in msg.get("layers", ()))
        cpu0 = groups.cpu_s() if groups is not None else None
        waits0 = jail.thread_waits(groups.threads()) if groups is not None and self._counts_overload else {}
        try:
          os.write(go_w, b"g")  # the program runs only now, so the counts above hold none of its time
        except OSError:
          pass  # the checker is gone: its verdict (or none) follows
        msg = reader.next(t0 + self.limits.timeout_s)
        cpu = groups.cpu_s() if groups is not None else None  # (4)
        out.cpu_s = cpu - cpu0 if cpu is not None and cpu0 is not None else None
        if msg is None and not reader.eof and self._counts_overload and out.cpu_s is not None:
          tids = groups.threads()
          waits = jail.thread_waits(tids)
          out.wait_s = max((w - waits0.get(tid, 0.0) for tid, w in waits.items()), default=0.0)
          out.deprioritised = jail.lowered_priority(tids, os.getpriority(os.PRIO_PROCESS, 0))
          out.counted = True
      out.timed_out = msg is None and not reader.eof
      out.verdict = msg if msg is not None and msg.get("t") == "verdict" else None
      if out.verdict is not None:
        status = out.verdict.get("status")
        for proc, wanted in ((procs[1], True), (procs[0], status == "candidate_died")):
          if wanted:  # the checker's clean exit is part of a pass; the candidate's exit status tells a limit
            try:
              proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
              pass
    finally:
      _stop(procs, _init_pid(info_fd), jail_proc)  # (5)
      for fd in fds:
        os.close(fd)
      if groups is not None:
        out.oom_kills, out.peak_memory_bytes = groups.oom_kills(), groups.memory_peak()
        groups.close()
    rcs = [p.returncode for p in procs] + [None, None]
    out.cand_rc, out.check_rc = rcs[0], rcs[1]
    return out

  def _spawn(self, role: str, argv: list[str], cwd: str, base: Path, pass_fds: tuple[int, ...]) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"}
    with open(base / f"{role}.out", "wb") as out, open(base / f"{role}.err", "wb") as err:
      return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd, env=env,
        pass_fds=pass_fds, start_new_session=True, close_fds=True,
      )

  def _classify(self, out: _Outcome, base: Path, nonce: str) -> tuple[str, str]:
    budget = self.limits.timeout_s
    if out.verdict is None:
      if out.started and out.timed_out:
        if not out.counted or out.cpu_s is None:
          why = "no CPU count here that the program cannot falsify, so the time it ran out is its own"
          return "timeout", f"no verdict within {budget:g}s of the program starting ({why})"
        share = _OVERLOAD_SHARE * budget
        times = f"the run on a CPU {out.cpu_s:.2f}s, a thread of it runnable but waiting for one {out.wait_s:.2f}s"
        if out.wait_s >= share and out.cpu_s < share and not out.deprioritised:
          return "overloaded", f"the host kept the program waiting: {times} of its {budget:g}s"
        return "timeout", f"no verdict within {budget:g}s of the program starting ({times})"
      if out.timed_out:
        return "sandbox_error", f"the sandbox did not start within {self.limits.startup_timeout_s:g}s"
      err = _tail(base / "checker.err", 500) or _tail(base / "candidate.err", 500)
      return "sandbox_error", f"checker exited ({out.check_rc}) without a verdict: {err}"
    status, detail = str(out.verdict.get("status")), str(out.verdict.get("detail", ""))
    if status == "passed":
      if out.verdict.get("nonce") == nonce and out.check_rc == 0 and not out.timed_out:
        return "passed", ""
      return "sandbox_error", "pass marker without a clean checker exit"
    if status == "candidate_died":
      rc, err = out.cand_rc, _tail(base / "candidate.err", 4000)
      if out.oom_kills:  # its SIGKILL came from the run's memory bound, not the CPU-time limit
        peak = "" if out.peak_memory_bytes is None else f", peak {out.peak_memory_bytes / 2**20:.0f}MiB"
        return "memory_limit", f"the run reached its memory bound of {self.limits.run_memory() / 2**20:.0f}MiB{peak}"
      if rc in (128 + signal.SIGXCPU, -signal.SIGXCPU, 128 + signal.SIGKILL, -signal.SIGKILL):
        return "timeout", f"candidate killed by the CPU-time limit (exit {rc})"
      if rc in (128 + signal.SIGXFSZ, -signal.SIGXFSZ):
        return "runtime_error", "candidate hit the file-size limit"
      if "MemoryError" in err:
        return "memory_limit", "candidate ran out of memory"
      return "runtime_error", f"candidate exited (status {rc}) before the tests finished"
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

  Masked (valid=False) only when the status is no verdict on the program (`MASKED_STATUSES`: the
  sandbox failed, or the host never gave the program its time). A timeout, crash or resource limit
  is the program's doing and scores 0 like any wrong answer, so timing out is never a way out.
  """

  name = "code"

  def __init__(
    self, workers: int = 1, timeout_s: float = 10.0, memory_mb: int = 1024, sandbox: Sandbox | None = None
  ) -> None:
    self.sandbox = sandbox or Sandbox(SandboxLimits(timeout_s=timeout_s, memory_bytes=memory_mb << 20), workers=workers)

  def _result(self, r: SandboxResult) -> RewardResult:
    info = {"detail": r.detail, "duration_s": round(r.duration_s, 4)}
    return RewardResult(1.0 if r.passed else 0.0, r.status, info, valid=r.status not in MASKED_STATUSES)

  def __call__(self, problem: Problem, completion: str) -> RewardResult:
    return self._result(self.sandbox.run(job_for(problem, completion)))

  def batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[RewardResult]:
    jobs = [job_for(p, c) for p, c in zip(problems, completions, strict=True)]
    return [self._result(r) for r in self.sandbox.run_many(jobs)]


register("code")(CodeReward)
