"""The code sandbox's overload rule and per-run memory bound (issue 33): the run's cgroups, and what they close.

A program that times out is masked as `overloaded` only on counts it cannot falsify: the CPU time of its run's
cgroup (exited threads and self-reaped children included) and per-thread waits it cannot choose (the seccomp
filter refuses every priority and affinity change). Each overload disguise of `OVERLOAD_DISGUISES` must score 0
through the code reward, the Python tool and evaluation; it prints its own count of its CPU time, which holds the
sandbox's count to the truth on any host (a disguise may be masked only if it really got under half its budget).
Memory: a memfd flood and an empty-file flood end at the run's bound (or the tmpfs's inode cap), and leave nothing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
import time

import pytest

from rl_lm.envs import tools
from rl_lm.evaluation import correct_from_reward, evaluate
from rl_lm.rewards import cgroup
from rl_lm.rewards.audit import OVERLOAD_DISGUISES, PROBE_TESTS
from rl_lm.rewards.code import CodeJob, CodeReward, Sandbox, SandboxLimits, SandboxResult
from rl_lm.tasks.base import Problem

BUDGET = 1.0
COUNT = "def check(candidate):\n  n = candidate()\n  assert n < 0, n\n"  # fails with the program's number


class Recording(Sandbox):
  """A sandbox that keeps its last result, so that a test can see through the reward or tool that used it."""

  last: SandboxResult | None = None

  def run(self, job: CodeJob) -> SandboxResult:
    self.last = super().run(job)
    return self.last


@pytest.fixture(scope="module")
def recording():
  return Recording(SandboxLimits(timeout_s=BUDGET, cpu_s=30))  # the deadline, not RLIMIT_CPU, ends the disguises


@pytest.fixture(scope="module")
def jailed_groups():
  sandbox = Sandbox(SandboxLimits(timeout_s=5.0))
  if not (sandbox.jailed and sandbox.cgroups.cpu and sandbox.cgroups.memory):
    pytest.skip(f"needs the jail and cgroups for CPU and memory ({sandbox.cgroups.why or 'no jail'})")
  return sandbox


def _own_groups_left() -> list[str]:
  support = cgroup.detect()
  left = []
  for place in {p for p in (support.cpu, support.memory) if p is not None}:
    left += [n for n in os.listdir(place.path) if n.startswith(f"{cgroup.PREFIX}{os.getpid()}-")]
  return left


def _program_cpu(stdout: str) -> float:
  """The disguise's own last count of the CPU time it spent (exited threads and reaped children included)."""
  values = re.findall(r"cpu=([0-9.]+)", stdout)
  assert values, stdout[-300:]
  return float(values[-1])


def _check_scored(result: SandboxResult, budget: float) -> float:
  """A disguise times out (a verdict: scored 0); it is masked only if it truly got under half its budget of CPU,
  by its own count, which the run's count must not be below. Returns its own count (0 if it printed none: a host
  so loaded that the interpreter never reached the disguise; then the run's count must show the starving)."""
  assert result.status in ("timeout", "overloaded"), result
  if "cpu=" not in result.stdout:
    assert result.status == "timeout" or (result.cpu_s is not None and result.cpu_s < budget / 2), result
    return 0.0
  spent = _program_cpu(result.stdout)
  if result.cpu_s is not None:
    # The run's count is read at the deadline, then the program is killed; its own last tally may be printed in
    # between, on up to every CPU, so it may exceed the count by at most the CPUs times the time the run took past
    # its budget (a loaded host makes that gap tens of ms: 1.284 s against 1.252 once). A count that missed the
    # program's exited threads or reaped children misses far more (0.71 s counted of 1.59 s spent, before cgroups).
    after = (os.cpu_count() or 1) * max(0.0, result.duration_s - budget)
    assert result.cpu_s >= spent - 0.01 - after, (result.cpu_s, spent, result.duration_s)
  if result.status == "overloaded":
    assert spent < budget / 2, (f"masked though it spent {spent:.2f}s of CPU in {budget:g}s", result.detail)
  return spent


# --- the cgroups -----------------------------------------------------------------------------------

HYBRID_MOUNTS = """\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUPS = "4:memory:/process_api/ab12\n2:cpuacct:/\n1:cpu:/\n0::/\n"


@pytest.mark.parametrize(
  ("mounts", "cgroups", "expected"),
  [
    (HYBRID_MOUNTS, HYBRID_CGROUPS, {
      "cpuacct": cgroup.Place(1, "/sys/fs/cgroup/cpuacct"), "v2": cgroup.Place(2, "/sys/fs/cgroup/unified"),
      "memory": cgroup.Place(1, "/sys/fs/cgroup/memory/process_api/ab12"),
    }),
    (  # pure v2 (systemd)
      "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n",
      "0::/user.slice/user-0.slice/session-3.scope\n",
      {"v2": cgroup.Place(2, "/sys/fs/cgroup/user.slice/user-0.slice/session-3.scope")},
    ),
    (  # a container's view: its cgroup bound at /sys/fs/cgroup
      "700 690 0:26 /docker/c0ffee /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n", "0::/docker/c0ffee\n",
      {"v2": cgroup.Place(2, "/sys/fs/cgroup")},
    ),
    (  # v1 with cpu and cpuacct mounted together
      "25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n", "3:cpu,cpuacct:/user.slice\n",
      {"cpuacct": cgroup.Place(1, "/sys/fs/cgroup/cpu,cpuacct/user.slice")},
    ),
    ("22 1 0:5 / /proc rw - proc proc rw\n", "0::/\n", {}),  # no cgroup file system
  ],
)
def test_where_a_runs_groups_go(mounts, cgroups, expected):
  assert cgroup.places(mounts, cgroups) == expected


def test_the_layer_names_the_accounting_in_force():
  v1, v2 = cgroup.Place(1, "/a"), cgroup.Place(2, "/b")
  assert cgroup.Support(v1, v1).layer == "cgroup:v1(cpuacct,memory)"
  assert cgroup.Support(v2, v2).layer == "cgroup:v2(cpu,memory)"
  assert cgroup.Support(v2, v1).layer == "cgroup:v2(cpu)+v1(memory)"
  assert cgroup.Support(v1, None).layer == "cgroup:v1(cpuacct)"
  assert cgroup.Support(None, None, "no cgroup hierarchy mounted").layer is None


def test_a_run_leaves_no_group_and_kills_what_it_left():
  """Processes still in a run's groups when it ends (here a shell and its background child) are killed and the
  groups removed; groups a dead process left behind are removed by the next probe, a living owner's are not."""
  support = cgroup.detect()
  if support.cpu is None:
    pytest.skip(f"no cgroup CPU count here: {support.why}")
  groups = cgroup.RunGroups(support, 64 << 20)
  argv = groups.join_argv("candidate", ["/bin/sh", "-c", "sleep 60 & sleep 60"])
  proc = subprocess.Popen(argv, start_new_session=True)
  deadline = time.monotonic() + 10
  while len(groups.threads()) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
  assert proc.pid in groups.threads()
  groups.close()
  # Killed, or (a loaded host, where its child's kill landed first) exited with its killed child's status.
  assert proc.wait(timeout=10) in (-signal.SIGKILL, 128 + signal.SIGKILL)
  assert _own_groups_left() == []
  dead = subprocess.Popen(["true"])
  dead.wait()
  stale, alive = (os.path.join(support.cpu.path, f"{cgroup.PREFIX}{pid}-test") for pid in (dead.pid, os.getpid()))
  for path in (stale, alive):
    os.mkdir(path)
  try:
    with open("/proc/self/mountinfo") as m, open("/proc/self/cgroup") as c:
      cgroup.probe(m.read(), c.read())
    assert not os.path.exists(stale) and os.path.exists(alive)
  finally:
    for path in (stale, alive):
      if os.path.exists(path):
        os.rmdir(path)


# --- the overload rule -----------------------------------------------------------------------------


def test_the_runs_cpu_count_includes_exited_threads_and_self_reaped_children(jailed_groups):
  """The program burns CPU only in threads that exit and in children the kernel reaps itself (SIGCHLD ignored),
  where /proc's per-thread and cutime counts never see it, and prints what it spent; the run's count holds it."""
  program = textwrap.dedent("""
    import os, signal, threading, time
    def burn():
      end = time.thread_time() + 0.03
      while time.thread_time() < end:
        pass
    def add(a, b):
      start = time.process_time()
      r, w = os.pipe()
      signal.signal(signal.SIGCHLD, signal.SIG_IGN)
      for _ in range(8):
        t = threading.Thread(target=burn)
        t.start()
        t.join()
        if os.fork() == 0:
          burn()
          os.write(w, b'%.4f\\n' % time.process_time())
          os._exit(0)
      os.close(w)
      children = sum(float(x) for x in os.fdopen(r).read().split())  # to the end of file: when all have exited
      print('cpu=%.3f' % (time.process_time() - start + children), flush=True)
      return a + b
  """)
  r = jailed_groups.run(CodeJob(program, PROBE_TESTS, "add"))
  assert r.status == "passed", r
  spent = _program_cpu(r.stdout)
  assert spent >= 0.45 and r.cpu_s >= spent, (r.cpu_s, spent)


def test_the_jail_refuses_every_way_to_wait_by_choice(jailed_groups):
  """nice, SCHED_IDLE/BATCH, sched_setparam, sched_setattr, affinity, core scheduling: EPERM; the autogroup's nice:
  a read-only /proc. The thread's priority and CPUs are unchanged afterwards."""
  program = textwrap.dedent("""
    import ctypes, os, platform
    libc = ctypes.CDLL(None, use_errno=True)
    NR_SETATTR = {'x86_64': 314, 'aarch64': 274}[platform.machine()]
    def errno_of(call):
      try:
        call()
      except OSError as e:
        return e.errno
      return 0
    def raw(rc):
      return ctypes.get_errno() if rc == -1 else 0
    def probe():
      cpus = os.sched_getaffinity(0)
      attr = (ctypes.c_uint32 * 14)(56, 5)  # size, SCHED_IDLE
      out = {
        'nice': errno_of(lambda: os.nice(1)),
        'setpriority': errno_of(lambda: os.setpriority(os.PRIO_PROCESS, 0, 19)),
        'idle': errno_of(lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))),
        'batch': errno_of(lambda: os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))),
        'setparam': errno_of(lambda: os.sched_setparam(0, os.sched_param(0))),
        'affinity': errno_of(lambda: os.sched_setaffinity(0, {min(cpus)})),
        'setattr': raw(libc.syscall(NR_SETATTR, 0, attr, 0)),
        'core': raw(libc.prctl(62, 1, 0, 0, 0)),
        'autogroup': errno_of(lambda: open('/proc/self/autogroup', 'w').write('19')),
      }
      stat = open('/proc/thread-self/stat').read().rsplit(')', 1)[1].split()
      out['unchanged'] = (int(stat[16]), int(stat[38]), os.sched_getaffinity(0) == cpus)
      return out
  """)
  tests = "def check(candidate):\n  got = candidate()\n  assert got == EXPECTED, got\n"
  expected = {k: 1 for k in ("nice", "setpriority", "idle", "batch", "setparam", "affinity", "setattr", "core")}
  expected |= {"autogroup": 30, "unchanged": (0, 0, True)}  # EROFS
  r = jailed_groups.run(CodeJob(program, f"EXPECTED = {expected!r}\n" + tests, "probe"))
  assert r.status == "passed", r


PROBLEM = Problem("p", "", "", task="humaneval", metadata={"tests": PROBE_TESTS, "entry_point": "add", "prompt": ""})


@pytest.mark.parametrize("name", sorted(OVERLOAD_DISGUISES))
def test_an_overload_disguise_scores_zero_through_the_code_reward(recording, name):
  result = CodeReward(sandbox=recording)(PROBLEM, OVERLOAD_DISGUISES[name])
  spent = _check_scored(recording.last, BUDGET)
  if recording.last.status == "timeout":
    assert (result.score, result.valid, result.status) == (0.0, True, "timeout")
  print(f"{name}: {recording.last.status}, its CPU {spent:.2f}s, counted {recording.last.cpu_s}s of {BUDGET:g}s")


@pytest.mark.parametrize("name", ["overload_disguise_thread_churn", "overload_disguise_self_reaped_children"])
def test_an_overload_disguise_is_a_timeout_observation_of_the_python_tool(recording, name):
  """Never ToolInfraError (which masks the episode), unless the host truly starved it."""
  tool = tools.PythonTool(sandbox=recording)
  try:
    observation = tool(OVERLOAD_DISGUISES[name] + "\nadd(1, 2)\n")
  except tools.ToolInfraError:
    observation = None
  _check_scored(recording.last, BUDGET)
  if recording.last.status == "timeout":
    assert observation is not None and observation.error and observation.output.endswith("error: timeout")


def test_an_overload_disguise_counts_in_pass_at_k(recording):
  disguise = OVERLOAD_DISGUISES["overload_disguise_thread_churn"]
  result = evaluate([PROBLEM], lambda prompts, n: [[disguise] * n for _ in prompts],
                    correct_from_reward(CodeReward(sandbox=recording)), n=1)
  _check_scored(recording.last, BUDGET)
  if recording.last.status == "timeout":
    assert (result.valid_counts, result.verifier_errors, result.pass_at_k) == ([1], 0, {1: 0.0})


# --- memory ----------------------------------------------------------------------------------------


def _check_bounded(r: SandboxResult, bound: int) -> None:
  """The run ended at its memory bound: the peak reached it (so the flood was real) and never passed it; nothing
  of the run is left on the host."""
  assert r.peak_memory_bytes is not None and 0.8 * bound < r.peak_memory_bytes <= bound, (r.peak_memory_bytes, bound)
  assert _own_groups_left() == []
  with open("/proc/self/mountinfo") as f:
    assert "rl_lm_sandbox" not in f.read()
  print(f"peak {r.peak_memory_bytes / 2**20:.1f} MiB of a bound of {bound / 2**20:.0f} MiB: {r.status}, {r.detail}")


def test_a_memfd_flood_ends_at_the_runs_memory_bound(jailed_groups):
  """Four processes each write 40 memfds of 8 MiB (under RLIMIT_FSIZE and RLIMIT_NOFILE) and never map them:
  RLIMIT_AS counts none of it, and per-process limits would allow all 1.25 GiB; the run's bound (memory_bytes +
  disk_bytes = 320 MiB) stops them together."""
  program = textwrap.dedent("""
    import os, time
    def flood():
      fds, block = [], b'x' * (1 << 20)
      for _ in range(40):
        fds.append(os.memfd_create('flood'))
        for _ in range(8):
          os.write(fds[-1], block)
    def add(a, b):
      for _ in range(3):
        if os.fork() == 0:
          flood()
          time.sleep(60)
          os._exit(0)
      flood()
      return a + b
  """)
  limits = SandboxLimits(timeout_s=20.0, memory_bytes=256 << 20, disk_bytes=64 << 20)
  r = Sandbox(limits).run(CodeJob(program, PROBE_TESTS, "add"))
  assert r.status in ("memory_limit", "runtime_error"), r
  _check_bounded(r, limits.run_memory())


def test_an_empty_file_flood_ends_at_the_inode_cap(jailed_groups):
  program = "import os\ndef f():\n  n = 0\n  try:\n    while True:\n      os.close(os.open(str(n), os.O_CREAT))\n"
  program += "      n += 1\n  except OSError:\n    return n\n"
  r = jailed_groups.run(CodeJob(program, COUNT, "f"))
  if not any(x.endswith(" files") for x in r.layers):
    pytest.skip("no inode cap here (not root, or no unshare/mount)")
  assert r.status == "failed" and int(r.detail.rsplit(" ", 1)[1]) < jailed_groups.limits.max_files, r
  assert r.peak_memory_bytes < 64 << 20, r.peak_memory_bytes  # 16,384 inodes and dentries: about 16 MiB


def test_an_empty_file_flood_without_the_cap_ends_at_the_runs_memory_bound(jailed_groups):
  """The kernel's inodes and dentries for the files are charged to the run too (about 1 KiB a file)."""
  program = "import os\ndef f():\n  n = 0\n  while True:\n    os.close(os.open(str(n), os.O_CREAT))\n    n += 1\n"
  limits = SandboxLimits(timeout_s=20.0, max_files=1 << 30, run_memory_bytes=64 << 20)
  r = Sandbox(limits).run(CodeJob(program, COUNT, "f"))
  assert r.status in ("memory_limit", "runtime_error"), r
  _check_bounded(r, limits.run_memory())
