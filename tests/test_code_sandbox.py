"""Code sandbox: statuses, the data-only boundary, HumanEval acceptance, and the adversarial battery."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rl_lm.rewards.audit import BROKEN_BODIES, CODE_PROBES, PROBE_TESTS, run_code_probes
from rl_lm.rewards.code import CodeJob, Sandbox, SandboxLimits, SandboxPolicy, build_program, job_for
from rl_lm.rewards.sandbox_child import Unencodable, decode, encode
from rl_lm.tasks.base import Problem
from rl_lm.tasks.humaneval import HumanEvalTask, default_path

needs_humaneval = pytest.mark.skipif(not default_path().exists(), reason="../shared/data/humaneval absent")
ADD = "def add(a, b):\n  return a + b\n"


@pytest.fixture(scope="module")
def sandbox():
  return Sandbox(SandboxLimits(timeout_s=3.0), workers=2)


@pytest.fixture(scope="module")
def layers(sandbox):
  return set(sandbox.run(CodeJob(ADD, PROBE_TESTS, "add")).layers)


def _sandbox_processes(grace_s: float = 5.0) -> list[str]:
  """Processes owned by a sandbox uid that outlive `grace_s` (they must all be gone after each run).

  The kernel tears a killed PID namespace down asynchronously, so a process can still be listed for
  a moment after its sandbox returned; only one that stays past the grace period is a leak.
  """

  def listed() -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
      try:
        if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid >= 1_000_000:
          out.append(pid)
      except OSError:
        pass
    return out

  deadline = time.monotonic() + grace_s
  while (left := listed()) and time.monotonic() < deadline:
    time.sleep(0.05)
  return left


@pytest.mark.parametrize(
  ("program", "status"),
  [
    (ADD, "passed"),
    ("def add(a, b):\n  return a - b\n", "failed"),
    ("def add(a, b)\n  return a + b\n", "syntax_error"),
    ("def add(a, b):\n  return undefined_name\n", "runtime_error"),
    ("raise ValueError('at import')\n", "runtime_error"),
    ("def other(a, b):\n  return a + b\n", "runtime_error"),
    ("def add(a, b):\n  while True:\n    pass\n", "timeout"),
    ("def add(a, b):\n  return len(bytearray(4 << 30))\n", "memory_limit"),
    ("def add(a, b):\n  return add(a, b)\n", "runtime_error"),
  ],
)
def test_statuses(sandbox, program, status):
  r = sandbox.run(CodeJob(program, PROBE_TESTS, "add"))
  assert r.status == status, r


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


@needs_humaneval
def test_humaneval_subset(sandbox):
  problems = HumanEvalTask().test_problems()[:12] + [HumanEvalTask().problems()[i] for i in (32, 38, 50)]
  good = sandbox.run_many([job_for(p, p.reference) for p in problems])
  assert [(p.id, r.status) for p, r in zip(problems, good, strict=True) if not r.passed] == []
  bad = sandbox.run_many([job_for(p, BROKEN_BODIES["return_none"]) for p in problems])
  assert not any(r.passed for r in bad)


def test_adversarial_battery_is_contained(sandbox):
  """Acceptance: >= 12 hostile programs, each contained and scored 0; this process survives; time bounded."""
  assert len(CODE_PROBES) >= 12
  start = time.monotonic()
  outcomes, leaks, wall = run_code_probes(sandbox)
  print(f"battery: {len(outcomes)} probes in {wall:.1f}s")
  for o in outcomes:
    print(f"  {o.name:28s} {o.status:14s} {o.duration_s:.2f}s")
  assert leaks == []
  assert [o.name for o in outcomes if o.wrongly_rewarded] == []
  assert [(o.name, o.status) for o in outcomes if o.status not in o.expected] == []
  assert time.monotonic() - start < 30
  assert _sandbox_processes() == []


def test_kernel_layers_hold_without_the_audit_hook(layers):
  """With the Python audit hook off, namespaces + read-only fs + uid + rlimits must contain the battery alone."""
  if not {"pidns", "netns", "mountns"} <= layers or not any(x.startswith("readonly-fs") for x in layers):
    pytest.skip(f"kernel isolation layers unavailable here: {sorted(layers)}")
  if "uid" not in layers and "userns" not in layers:
    pytest.skip("no unprivileged identity for the candidate")
  bare = Sandbox(SandboxLimits(timeout_s=2.0), SandboxPolicy(audit_hook=False), workers=2)
  outcomes, leaks, _ = run_code_probes(bare)
  assert leaks == []
  assert [o.name for o in outcomes if o.wrongly_rewarded] == []
  assert _sandbox_processes() == []


def test_process_limit_bounds_a_fork_bomb_without_the_audit_hook(layers):
  if "rlimits+nproc" not in layers or "pidns" not in layers:
    pytest.skip(f"RLIMIT_NPROC is not enforceable here: {sorted(layers)}")
  program = (
    "import os, time\ndef count():\n  n = 0\n  for _ in range(200):\n    try:\n      pid = os.fork()\n"
    "    except OSError:\n      return n\n    if pid == 0:\n      time.sleep(60)\n      os._exit(0)\n"
    "    n += 1\n  return n\n"
  )
  tests = "def check(candidate):\n  n = candidate()\n  assert n < 0, n\n"
  limits = SandboxLimits(timeout_s=5.0, max_processes=16)
  r = Sandbox(limits, SandboxPolicy(audit_hook=False)).run(CodeJob(program, tests, "count"))
  assert r.status == "failed"
  assert int(r.detail.rsplit(":", 1)[1]) < 16, r.detail  # the bomb's children were capped by RLIMIT_NPROC
  time.sleep(0.2)
  assert _sandbox_processes() == []  # and the pid namespace took them all down


def test_fallback_without_namespaces_still_contains(layers):
  bare = Sandbox(SandboxLimits(timeout_s=2.0), SandboxPolicy(namespaces=False), workers=2)
  names = ["write_outside", "connect_listener", "kill_parent", "fork_bomb", "read_parent_environment"]
  names.append("os_exit_in_call")
  outcomes, leaks, _ = run_code_probes(bare, names=names)
  assert leaks == [] and not any(o.wrongly_rewarded for o in outcomes)


@pytest.mark.slow
@needs_humaneval
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


@pytest.mark.skipif(os.geteuid() != 0, reason="unprivileged runs take the user-namespace path already")
def test_user_namespace_path(tmp_path, monkeypatch, layers):
  """The path an unprivileged user takes (user namespace, no uid switch), exercised here as root."""
  if "mountns" not in layers:
    pytest.skip("no namespaces here")
  import rl_lm.rewards.code as code_lib

  patched = tmp_path / "sandbox_child.py"
  patched.write_text(Path(code_lib._CHILD).read_text().replace("root = os.geteuid() == 0", "root = False"))
  monkeypatch.setattr(code_lib, "_CHILD", str(patched))
  policy = SandboxPolicy(audit_hook=False, switch_uid=False)
  r = Sandbox(policy=policy).run(CodeJob(ADD, PROBE_TESTS, "add"))
  assert r.status == "passed" and "userns" in r.layers, r
  names = ["write_outside", "connect_listener", "kill_parent", "read_answer_key", "allocate_10gb"]
  outcomes, leaks, _ = run_code_probes(Sandbox(SandboxLimits(timeout_s=2.0), policy, workers=2), names=names)
  assert leaks == [] and not any(o.wrongly_rewarded for o in outcomes)
