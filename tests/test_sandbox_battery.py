"""Adversarial battery: every hostile program of `CODE_PROBES`, one at a time, with the host checked after each.

Each program defines `add(a, b)` and would only pass if the sandbox leaked (it reads the HumanEval
answers from a copy elsewhere on the host, the repository, /etc, /root, /proc or another sandbox's
files; fills the disk; leaves SysV or POSIX shared memory; builds a 1,500-deep folder tree; forks,
spins, sleeps, ignores signals, allocates; calls ptrace, keyctl, unshare, setns, mount; connects to a
listener this test opens on 127.0.0.1; reads this process's secret environment variable; kills its
parent; forges the pass marker; returns an object whose `__eq__` lies; disguises its own timeout as an
overloaded host; ...). Each must score 0 (or be
masked, for a spinner on a host too loaded to give it its time), and after each the host must hold
nothing of it: no process, no file in the temporary folders, no SysV IPC object, no mount.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from rl_lm.rewards.audit import CODE_PROBES, PROBE_TESTS, probe_env
from rl_lm.rewards.code import CodeJob, Sandbox, SandboxLimits, SandboxPolicy

_PROGRAMS = {name: (program, expected) for name, program, expected in CODE_PROBES}
_MARKERS = (b"sandbox_child", b"/sandbox/harness.py", b"bwrap")


def _parent(pid: int) -> int | None:
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])
  except (OSError, ValueError, IndexError):
    return None


def _looks_sandboxed(pid: int) -> bool:
  try:
    uid = os.stat(f"/proc/{pid}").st_uid
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      cmdline = f.read()
  except OSError:
    return False
  return uid >= 1_000_000 or any(m in cmdline for m in _MARKERS)


def _sandbox_processes(me: int, helper: int) -> set[int]:
  """Processes of a sandbox on this machine: this test's descendants (but the probe helper), and any
  orphan tree (its root adopted by init) that runs under a sandbox uid or the sandbox's programs.

  A sandbox that another test process runs at the same time (the other pytest worker) is not an orphan:
  its tree's root is that worker's launcher, not a sandbox program."""
  found = set()
  for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) in (me, helper):
      continue
    pid, chain = int(name), []
    parent = _parent(pid)
    while parent not in (None, 0, 1, me) and len(chain) < 64:
      chain.append(parent)
      parent = _parent(parent)
    if parent == me:
      if helper not in chain:
        found.add(pid)
      continue
    root = chain[-1] if chain else pid  # the ancestor that init adopted (or started)
    if parent in (0, 1, None) and _looks_sandboxed(root):
      found.add(pid)
  return found


def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return ""


def _diff(before: object, after: object) -> tuple[list[str], list[str]]:
  def lines(x: object) -> set[str]:
    return set(x.splitlines()) if isinstance(x, str) else {str(v) for v in x}

  return sorted(lines(before) - lines(after)), sorted(lines(after) - lines(before))


def _mounts(host_tmp: Path) -> list[str]:
  """The host's mounts, less those inside other pytest sessions' folders (other tests mount a full disk there)."""
  ours = str(host_tmp.parent)  # this session's base temporary folder
  others = os.path.dirname(ours)
  pytest_root = os.path.basename(others).startswith("pytest-of-")
  out = []
  for line in _read("/proc/self/mountinfo").splitlines():
    point = line.split()[4]
    if pytest_root and point.startswith(others + "/") and not point.startswith(ours):
      continue
    out.append(line)
  return out


def _host_state(host_tmp: Path) -> dict:
  return {
    "files in the sandbox's host folder": sorted(os.listdir(host_tmp)),
    "SysV IPC objects": sorted(  # (kind, key, id) of every segment, queue and semaphore set
      (kind, *line.split()[:2])
      for kind in ("shm", "msg", "sem")
      for line in _read(f"/proc/sysvipc/{kind}").splitlines()[1:]
    ),
    "mounts": _mounts(host_tmp),
  }


@pytest.fixture(scope="module")
def host_tmp(tmp_path_factory):
  """A private host temporary folder for the sandboxes' own files (stdout, stderr), so that it can be
  checked empty after each program while other processes use /tmp."""
  folder = tmp_path_factory.mktemp("sandbox_host")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(tempfile, "tempdir", str(folder))
    yield folder


@pytest.fixture(scope="module")
def env():
  with probe_env() as e:
    yield e


@pytest.fixture(scope="module")
def jail_sandbox(host_tmp):
  sandbox = Sandbox(SandboxLimits(timeout_s=1.5))
  if not sandbox.jailed:
    pytest.skip("bubblewrap cannot run here; the fallback battery below still runs")
  return sandbox


def _run_and_check(sandbox: Sandbox, env, host_tmp: Path, name: str, also: tuple[str, ...] = ()) -> None:
  program, expected = _PROGRAMS[name]
  expected = (*expected, *also)
  before = _host_state(host_tmp)
  # Children this test process had before the program (a maths-verifier worker another test started) are not
  # the sandbox's.
  already = _sandbox_processes(os.getpid(), env.helper_pid)
  r = sandbox.run(CodeJob(env.render(program), PROBE_TESTS, "add"))
  assert r.status != "passed", (name, r)
  assert r.status in expected, (name, r.status, r.detail)
  assert r.duration_s < sandbox.limits.timeout_s + 10, (name, r.duration_s)
  deadline = time.monotonic() + 2.0  # the run waited for its pid namespace to end; allow for /proc's lag
  while (left := _sandbox_processes(os.getpid(), env.helper_pid) - already) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert left == set(), (name, "processes left", left)
  after = _host_state(host_tmp)
  changed = {k: _diff(before[k], after[k]) for k in before if before[k] != after[k]}
  assert not changed, (name, "host changed", changed)
  assert env.leaks() == [], (name, env.leaks())


@pytest.mark.parametrize("name", list(_PROGRAMS))
def test_each_hostile_program_is_contained(jail_sandbox, env, host_tmp, name):
  _run_and_check(jail_sandbox, env, host_tmp, name)


def test_battery_size():
  assert len(CODE_PROBES) >= 30


def test_sysv_ipc_does_not_outlive_its_episode(jail_sandbox, env, host_tmp):
  """A segment made in one episode is not there in the next, nor on the host."""
  _run_and_check(jail_sandbox, env, host_tmp, "sysv_ipc_left_behind")
  _run_and_check(jail_sandbox, env, host_tmp, "sysv_ipc_from_an_earlier_run")
  assert str(env.shm_key) not in _read("/proc/sysvipc/shm")


def test_concurrent_sandboxes_cannot_see_each_other(env, host_tmp):
  """One program prints and stores a secret while another, running at the same time, hunts for it."""
  sandbox = Sandbox(SandboxLimits(timeout_s=4.0), workers=2)
  token = "tok" + env.canary
  holder = (
    "import sys, time\ndef add(a, b):\n"
    f"  print({token!r}, flush=True)\n  open('/tmp/secret', 'w').write({token!r})\n  time.sleep(1.5)\n  return None\n"
  )
  hunter = (
    "import glob, os, time\ndef add(a, b):\n  end = time.time() + 1.2\n  while time.time() < end:\n"
    "    paths = glob.glob('/proc/*/fd/*') + glob.glob('/tmp/*') + glob.glob('/tmp/*/*') + glob.glob('/*/*.out')\n"
    "    for p in paths:\n      try:\n        with open(p, 'rb') as f:\n"
    f"          if {token.encode()!r} in f.read(1 << 16):\n            return a + b\n"
    "      except BaseException:\n        pass\n    time.sleep(0.05)\n  return None\n"
  )
  before = _host_state(host_tmp)
  held, hunted = sandbox.run_many([CodeJob(holder, PROBE_TESTS, "add"), CodeJob(hunter, PROBE_TESTS, "add")])
  assert token in held.stdout and held.status == "failed", held  # it ran, and printed its secret
  assert hunted.status == "failed", hunted
  assert _host_state(host_tmp) == before and env.leaks() == []


FALLBACK_PROBES = [
  "read_humaneval_copy", "read_repository", "read_host_files", "list_other_sandboxes", "str_subclass_audit_bypass",
  "symlink_escape", "connect_listener", "read_parent_environment", "kill_parent", "write_outside", "fork_bomb",
  "posix_shm_and_dev_shm", "sysv_ipc_left_behind", "tamper_with_stdlib_and_harness", "forge_pass_marker",
  "deep_folder_tree",
]


@pytest.mark.parametrize("name", FALLBACK_PROBES)
def test_fallback_contains_each_program(env, host_tmp, name):
  """Without the jail (rlimits, a private folder, the audit hook): weaker walls, same scores, nothing left."""
  sandbox = Sandbox(SandboxLimits(timeout_s=1.5), SandboxPolicy(jail=False))
  slow_hook = ("timeout", "overloaded") if name == "deep_folder_tree" else ()  # the hook checks all 1,500 levels
  _run_and_check(sandbox, env, host_tmp, name, also=slow_hook)
