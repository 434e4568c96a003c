"""Per-run cgroups for the code sandbox: CPU time a program cannot hide, memory bounded per run, nothing left behind.

Why. The sandbox masks a timeout as `overloaded` only when the host kept the program from a CPU, so it needs the
run's CPU time from a count the program cannot empty. /proc's per-thread counts lose the time of threads that have
exited and of children the kernel reaped itself (SIGCHLD ignored); a cgroup keeps every nanosecond spent by any
task that was ever in it. Likewise RLIMIT_AS bounds one process's mappings, not pages held in a memfd or a tmpfs,
nor the kernel's inodes and dentries: a memory cgroup charges all of them to the run, and its OOM killer stops the
run at the bound.

What is used, found once per process by `detect` (each choice confirmed by making and removing a trial group):
the CPU count from cgroup v1's cpuacct controller where it is mounted, else cgroup v2's `cpu.stat` (core to every
v2 group, no controller needed); the memory bound from v1's memory controller where it is mounted, else from v2's
when it is delegated to this process's cgroup. Where neither hierarchy lets this process make groups (not root,
no delegation, a read-only /sys/fs/cgroup), `Support` says so and the sandbox keeps its per-process limits.

Layout. Each run's groups sit beneath this process's own cgroup, named rl_lm-<pid>-<random>, so concurrent
processes never collide. v1: <cpuacct>/rl_lm-X holds the candidate and the checker (the tests' CPU is the run's
too), <memory>/rl_lm-X the candidate only (so a program cannot get the trusted checker OOM-killed and its run
masked). v2: rl_lm-X/{candidate,checker}, memory.max on the candidate's leaf; the parent's cpu.stat counts both.
A process joins its groups before it execs anything (`join_argv`: /bin/sh writes its own pid, then execs), and
children inherit cgroups at fork, so bwrap and everything under it are born inside. `RunGroups.close` kills what is
left (cgroup.kill on v2, SIGKILL to every member on v1), waits for the groups to empty and removes them. Groups
of a process that died without cleaning up are removed by the next one, once their owner is gone and they hold
no process.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import secrets
import signal
import time

PREFIX = "rl_lm-"
_PROCS = "cgroup.procs"
# Joins the cgroup.procs files given as "$1" (a count) and the arguments after it, then execs the rest.
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; n=$((n - 1)); shift; done; exec "$@"'
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Place:
  """Where runs' groups are made: this process's own cgroup in one hierarchy (its absolute path)."""

  version: int  # 1 or 2
  path: str


@dataclasses.dataclass(frozen=True)
class Support:
  """What this host gives the sandbox: where the CPU count and the memory bound come from (None: not here)."""

  cpu: Place | None = None
  memory: Place | None = None
  why: str = ""  # why a part is missing

  @property
  def layer(self) -> str | None:
    """The sandbox layer this stands for, e.g. "cgroup:v1(cpuacct,memory)"; None without cgroups."""
    parts: dict[int, list[str]] = {}
    if self.cpu is not None:
      parts.setdefault(self.cpu.version, []).append("cpuacct" if self.cpu.version == 1 else "cpu")
    if self.memory is not None:
      parts.setdefault(self.memory.version, []).append("memory")
    if not parts:
      return None
    return "cgroup:" + "+".join(f"v{v}({','.join(names)})" for v, names in sorted(parts.items(), reverse=True))


def parse_mounts(mountinfo: str) -> list[tuple[str, str, str, frozenset[str]]]:
  """(file-system type, mount point, root inside the hierarchy, super options) of each cgroup mount in mountinfo."""
  out = []
  for line in mountinfo.splitlines():
    left, sep, right = line.partition(" - ")
    fields, tail = left.split(), right.split()
    if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
      continue
    point = fields[4].replace("\\040", " ")
    out.append((tail[0], point, fields[3], frozenset(tail[2].split(","))))
  return out


def own_cgroups(proc_cgroup: str) -> dict[str, str]:
  """This process's cgroup per v1 controller (and "" for the v2 hierarchy), from /proc/self/cgroup."""
  out = {}
  for line in proc_cgroup.splitlines():
    parts = line.split(":", 2)
    if len(parts) != 3:
      continue
    hierarchy, controllers, path = parts
    if hierarchy == "0" and controllers == "":
      out[""] = path
    for name in controllers.split(","):
      if name:
        out[name] = path
  return out


def places(mountinfo: str, proc_cgroup: str) -> dict[str, Place]:
  """Where this process's own groups are, for "cpuacct" and "memory" (v1) and "v2", as far as the texts say."""
  own = own_cgroups(proc_cgroup)
  found: dict[str, Place] = {}
  for fstype, point, root, options in parse_mounts(mountinfo):
    for key in (("v2",) if fstype == "cgroup2" else tuple(c for c in ("cpuacct", "memory") if c in options)):
      path = own.get("" if key == "v2" else key)
      if key in found or path is None:
        continue
      rel = path if root == "/" else (path[len(root):] if path == root or path.startswith(root + "/") else None)
      if rel is not None:
        found[key] = Place(2 if key == "v2" else 1, os.path.normpath(point + "/" + rel.lstrip("/")))
  return found


def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def _write(path: str, value: str) -> None:
  with open(path, "w") as f:
    f.write(value)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _remove(path: str) -> bool:
  """rmdir of a group and its child groups (a group holding a process stays)."""
  try:
    for name in os.listdir(path):
      if os.path.isdir(os.path.join(path, name)):
        _remove(os.path.join(path, name))
    os.rmdir(path)
    return True
  except FileNotFoundError:
    return True
  except OSError:
    return False


def _clean_stale(place: Place) -> None:
  """Removes runs' groups that a dead process left beneath `place` (only empty ones: rmdir refuses the others)."""
  try:
    names = os.listdir(place.path)
  except OSError:
    return
  for name in names:
    pid = name[len(PREFIX):].split("-", 1)[0]
    if name.startswith(PREFIX) and pid.isdigit() and not _alive(int(pid)):
      _remove(os.path.join(place.path, name))


def _trial(place: Place, wanted: str, setup: str | None = None) -> str:
  """Makes and removes a trial group beneath `place`; "" when it worked and has `wanted`, else why not."""
  path = os.path.join(place.path, f"{PREFIX}{os.getpid()}-trial{secrets.token_hex(4)}")
  try:
    os.mkdir(path)
  except OSError as e:
    return f"cannot make a group in {place.path}: {e.strerror}"
  try:
    if setup is not None:
      _write(os.path.join(path, "cgroup.subtree_control"), setup)
      os.mkdir(os.path.join(path, "leaf"))
      path_wanted = os.path.join(path, "leaf", wanted)
    else:
      path_wanted = os.path.join(path, wanted)
    return "" if os.path.exists(path_wanted) else f"no {wanted} in {place.path}"
  except OSError as e:
    return f"cannot set up a group in {place.path}: {e.strerror}"
  finally:
    _remove(path)


def probe(mountinfo: str, proc_cgroup: str) -> Support:
  """What of the cgroups named by the two texts this process can use (tries each; cleans stale groups)."""
  found = places(mountinfo, proc_cgroup)
  for place in found.values():
    _clean_stale(place)
  why: list[str] = []
  cpu = memory = None
  v2 = found.get("v2")
  cpu_why = [f"no {key} hierarchy" for key in ("cpuacct", "v2") if key not in found]
  for key, wanted in (("cpuacct", "cpuacct.usage"), ("v2", "cpu.stat")):
    if key in found and cpu is None:
      err = _trial(found[key], wanted)
      cpu = found[key] if not err else None
      cpu_why += [err] if err else []
  why += cpu_why if cpu is None else []
  if "memory" in found:
    err = _trial(found["memory"], "memory.limit_in_bytes")
    memory = found["memory"] if not err else None
    why += [err] if err else []
  elif v2 is not None:
    try:
      delegated = "memory" in _read(os.path.join(v2.path, "cgroup.subtree_control")).split()
    except OSError:
      delegated = False
    err = _trial(v2, "memory.max", "+memory") if delegated else f"memory controller not delegated to {v2.path}"
    memory = v2 if not err else None
    why += [err] if err else []
  if not found:
    why = ["no cgroup hierarchy mounted"]
  return Support(cpu, memory, "; ".join(why))


@functools.cache
def detect() -> Support:
  """`probe` of this process's own mounts and cgroups, once per process."""
  try:
    return probe(_read("/proc/self/mountinfo"), _read("/proc/self/cgroup"))
  except OSError as e:
    return Support(why=f"cannot read /proc/self: {e.strerror}")


class RunGroups:
  """One run's cgroups (see the module docstring for the layout): made before its processes, removed after.

  Raises OSError when a group cannot be made (the sandbox reports that as its own failure); then nothing is left.
  """

  def __init__(self, support: Support, memory_bytes: int | None) -> None:
    self.name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    self.dirs: list[str] = []  # made, parents first
    self.joins: dict[str, list[str]] = {"candidate": [], "checker": []}
    self._cpu: tuple[int, str] | None = None  # (version, file)
    self._memory: tuple[int, str] | None = None  # (version, the candidate's memory group)
    self._thread_files: list[str] = []
    try:
      self._make(support, memory_bytes)
    except OSError:
      self.close()
      raise

  def _mkdir(self, path: str) -> str:
    os.mkdir(path)
    self.dirs.append(path)
    return path

  def _make(self, support: Support, memory_bytes: int | None) -> None:
    cpu, mem = support.cpu, support.memory if memory_bytes is not None else None
    v2 = next((p for p in (cpu, mem) if p is not None and p.version == 2), None)
    if v2 is not None:  # one group with a leaf per process: v2 allows processes only in leaves once memory is on
      top = self._mkdir(os.path.join(v2.path, self.name))
      if mem is not None and mem.version == 2:
        _write(os.path.join(top, "cgroup.subtree_control"), "+memory")
      for role in ("candidate", "checker"):
        leaf = self._mkdir(os.path.join(top, role))
        self.joins[role].append(os.path.join(leaf, _PROCS))
        self._thread_files.append(os.path.join(leaf, "cgroup.threads"))
      if cpu is not None and cpu.version == 2:
        self._cpu = (2, os.path.join(top, "cpu.stat"))
      if mem is not None and mem.version == 2:
        leaf = os.path.join(top, "candidate")
        _write(os.path.join(leaf, "memory.max"), str(memory_bytes))
        if os.path.exists(os.path.join(leaf, "memory.swap.max")):
          _write(os.path.join(leaf, "memory.swap.max"), "0")
        self._memory = (2, leaf)
    if cpu is not None and cpu.version == 1:
      group = self._mkdir(os.path.join(cpu.path, self.name))
      self.joins["candidate"].append(os.path.join(group, _PROCS))
      self.joins["checker"].append(os.path.join(group, _PROCS))
      self._cpu = (1, os.path.join(group, "cpuacct.usage"))
      self._thread_files.append(os.path.join(group, "tasks"))
    if mem is not None and mem.version == 1:
      group = self._mkdir(os.path.join(mem.path, self.name))
      _write(os.path.join(group, "memory.limit_in_bytes"), str(memory_bytes))
      if os.path.exists(os.path.join(group, "memory.memsw.limit_in_bytes")):  # memory + swap: no way round via swap
        try:
          _write(os.path.join(group, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        except OSError:
          pass  # swap accounting switched off: there is no swap to count
      self.joins["candidate"].append(os.path.join(group, _PROCS))
      self._memory = (1, group)

  def join_argv(self, role: str, argv: list[str]) -> list[str]:
    """`argv` run by a shell that first moves itself into the groups of `role` ("candidate" or "checker")."""
    files = self.joins[role]
    return ["/bin/sh", "-c", _JOIN, "sh", str(len(files)), *files, *argv] if files else list(argv)

  @property
  def counts_cpu(self) -> bool:
    return self._cpu is not None

  @property
  def bounds_memory(self) -> bool:
    return self._memory is not None

  def cpu_s(self) -> float | None:
    """CPU seconds spent so far by every task ever in the run's groups; None without a CPU count."""
    if self._cpu is None:
      return None
    try:
      text = _read(self._cpu[1])
      if self._cpu[0] == 1:
        return int(text) / 1e9
      return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6
    except (OSError, ValueError, KeyError):
      return None

  def threads(self) -> list[int]:
    """Thread ids of every task now in the run's CPU groups."""
    tids: list[int] = []
    for path in self._thread_files:
      try:
        tids += [int(x) for x in _read(path).split()]
      except (OSError, ValueError):
        continue
    return tids

  def memory_peak(self) -> int | None:
    """The most memory the candidate's group held at once (bytes); None without a memory group or a peak file."""
    if self._memory is None:
      return None
    name = "memory.max_usage_in_bytes" if self._memory[0] == 1 else "memory.peak"
    try:
      return int(_read(os.path.join(self._memory[1], name)))
    except (OSError, ValueError):
      return None

  def oom_kills(self) -> int:
    """How many processes the memory bound's OOM killer has killed in this run."""
    if self._memory is None:
      return 0
    name = "memory.oom_control" if self._memory[0] == 1 else "memory.events"
    try:
      fields = dict(line.split() for line in _read(os.path.join(self._memory[1], name)).splitlines())
      return int(fields.get("oom_kill", 0))
    except (OSError, ValueError):
      return 0

  def _members(self, path: str) -> list[int]:
    try:
      return [int(x) for x in _read(os.path.join(path, _PROCS)).split()]
    except (OSError, ValueError):
      return []

  def close(self, timeout_s: float = 10.0) -> None:
    """Kills every process left in the run's groups, waits until they are empty and removes them; never raises."""
    deadline = time.monotonic() + timeout_s
    for path in self.dirs:
      kill = os.path.join(path, "cgroup.kill")
      if os.path.exists(kill):
        try:
          _write(kill, "1")
        except OSError:
          pass
    while True:
      members = {pid for path in self.dirs for pid in self._members(path)}
      if not members or time.monotonic() > deadline:
        break
      for pid in sorted(members):  # v1 has no cgroup.kill; a member's fork can only land in the group, seen next
        # round. Parents (lower pids) first: a shell whose child dies first may exit on its own before its kill.
        try:
          os.kill(pid, signal.SIGKILL)
        except OSError:
          pass
      time.sleep(0.01)
    for path in reversed(self.dirs):
      while not _remove(path) and time.monotonic() < deadline:
        time.sleep(0.02)
      if os.path.exists(path):
        _log.warning("code sandbox: could not remove the cgroup %s", path)
    self.dirs = []
