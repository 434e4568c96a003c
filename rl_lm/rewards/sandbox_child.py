"""The harness that runs inside the code sandbox (see `rl_lm.rewards.code` for the design).

Started as `python -I -S sandbox_child.py candidate|checker`, it reads a JSON config from stdin and
plays one of two roles. It imports nothing from rl_lm and only the standard library, so it also works
where the project is not importable.

candidate: isolates itself (namespaces, read-only file system, unprivileged uid, rlimits, audit hook),
  then runs the untrusted program and serves calls to its entry point: decoded arguments in,
  encoded return value (or exception name) out. Everything it sends after the program starts is
  untrusted and can only lower the score.
checker: runs the trusted prelude and tests, with each entry point replaced by a proxy that calls the
  candidate process. Only data crosses (None, bool, int, float, complex, str, bytes, list, tuple,
  dict, set, frozenset), decoded strictly into plain built-in objects, so the candidate cannot hand
  the tests an object whose `__eq__` lies. After `check` returns it writes the pass marker, with the
  parent's nonce, to a pipe only it holds.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import signal
import struct
import sys

_HEADER = struct.Struct(">I")
_MAX_DEPTH = 200


class ProtocolError(Exception):
  """A malformed or oversized message on a sandbox pipe."""


class CandidateDied(BaseException):  # noqa: N818 - BaseException so that `except Exception` in tests cannot swallow it
  """The candidate process closed its pipes (exited, crashed or was killed)."""


class Unencodable(Exception):
  """A value of a type that cannot cross the sandbox boundary."""


# --- framing and data encoding -------------------------------------------------------------------


def send(fd: int, obj: object) -> None:
  """Writes one length-prefixed JSON message."""
  data = json.dumps(obj, separators=(",", ":")).encode()
  view = memoryview(_HEADER.pack(len(data)) + data)
  while view:
    view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes | None:
  chunks, got = [], 0
  while got < n:
    chunk = os.read(fd, min(n - got, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def recv(fd: int, max_bytes: int) -> object:
  """Reads one message; raises CandidateDied on end of file and ProtocolError on a bad message."""
  header = _read_exact(fd, _HEADER.size)
  if header is None:
    raise CandidateDied("pipe closed")
  (n,) = _HEADER.unpack(header)
  if n > max_bytes:
    raise ProtocolError(f"message of {n} bytes exceeds {max_bytes}")
  data = _read_exact(fd, n)
  if data is None:
    raise CandidateDied("pipe closed mid-message")
  try:
    return json.loads(data)
  except (ValueError, RecursionError) as e:
    raise ProtocolError(f"undecodable message: {e}") from None


def encode(x: object, depth: int = 0) -> object:
  """JSON-able form of plain data; raises Unencodable for anything else."""
  if depth > _MAX_DEPTH:
    raise Unencodable("value nested too deeply")
  t = type(x)
  if x is None or t in (bool, str, int):
    return x
  if t is float:
    return x if x == x and x not in (float("inf"), float("-inf")) else {"x": repr(x)}
  if t is list:
    return [encode(v, depth + 1) for v in x]
  if t is tuple:
    return {"t": [encode(v, depth + 1) for v in x]}
  if t is dict:
    return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
  if t is set:
    return {"s": [encode(v, depth + 1) for v in x]}
  if t is frozenset:
    return {"f": [encode(v, depth + 1) for v in x]}
  if t is bytes:
    return {"y": x.hex()}
  if t is complex:
    return {"c": [encode(x.real, depth + 1), encode(x.imag, depth + 1)]}
  for base in (bool, int, float, str, bytes, tuple, list, dict, frozenset, set, complex):
    if isinstance(x, base):  # a subclass: send the plain value, never the subclass's behaviour
      return encode(base(x), depth)
  raise Unencodable(f"a {t.__name__} cannot cross the sandbox boundary (only plain data can)")


def decode(x: object, depth: int = 0) -> object:
  """Inverse of `encode`, strict: builds only plain built-in objects; raises ProtocolError otherwise."""
  if depth > _MAX_DEPTH:
    raise ProtocolError("value nested too deeply")
  t = type(x)
  if x is None or t in (bool, str, int, float):
    return x
  if t is list:
    return [decode(v, depth + 1) for v in x]
  if t is not dict or len(x) != 1:
    raise ProtocolError(f"bad value of type {t.__name__}")
  ((tag, v),) = x.items()
  try:
    if tag == "x" and v in ("nan", "inf", "-inf"):
      return float(v)
    if tag == "y" and type(v) is str:
      return bytes.fromhex(v)
    if type(v) is not list:
      raise ProtocolError(f"bad payload for tag {tag!r}")
    items = [decode(e, depth + 1) for e in v]
    if tag == "t":
      return tuple(items)
    if tag == "s":
      return set(items)
    if tag == "f":
      return frozenset(items)
    if tag == "c" and len(items) == 2 and all(type(e) in (int, float) for e in items):
      return complex(items[0], items[1])
    if tag == "d" and all(type(p) is list and len(p) == 2 for p in items):
      return {k: val for k, val in items}
  except (TypeError, ValueError) as e:  # unhashable set member or dict key, bad hex
    raise ProtocolError(f"bad value for tag {tag!r}: {e}") from None
  raise ProtocolError(f"unknown tag {tag!r}")


# --- isolation -----------------------------------------------------------------------------------

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
_MS = {"ro": 1, "nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
_MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38


def _mount(libc: object, src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
  import ctypes

  enc = lambda s: None if s is None else s.encode()
  if libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"mount({src}, {target}, flags={flags:#x}): {os.strerror(err)}")


def _unescape(field: str) -> str:
  return field.encode().decode("unicode_escape")  # mountinfo escapes space, tab, newline, backslash as \ooo


def _traversable_by_others(path: str) -> str | None:
  """The first ancestor of `path` that other users cannot search, or None."""
  probe = "/"
  for part in path.strip("/").split("/"):
    probe = os.path.join(probe, part)
    if not os.stat(probe).st_mode & 0o001:
      return probe
  return None


def _setup_mounts(libc: object, cfg: dict, needed: list[str], expose: bool) -> list[str]:
  """Private mount tree: hidden folders, the interpreter reachable, everything read-only but the workdir."""
  layers = []
  work = cfg["workdir"]
  _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
  _mount(libc, work, work, None, _MS_BIND)
  for path in cfg.get("hide", []):
    keep = [p for p in needed + [work] if p == path or p.startswith(path.rstrip("/") + "/")]
    if os.path.isdir(path) and not keep:
      _mount(libc, "tmpfs", path, "tmpfs", _MS["nosuid"] | _MS["nodev"] | _MS["ro"], "size=4k,mode=0755")
      layers.append(f"hide:{path}")
  if expose:  # an unprivileged uid must still reach the interpreter's library under e.g. /root (0700)
    prefix = needed[0]
    blocked = _traversable_by_others(prefix)
    if blocked is not None:
      stage = cfg["stage_dir"]
      _mount(libc, prefix, stage, None, _MS_BIND | _MS_REC)
      _mount(libc, "tmpfs", blocked, "tmpfs", _MS["nosuid"] | _MS["nodev"], "size=64k,mode=0755")
      old = os.umask(0o022)
      os.makedirs(prefix, exist_ok=True)
      os.umask(old)
      _mount(libc, stage, prefix, None, _MS_MOVE)
      layers.append(f"expose:{prefix}")
  failed = 0
  with open("/proc/self/mountinfo") as f:
    entries = [line.split() for line in f]
  for fields in entries:
    target = _unescape(fields[4])
    if target == work:
      continue
    flags = _MS_BIND | _MS_REMOUNT | _MS["ro"]
    for opt in fields[5].split(","):
      flags |= _MS.get(opt, 0)
    try:
      _mount(libc, None, target, None, flags)
    except OSError:
      failed += 1
  layers.append(f"readonly-fs({len(entries) - 1 - failed}/{len(entries) - 1})")
  return layers


def _supervise(pid: int) -> None:
  """Outside the new pid namespace: waits for the sandboxed process and exits with its status.

  SIGTERM (from the parent, when the verdict is in) kills the sandboxed process, the init of its pid
  namespace, which takes every process in the namespace with it; this process then reaps it.
  """

  def on_term(signum: int, frame: object) -> None:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass

  signal.signal(signal.SIGTERM, on_term)
  while True:
    try:
      _, status = os.waitpid(pid, 0)
      break
    except ChildProcessError:
      os._exit(70)
  code = os.waitstatus_to_exitcode(status)
  os._exit(code if code >= 0 else 128 - code)


def _count_own_processes() -> int:
  uid, n = os.getuid(), 0
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        if os.stat(f"/proc/{name}").st_uid == uid:
          n += 1
      except OSError:
        pass
  return n


def _set_limits(cfg: dict, nproc: int | None) -> None:
  lim = cfg["limits"]
  pairs = [
    (resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1)),
    (resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"])),
    (resource.RLIMIT_FSIZE, (lim["file_size_bytes"], lim["file_size_bytes"])),
    (resource.RLIMIT_NOFILE, (lim["open_files"], lim["open_files"])),
    (resource.RLIMIT_CORE, (0, 0)),
  ]
  if nproc is not None:
    pairs.append((resource.RLIMIT_NPROC, (nproc, nproc)))
  for which, value in pairs:
    resource.setrlimit(which, value)


def isolate(cfg: dict, keep_fds: tuple[int, ...]) -> list[str]:
  """Applies every isolation layer the kernel permits; may fork (the parent half never returns)."""
  import ctypes

  policy, layers = cfg["policy"], []
  libc = ctypes.CDLL(None, use_errno=True)
  root = os.geteuid() == 0
  uid = cfg.get("uid")
  switch = bool(root and uid and policy["switch_uid"])
  stdlib = os.path.dirname(os.__file__)
  needed = [sys.base_prefix, stdlib]
  in_ns = False
  if policy["namespaces"]:
    real_uid, real_gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | (0 if root else _CLONE_NEWUSER)
    if libc.unshare(flags) == 0:
      in_ns = True
      if not root:  # map ourselves to root of the new user namespace, to be allowed to mount
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {real_uid} 1"), ("gid_map", f"0 {real_gid} 1")):
          with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
        layers.append("userns")
      layers += ["netns", "pidns", "mountns"]
      try:
        layers += _setup_mounts(libc, cfg, needed, expose=switch)
      except OSError as e:
        layers.append(f"mounts-incomplete({e.strerror})")
    else:
      layers.append(f"no-namespaces({os.strerror(ctypes.get_errno())})")
  if in_ns:
    pid = os.fork()
    if pid:
      for fd in keep_fds:
        os.close(fd)
      _supervise(pid)
    try:  # a /proc that shows only this namespace's processes
      _mount(libc, "proc", "/proc", "proc", _MS["nosuid"] | _MS["nodev"] | _MS["noexec"])
      layers.append("private-proc")
    except OSError:
      pass
  if switch and _traversable_by_others(stdlib) is not None:
    switch = False  # the unprivileged uid could not import the standard library
  nproc = cfg["limits"]["max_processes"]
  if not (switch or (in_ns and not root)):
    nproc = None if root else _count_own_processes() + nproc
  _set_limits(cfg, nproc)
  layers.append("rlimits" + ("+nproc" if nproc is not None else ""))
  if switch:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    layers.append("uid")
  if in_ns:
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
  libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  os.chdir(cfg["workdir"])  # re-enter through the writable bind mount
  del libc
  for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
    del sys.modules[name]
  return layers


# --- audit hook ----------------------------------------------------------------------------------

_DENY = frozenset(
  {
    "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "signal.pthread_kill", "subprocess.Popen", "pty.spawn", "resource.setrlimit", "resource.prlimit",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "os.chroot",
    "cpython.PyInterpreterState_New", "syslog.openlog", "webbrowser.open",
  }
)
_PATH_EVENTS = {
  "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1, "os.truncate": 1, "os.utime": 1,
  "os.rename": 2, "os.link": 2, "os.symlink": 2, "shutil.rmtree": 1, "shutil.copyfile": 2, "shutil.move": 2,
  "shutil.copytree": 2, "os.chflags": 1, "os.setxattr": 1, "os.removexattr": 1, "os.mkfifo": 1, "os.mknod": 1,
}
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_testcapi"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def install_audit_hook(workdir: str, hidden: list[str]) -> None:
  """Denies network, process creation, signals, ctypes and file changes outside `workdir` (defence in depth)."""
  realpath, fsdecode, getpid = os.path.realpath, os.fsdecode, os.getpid
  work = realpath(workdir)
  hidden = [realpath(h) for h in hidden]
  busy = [False]

  def within(path: str, roots: list[str]) -> bool:
    p = realpath(path)
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)

  def deny(event: str, detail: object = "") -> None:
    raise PermissionError(f"sandbox: {event} {detail!s:.200} is not allowed")

  def hook(event: str, args: tuple) -> None:
    if busy[0]:
      return
    if event in _DENY or event.startswith(("socket.", "ctypes.", "_ctypes.")):
      deny(event)
    if event == "import" and args and str(args[0]).split(".")[0] in _BLOCKED_MODULES:
      raise ImportError(f"sandbox: importing {args[0]} is not allowed")
    if event != "open" and event not in _PATH_EVENTS:
      return
    busy[0] = True
    try:
      if event == "open":
        path, mode, flags = args
        if isinstance(path, int):
          return
        path = fsdecode(path)
        writing = bool(flags & _WRITE_FLAGS) or any(c in (mode or "") for c in "wax+")
        if writing and not within(path, [work]):
          deny("writing", path)
        real = realpath(path)
        if within(real, hidden):
          deny("reading", path)
        parts = real.split("/")
        if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and int(parts[2]) != getpid():
          deny("reading", path)
      else:
        for path in args[: _PATH_EVENTS[event]]:
          if isinstance(path, (str, bytes, os.PathLike)) and not within(fsdecode(path), [work]):
            deny(event, path)
    finally:
      busy[0] = False

  sys.addaudithook(hook)


# --- roles ---------------------------------------------------------------------------------------


def _describe(e: BaseException) -> str:
  try:
    return f"{type(e).__name__}: {e}"[:2000]
  except BaseException:  # a hostile __str__
    return type(e).__name__


def candidate_main(cfg: dict) -> None:
  """Runs the untrusted program and serves calls to its entry points."""
  call_fd, reply_fd, max_bytes = cfg["call_fd"], cfg["reply_fd"], cfg["limits"]["max_message_bytes"]
  try:
    code = compile(cfg["program"], "<candidate>", "exec")
  except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as e:
    send(reply_fd, {"t": "layers", "layers": []})
    send(reply_fd, {"t": "load", "status": "syntax_error", "detail": _describe(e)})
    return
  layers = isolate(cfg, (call_fd, reply_fd))
  if cfg["policy"]["audit_hook"]:
    install_audit_hook(cfg["workdir"], cfg.get("hide", []))
    layers.append("audit-hook")
  send(reply_fd, {"t": "layers", "layers": layers})
  cfg = {"entry_points": cfg["entry_points"]}  # drop everything the program need not see
  ns = {"__name__": "__sandbox__", "__builtins__": builtins}
  try:
    exec(code, ns)
  except BaseException as e:  # noqa: B036 - SystemExit and friends are failures of the program
    status = "memory_limit" if isinstance(e, MemoryError) else "runtime_error"
    send(reply_fd, {"t": "load", "status": status, "detail": _describe(e)})
    return
  send(reply_fd, {"t": "ready"})
  while True:
    try:
      msg = recv(call_fd, max_bytes)
    except (CandidateDied, ProtocolError):
      return
    if not isinstance(msg, dict) or msg.get("t") != "call":
      return
    try:
      fn = ns.get(msg["name"])
      if not callable(fn):
        raise NameError(f"the program defines no function {msg['name']!r}")
      value = fn(*decode(msg["args"]), **decode(msg["kwargs"]))
      reply = {"t": "ret", "value": encode(value)}
    except BaseException as e:  # noqa: B036
      reply = {"t": "exc", "type": type(e).__name__, "detail": _describe(e)}
    send(reply_fd, reply)


class _Proxy:
  """Stands for the candidate's function inside the checker: a call is a round trip over the pipes."""

  def __init__(self, name: str, link: dict) -> None:
    self._name, self._link = name, link

  def __repr__(self) -> str:
    return f"<sandboxed function {self._name}>"

  def __call__(self, *args: object, **kwargs: object) -> object:
    link = self._link
    if link["dead"]:
      raise CandidateDied("candidate process is gone")
    try:
      message = {"t": "call", "name": self._name, "args": encode(list(args)), "kwargs": encode(dict(kwargs))}
    except Unencodable as e:
      link["unsupported"] = str(e)
      raise CandidateDied(f"test passes an argument the sandbox cannot carry: {e}") from None
    try:
      send(link["call_fd"], message)
      reply = recv(link["reply_fd"], link["max_bytes"])
    except (OSError, CandidateDied):
      link["dead"] = True
      raise CandidateDied("candidate process is gone") from None
    except ProtocolError as e:
      link["dead"], link["protocol"] = True, str(e)
      raise CandidateDied(str(e)) from None
    if not isinstance(reply, dict):
      link["dead"], link["protocol"] = True, "reply is not a message"
      raise CandidateDied("bad reply")
    if reply.get("t") == "ret":
      try:
        return decode(reply.get("value"))
      except ProtocolError as e:
        link["dead"], link["protocol"] = True, str(e)
        raise CandidateDied(str(e)) from None
    if reply.get("t") == "exc":
      raise _exception(str(reply.get("type")), str(reply.get("detail", ""))[:2000])
    link["dead"], link["protocol"] = True, f"unexpected message {str(reply.get('t'))[:40]!r}"
    raise CandidateDied("bad reply")


def _exception(name: str, detail: str) -> BaseException:
  """A plain built-in exception standing for one the candidate raised, tagged as coming from it."""
  cls = getattr(builtins, name, None)
  if not (isinstance(cls, type) and issubclass(cls, Exception)):
    cls = RuntimeError
  try:
    exc = cls(detail)
  except Exception:
    exc = RuntimeError(detail)
  exc._rl_lm_from_candidate = True
  return exc


def checker_main(cfg: dict) -> None:
  """Runs the trusted tests against proxies of the candidate's entry points; writes the verdict."""
  result_fd = cfg["result_fd"]
  layers: list[str] = []

  def report(status: str, detail: str = "", **extra: object) -> None:
    send(result_fd, {"status": status, "detail": detail[:4000], "layers": layers, **extra})

  link = {
    "call_fd": cfg["call_fd"], "reply_fd": cfg["reply_fd"], "max_bytes": cfg["limits"]["max_message_bytes"],
    "dead": False, "protocol": "", "unsupported": "",
  }
  _set_limits(cfg, None)
  if cfg["policy"]["audit_hook"]:
    install_audit_hook(cfg["workdir"], [])
  ns = {"__name__": "__checker__", "__builtins__": builtins}
  try:
    tests = compile(cfg["tests"] + "\n" + cfg["check_call"] + "\n", "<tests>", "exec")
    exec(compile(cfg["prelude"], "<prelude>", "exec"), ns)
  except BaseException as e:  # noqa: B036 - trusted code must load
    report("sandbox_error", "prelude or tests failed to load: " + _describe(e))
    return
  try:  # the harness sends its layers before any untrusted code runs: failing here is the sandbox's fault
    first = recv(link["reply_fd"], link["max_bytes"])
    if not (isinstance(first, dict) and first.get("t") == "layers"):
      raise ProtocolError("no layers message")
  except (CandidateDied, ProtocolError) as e:
    report("sandbox_error", f"the candidate harness failed while isolating itself: {e}")
    return
  layers = [str(x)[:80] for x in first.get("layers", [])][:40]
  try:
    first = recv(link["reply_fd"], link["max_bytes"])
  except CandidateDied:
    report("candidate_died", "candidate exited before loading")
    return
  except ProtocolError as e:
    report("runtime_error", f"protocol error: {e}")
    return
  if isinstance(first, dict) and first.get("t") == "load":
    status = first.get("status")
    report(status if status in ("syntax_error", "memory_limit") else "runtime_error", str(first.get("detail"))[:2000])
    return
  if not (isinstance(first, dict) and first.get("t") == "ready"):
    report("runtime_error", "protocol error: no ready message")
    return
  for name in cfg["entry_points"]:
    ns[name] = _Proxy(name, link)
  ns["candidate"] = ns[cfg["entry_points"][0]]
  try:
    exec(tests, ns)  # defines check() and calls it, or runs top-level asserts
  except CandidateDied as e:
    if link["unsupported"]:
      report("sandbox_error", link["unsupported"])
    elif link["protocol"]:
      report("runtime_error", "protocol error: " + link["protocol"])
    else:
      report("candidate_died", str(e))
    return
  except BaseException as e:  # noqa: B036
    if getattr(e, "_rl_lm_from_candidate", False):
      report("memory_limit" if isinstance(e, MemoryError) else "runtime_error", _describe(e))
    else:
      report("failed", _describe(e))
    return
  if link["dead"]:  # a test swallowed the candidate's death
    report("candidate_died", "candidate process died during the tests")
    return
  report("passed", nonce=cfg["nonce"])
  try:
    send(link["call_fd"], {"t": "bye"})
  except OSError:
    pass


def main() -> None:
  """Entry point: `sandbox_child.py candidate|checker`, config as JSON on stdin."""
  role = sys.argv[1]
  cfg = json.loads(sys.stdin.buffer.read())
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  os.close(devnull)
  if role == "candidate":
    candidate_main(cfg)
  elif role == "checker":
    checker_main(cfg)
  else:
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
  main()
