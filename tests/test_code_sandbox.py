"""Code sandbox: statuses, masking by cause, the data-only boundary, the jail's layers, HumanEval acceptance.

The adversarial battery (every hostile program, with host checks after each) is tests/test_sandbox_battery.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rl_lm.rewards.audit import BROKEN_BODIES, PROBE_TESTS, run_code_probes
from rl_lm.rewards.code import (
  CodeJob,
  CodeReward,
  Sandbox,
  SandboxLimits,
  SandboxPolicy,
  SandboxResult,
  _Outcome,
  build_program,
  job_for,
  remove_tree,
)
from rl_lm.rewards.jail import private_tmpfs_argv, seccomp_program
from rl_lm.rewards.sandbox_child import Unencodable, decode, encode
from rl_lm.tasks.base import Problem
from rl_lm.tasks.humaneval import HumanEvalTask

ADD = "def add(a, b):\n  return a + b\n"
SPIN = ("timeout", "overloaded")  # a spinning program on a host too loaded to give it its time is masked


@pytest.fixture(scope="module")
def sandbox():
  return Sandbox(SandboxLimits(timeout_s=3.0), workers=2)


@pytest.fixture(scope="module")
def jailed(sandbox):
  if not sandbox.jailed:
    pytest.skip("bubblewrap cannot run here (the fallback is tested separately)")
  return sandbox


@pytest.mark.parametrize(
  ("program", "statuses"),
  [
    (ADD, ("passed",)),
    ("def add(a, b):\n  return a - b\n", ("failed",)),
    ("def add(a, b)\n  return a + b\n", ("syntax_error",)),
    ("def add(a, b):\n  return undefined_name\n", ("runtime_error",)),
    ("raise ValueError('at import')\n", ("runtime_error",)),
    ("def other(a, b):\n  return a + b\n", ("runtime_error",)),
    ("def add(a, b):\n  while True:\n    pass\n", SPIN),
    ("import time\ndef add(a, b):\n  time.sleep(60)\n", ("timeout",)),
    ("def add(a, b):\n  return len(bytearray(4 << 30))\n", ("memory_limit",)),
    ("def add(a, b):\n  return add(a, b)\n", ("runtime_error",)),
    ("import hashlib, math, re, collections, itertools, string, heapq, fractions, decimal, statistics\n" + ADD,
     ("passed",)),
  ],
)
def test_statuses(sandbox, program, statuses):
  r = sandbox.run(CodeJob(program, PROBE_TESTS, "add"))
  assert r.status in statuses, r


def test_masking_is_by_cause():
  """The program's own timeout, crash or limit scores 0 and counts; only infrastructure faults are masked."""
  problem = Problem("p", "", "", task="humaneval", metadata={"tests": PROBE_TESTS, "entry_point": "add", "prompt": ""})
  reward = CodeReward(timeout_s=1.0)
  sleeping = reward(problem, "import time\ndef add(a, b):\n  time.sleep(60)\n")
  assert (sleeping.status, sleeping.valid, sleeping.score) == ("timeout", True, 0.0)
  crashing = reward(problem, "def add(a, b):\n  raise ValueError\n")
  assert (crashing.status, crashing.valid) == ("runtime_error", True)
  for status in ("overloaded", "sandbox_error"):
    assert not reward._result(SandboxResult(status, 1.0)).valid
  with pytest.raises(TypeError):
    CodeReward(mask_timeouts=True)  # the switch that masked every timeout is gone


def test_a_timeout_is_blamed_on_the_host_only_when_it_kept_the_program_waiting(tmp_path):
  sb = Sandbox(SandboxLimits(timeout_s=2.0))

  def status(**kw) -> str:
    return sb._classify(_Outcome(started=True, timed_out=True, **kw), tmp_path, "n")[0]

  assert status(counted=True, cpu_s=0.3, wait_s=1.5) == "overloaded"
  for cpu, wait in ((1.9, 0.05), (0.01, 0.01), (1.5, 1.5), (4.0, 1.9)):  # spinning, sleeping, a fork bomb's own queue
    assert status(counted=True, cpu_s=cpu, wait_s=wait) == "timeout"
  assert status(counted=True, cpu_s=0.3, wait_s=1.5, deprioritised=True) == "timeout"  # it chose to wait
  assert status(counted=False, cpu_s=0.3, wait_s=1.5) == "timeout"  # no count it cannot falsify: its own time ran out
  assert status(counted=True, cpu_s=None, wait_s=1.5) == "timeout"
  assert sb._classify(_Outcome(started=False, timed_out=True), tmp_path, "n")[0] == "sandbox_error"
  killed = _Outcome(verdict={"t": "verdict", "status": "candidate_died"}, started=True, cand_rc=-9, oom_kills=1)
  assert sb._classify(killed, tmp_path, "n")[0] == "memory_limit"  # the run's memory bound's SIGKILL, not the CPU's


def test_a_program_that_lowers_its_own_priority_cannot_pass_its_wait_off_as_an_overloaded_host(jailed):
  """On a host kept busy (six spinning processes, each in its own session as separate jobs are, so that the
  kernel's autogroups share the CPUs between them and the sandbox), a spinning program waits on the runqueue:
  masked as overloaded. A program cannot choose to wait: SCHED_IDLE and nice 19 are refused (it fails, a 0).
  Without a CPU count it cannot falsify (no cgroups), the same starved spinner scores 0: the conservative rule."""
  spin = "def add(a, b):\n  while True:\n    pass\n"
  idle_spin = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n" + spin
  nice_spin = "import os\nos.nice(19)\n" + spin
  hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(6)]
  try:
    time.sleep(0.3)
    sb = Sandbox(SandboxLimits(timeout_s=1.5))
    r = sb.run(CodeJob(spin, PROBE_TESTS, "add"))
    if sb.cgroups.cpu is not None and seccomp_program() is not None:
      assert r.status == "overloaded", r  # the host's doing: masked
      assert r.cpu_s < 0.75 and "waiting" in r.detail, r
    else:
      assert r.status == "timeout", r
    for program in (idle_spin, nice_spin):
      r = sb.run(CodeJob(program, PROBE_TESTS, "add"))
      assert r.status == "runtime_error" and "PermissionError" in r.detail, r
    r = Sandbox(SandboxLimits(timeout_s=1.5), SandboxPolicy(cgroups=False)).run(CodeJob(spin, PROBE_TESTS, "add"))
    assert r.status == "timeout" and "cannot falsify" in r.detail, r
  finally:
    for hog in hogs:
      hog.kill()
      hog.wait()


def test_the_programs_clock_starts_when_its_sandbox_is_up(tmp_path, monkeypatch):
  """A sandbox slow to come up does not eat the program's budget; one that never comes up is masked."""
  import rl_lm.rewards.code as code_lib

  slow = tmp_path / "sandbox_child.py"
  text = Path(code_lib._CHILD).read_text()
  role = '  if role == "candidate":\n'
  slow.write_text(text.replace(role, role + "    import time\n    time.sleep(1.5)\n"))
  monkeypatch.setattr(code_lib, "_CHILD", str(slow))
  assert Sandbox(SandboxLimits(timeout_s=1.0)).run(CodeJob(ADD, PROBE_TESTS, "add")).status == "passed"
  r = Sandbox(SandboxLimits(timeout_s=1.0, startup_timeout_s=0.5)).run(CodeJob(ADD, PROBE_TESTS, "add"))
  assert r.status == "sandbox_error" and "did not start" in r.detail
  assert not CodeReward(sandbox=Sandbox(SandboxLimits(startup_timeout_s=0.5)))._result(r).valid


def test_data_crosses_as_plain_values():
  values = [None, True, 3, -2**80, 1.5, float("inf"), "x", b"\x00", [1, (2, 3)], {"a": {1, 2}}, frozenset({4}), 1j]
  assert decode(encode(values)) == values
  assert type(decode(encode((1, 2)))) is tuple
  nan = decode(encode(float("nan")))
  assert nan != nan

  class Sneaky(int):
    def __eq__(self, other):
      return True

  assert type(decode(encode(Sneaky(3)))) is int
  with pytest.raises(Unencodable):
    encode(object())


def test_rich_values_round_trip_through_the_sandbox(sandbox):
  program = "def f(x):\n  return {'t': (x, [x]), 's': {x}, 'b': bytes([x])}\n"
  tests = "def check(candidate):\n  assert candidate(7) == {'t': (7, [7]), 's': {7}, 'b': b'\\x07'}\n"
  assert sandbox.run(CodeJob(program, tests, "f")).status == "passed"


def test_candidate_exceptions_reach_the_tests_as_builtin_types(sandbox):
  program = "def f(x):\n  raise ValueError('no')\n"
  tests = "def check(candidate):\n  try:\n    candidate(1)\n  except ValueError:\n    return\n  assert False\n"
  assert sandbox.run(CodeJob(program, tests, "f")).status == "passed"


def test_top_level_asserts_without_check(sandbox):
  assert sandbox.run(CodeJob(ADD, "assert add(1, 2) == 3\n", "add")).status == "passed"
  assert sandbox.run(CodeJob(ADD, "assert add(1, 2) == 4\n", "add")).status == "failed"


def test_fenced_completion_is_a_whole_solution():
  prompt = "import math\n\n\ndef add(a, b):\n  \"\"\"Adds.\"\"\"\n"
  meta = {"tests": PROBE_TESTS, "entry_point": "add", "prompt": prompt}
  p = Problem("x", prompt, "", task="humaneval", metadata=meta)
  program = build_program(p, "Here:\n```python\ndef add(a, b):\n    return a + b\n```\n")
  assert program.startswith("import math") and program.count("def add") == 1
  assert build_program(p, "  return a + b\n") == prompt + "  return a + b\n"
  assert Sandbox().run(job_for(p, "```python\ndef add(a, b):\n    return a + b\n```")).status == "passed"


def test_humaneval_subset(sandbox):
  problems = HumanEvalTask().test_problems()[:12] + [HumanEvalTask().problems()[i] for i in (32, 38, 50)]
  good = sandbox.run_many([job_for(p, p.reference) for p in problems])
  assert [(p.id, r.status) for p, r in zip(problems, good, strict=True) if not r.passed] == []
  bad = sandbox.run_many([job_for(p, BROKEN_BODIES["return_none"]) for p in problems])
  assert not any(r.passed for r in bad)


def test_jail_layers_are_confirmed_by_the_kernel(jailed):
  layers = set(jailed.run(CodeJob(ADD, PROBE_TESTS, "add")).layers)
  assert {"bwrap", "fs:allowlist", "rlimits+nproc", "no-capabilities", "no-new-privs"} <= layers, layers
  cgroups = jailed.cgroups.layer
  assert (cgroups in layers) if cgroups else not any(x.startswith("cgroup:") for x in layers), (cgroups, layers)
  if private_tmpfs_argv("/mnt", 1, 1) is not None:  # root with unshare and mount, as here: an inode cap too
    assert any(x.endswith(",16384 files") for x in layers), layers
  assert any(x.startswith("ns:mnt+pid+net+ipc") for x in layers)
  assert any(x.startswith("uid:") and x != "uid:0" for x in layers)
  assert "audit-hook" not in layers  # not a wall, so not used where the walls exist
  if seccomp_program() is not None:
    assert "seccomp" in layers


def test_seccomp_turns_escape_syscalls_into_eperm(jailed):
  if seccomp_program() is None:
    pytest.skip("no seccomp table for this architecture")
  program = textwrap.dedent("""
    import ctypes, errno, os, socket
    libc = ctypes.CDLL(None, use_errno=True)
    def err(rc):
      return ctypes.get_errno() if rc == -1 else 0
    def probe():
      out = {}
      for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):
        try:
          socket.socket(fam, socket.SOCK_DGRAM if fam == socket.AF_NETLINK else socket.SOCK_STREAM)
          out[int(fam)] = 0
        except OSError as e:
          out[int(fam)] = e.errno
      out['unshare_user'] = err(libc.unshare(0x10000000))
      out['setns'] = err(libc.setns(os.open('/proc/self/ns/net', os.O_RDONLY), 0))
      out['ptrace'] = err(libc.ptrace(0, 0, 0, 0))
      out['mount'] = err(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
      out['unix'] = 0 if socket.socketpair() else -1
      return out
  """)
  tests = "def check(candidate):\n  got = candidate()\n  assert got.pop('unix') == 0, got\n"
  tests += "  assert set(got.values()) == {1}, got\n"  # EPERM
  r = jailed.run(CodeJob(program, tests, "probe"))
  assert r.status == "passed", r


def test_process_limit_bounds_a_fork_bomb(jailed):
  program = (
    "import os, time\ndef count():\n  n = 0\n  for _ in range(200):\n    try:\n      pid = os.fork()\n"
    "    except OSError:\n      return n\n    if pid == 0:\n      time.sleep(60)\n      os._exit(0)\n"
    "    n += 1\n  return n\n"
  )
  tests = "def check(candidate):\n  n = candidate()\n  assert n < 0, n\n"
  r = Sandbox(SandboxLimits(timeout_s=5.0, max_processes=16)).run(CodeJob(program, tests, "count"))
  assert r.status == "failed"
  assert int(r.detail.rsplit(":", 1)[1]) < 16, r.detail  # the bomb's children were capped by RLIMIT_NPROC


def test_fallback_without_the_jail_still_contains():
  bare = Sandbox(SandboxLimits(timeout_s=2.0), SandboxPolicy(jail=False), workers=2)
  assert not bare.jailed
  r = bare.run(CodeJob(ADD, PROBE_TESTS, "add"))
  assert r.passed and any(x.startswith("fallback") for x in r.layers) and "audit-hook" in r.layers
  names = ["write_outside", "connect_listener", "kill_parent", "fork_bomb", "read_parent_environment",
           "os_exit_in_call", "read_humaneval_copy", "str_subclass_audit_bypass", "list_other_sandboxes"]
  outcomes, leaks, _ = run_code_probes(bare, names=names)
  assert leaks == [] and not any(o.wrongly_rewarded for o in outcomes), outcomes


def test_audit_hook_cannot_be_switched_off_by_a_str_subclass(tmp_path):
  """The hook copies path arguments to exact str before looking at them and runs none of the program's code."""
  secret = tmp_path / "secret.txt"
  secret.write_text("s")
  work = tmp_path / "work"
  work.mkdir()
  script = textwrap.dedent(f"""
    import os, sys
    sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / "rl_lm" / "rewards")!r})
    from sandbox_child import install_audit_hook
    install_audit_hook({str(work)!r}, [os.path.dirname(os.__file__)])
    calls = []
    class P(str):
      def __fspath__(self):
        calls.append('fspath')
        return 'x'
      def startswith(self, *a):
        calls.append('startswith')
        return True
      def split(self, *a, **k):
        calls.append('split')
        return []
    leaked = []
    for path in (P({str(secret)!r}), {str(secret)!r}, {str(secret).encode()!r}):
      try:
        open(path).read()
        leaked.append(repr(path))
      except PermissionError:
        pass
    try:
      import ctypes
      leaked.append('ctypes')
    except ImportError:
      pass
    print(leaked, calls)
  """)
  out = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=60)
  assert out.stdout.strip() == "[] []", out.stdout + out.stderr


def test_a_harness_failure_is_a_sandbox_error_not_a_zero(tmp_path, monkeypatch):
  import rl_lm.rewards.code as code_lib

  real = code_lib._CHILD
  wrapper = tmp_path / "child.py"
  wrapper.write_text(
    f"import runpy, sys\nif sys.argv[1] == 'candidate':\n  sys.exit(1)\nrunpy.run_path({real!r}, run_name='__main__')\n"
  )
  monkeypatch.setattr(code_lib, "_CHILD", str(wrapper))
  r = Sandbox().run(CodeJob(ADD, PROBE_TESTS, "add"))
  assert r.status == "sandbox_error"


def test_cleanup_survives_a_deep_folder_tree(tmp_path):
  """1,500 nested folders made shutil.rmtree raise RecursionError; the sandbox's cleanup must not."""
  top = tmp_path / "deep"
  top.mkdir()
  fd = os.open(top, os.O_RDONLY)
  for _ in range(1500):
    os.mkdir("d", dir_fd=fd)
    new = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = new
  os.close(fd)
  start = time.monotonic()
  remove_tree(top)
  assert not top.exists() and time.monotonic() - start < 60


@pytest.mark.slow
def test_humaneval_canonical_pass_and_broken_variants_fail():
  """Acceptance: 164/164 canonical solutions pass; every broken body (pass, return None, return 0) fails."""
  problems = HumanEvalTask().test_problems()
  assert len(problems) == 164
  sandbox = Sandbox(SandboxLimits(timeout_s=20.0), workers=2)
  good = sandbox.run_many([job_for(p, p.reference) for p in problems])
  assert [(p.id, r.status, r.detail) for p, r in zip(problems, good, strict=True) if not r.passed] == []
  for kind, body in BROKEN_BODIES.items():
    bad = sandbox.run_many([job_for(p, body) for p in problems])
    assert [p.id for p, r in zip(problems, bad, strict=True) if r.passed] == [], kind
    assert not any(r.status == "sandbox_error" for r in bad), kind
