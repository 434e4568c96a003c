"""The harness that runs inside the code sandbox (see `rl_lm.rewards.code` for the design).

Started as `python -I -S sandbox_child.py candidate|checker`, it reads a JSON config from stdin and
plays one of two roles. It imports nothing from rl_lm and only the standard library, so it also works
where the project is not importable.

candidate: runs inside the jail bubblewrap built (see `rl_lm.rewards.jail`), or, where there is none,
  as a plain process. Before any untrusted code it sets its rlimits, drops root for a fresh
  unprivileged uid when started as root in the jail, and reports the layers the kernel confirms
  (`confine`); the fallback adds an audit hook (`install_audit_hook`, a convenience, not a wall).
  Then it runs the untrusted program and serves calls to its entry points: decoded arguments in,
  encoded return value (or exception name) out. Everything it sends after the program starts is
  untrusted and can only lower the score.
checker: runs the trusted prelude and tests on the host (no jail: they are trusted), with each entry
  point replaced by a proxy that calls the candidate process. Only data crosses (None, bool, int,
  float, complex, str, bytes, list, tuple, dict, set, frozenset), decoded strictly into plain
  built-in objects, so the candidate cannot hand the tests an object whose `__eq__` lies. After
  `check` returns it writes the pass marker, with the parent's nonce, to a pipe only it holds.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
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


# --- confinement (runs before any untrusted code) ------------------------------------------------


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


def _set_limits(lim: dict, nproc: int | None) -> None:
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


def _status_fields() -> dict[str, str]:
  with open("/proc/self/status") as f:
    return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def confine(cfg: dict) -> list[str]:
  """The candidate's own part of its confinement; returns the layers, as the kernel reports them.

  In the jail (bwrap already made the namespaces, the file allowlist and the seccomp filter): the
  rlimits, then, when started as root, a switch to the fresh unprivileged uid `cfg["uid"]` (which
  drops every capability). Without the jail: the rlimits only. Each layer is named only if
  /proc/self/status confirms it.
  """
  lim, uid = cfg["limits"], cfg.get("uid")
  keep = sorted({0, 1, 2, cfg["call_fd"], cfg["reply_fd"]})
  for low, high in zip(keep, keep[1:] + [max(keep[-1] + 1, 1 << 16)], strict=True):
    os.closerange(low + 1, high)  # nothing else inherited stays open (bwrap's info pipe, say)
  if cfg["jail"]:
    nproc = lim["max_processes"]  # a fresh uid (or user namespace) per run: the count starts at zero
  else:
    nproc = None if os.geteuid() == 0 else _count_own_processes() + lim["max_processes"]
  _set_limits(lim, nproc)
  layers = ["rlimits" + ("+nproc" if nproc is not None else "")]
  if uid is not None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
  status = _status_fields()
  if uid is not None and os.getuid() == uid and status.get("Groups", "").strip() == "":
    layers.append(f"uid:{uid}")
  elif os.getuid() != 0:
    layers.append(f"uid:{os.getuid()}")
  if int(status.get("CapEff", "1"), 16) == 0 and int(status.get("CapPrm", "1"), 16) == 0:
    layers.append("no-capabilities")
  if status.get("NoNewPrivs", "0").strip() == "1":
    layers.append("no-new-privs")
  if status.get("Seccomp", "0").strip() == "2":
    layers.append("seccomp")
  return layers


# --- audit hook (convenience only, never counted as a wall) ---------------------------------------

_DENY = frozenset(
  {
    "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "signal.pthread_kill", "subprocess.Popen", "pty.spawn", "resource.setrlimit", "resource.prlimit",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "os.chroot",
    "cpython.PyInterpreterState_New", "syslog.openlog", "webbrowser.open", "sys.setprofile", "sys.settrace",
  }
)
# (event, how many leading arguments are paths, those paths are written)
_PATH_EVENTS = tuple(
  (event, n, True) for event, n in (
    ("os.remove", 1), ("os.rmdir", 1), ("os.mkdir", 1), ("os.chmod", 1), ("os.chown", 1), ("os.truncate", 1),
    ("os.utime", 1), ("os.rename", 2), ("os.link", 2), ("os.symlink", 2), ("shutil.rmtree", 1),
    ("shutil.copyfile", 2), ("shutil.move", 2), ("shutil.copytree", 2), ("os.chflags", 1), ("os.setxattr", 1),
    ("os.removexattr", 1), ("os.mkfifo", 1), ("os.mknod", 1),
  )
) + tuple((event, 1, False) for event in ("os.listdir", "os.scandir", "os.getxattr", "os.listxattr"))
_BLOCKED_MODULES = frozenset(
  {"ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_testcapi", "mmap", "_posixshmem",
   "_multiprocessing"}
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def install_audit_hook(workdir: str, readable: list[str]) -> None:
  """Refuses network, process creation, signals, ctypes, reads outside `readable` and writes outside `workdir`.

  Convenience, not a wall: a Python audit hook runs inside the process it polices, and C code (or a
  `dir_fd` argument, which audit events do not carry) goes around it; only the kernel layers count.
  It is written so that the program cannot switch it off from Python: it never runs the program's
  code (a path argument is copied to an exact str with the base type's own method, anything but
  str, bytes or a file descriptor is refused), it is one function with no Python helpers, every
  name it uses is bound here as a default argument before the program runs (a patched builtin or
  module is never looked up), its state is immutable, and there is no on/off switch. A traceback
  can show the program the hook's frame, but nothing in it can be changed from Python.
  """
  realpath = os.path.realpath  # only here, before the program runs
  work = realpath(workdir)
  roots = tuple(realpath(r) for r in readable) + (work,)

  def hook(
    event: str, args: tuple, _deny=_DENY, _paths=_PATH_EVENTS, _blocked=_BLOCKED_MODULES, _work=work, _roots=roots,
    _wflags=_WRITE_FLAGS, _str=str, _bytes=bytes, _int=int,
    _type=type, _sub=type.__subclasscheck__, _str_copy=str.__str__, _bytes_copy=bytes.__getitem__,
    _decode=bytes.decode, _all=slice(None), _getcwd=os.getcwd, _lstat=os.lstat, _readlink=os.readlink,
    _getpid=os.getpid, _perm=PermissionError, _imperr=ImportError, _oserror=OSError, _range=range,
  ) -> None:
    if event in _deny or event.startswith(("socket.", "ctypes.", "_ctypes.")):
      raise _perm(f"sandbox: {event} is not allowed")
    if event == "import":
      name = args[0] if args and _type(args[0]) is _str else ""
      if name.split(".")[0] in _blocked:
        raise _imperr(f"sandbox: importing {name} is not allowed")
      return
    checks = []  # (path argument, needs write access)
    if event == "open":
      mode = args[1] if _type(args[1]) is _str else ""
      writing = _type(args[2]) is _int and (args[2] & _wflags) != 0
      writing = writing or "w" in mode or "a" in mode or "x" in mode or "+" in mode
      checks.append((args[0], writing))
    else:
      for name, n, writes in _paths:
        if name == event:
          for a in args[:n]:
            checks.append((a, writes))
    for raw, writing in checks:
      t = _type(raw)  # copied to an exact str without calling any method of the program's classes
      if t is _str:
        path = raw
      elif t is _bytes:
        path = _decode(raw, "utf-8", "surrogateescape")
      elif _sub(_str, t):
        path = _str_copy(raw)
      elif _sub(_bytes, t):
        path = _decode(_bytes_copy(raw, _all), "utf-8", "surrogateescape")
      elif _sub(_int, t) or raw is None:
        continue  # a file descriptor (checked when it was opened), or no path
      else:
        raise _perm("sandbox: a path must be a str or bytes here")
      todo = ([] if path.startswith("/") else _getcwd().split("/")) + path.split("/")
      parts = []
      for _ in _range(100000):  # resolve '..' and symlinks with C functions only
        if not todo:
          break
        part = todo.pop(0)
        if part == "" or part == ".":
          continue
        if part == "..":
          parts = parts[:-1]
          continue
        here = "/" + "/".join(parts + [part])
        try:
          target = _readlink(here) if (_lstat(here).st_mode & 0o170000) == 0o120000 else None
        except _oserror:
          target = None
        if target is None:
          parts.append(part)
        else:
          parts = [] if target.startswith("/") else parts
          todo = target.split("/") + todo
      real = "/" + "/".join(parts)
      allowed = (_work,) if writing else _roots + ("/proc/self", "/proc/thread-self", f"/proc/{_getpid()}")
      ok = False
      for top in allowed:
        ok = ok or real == top or real.startswith(top + "/")
      if not ok:
        raise _perm(f"sandbox: {'writing' if writing else 'reading'} {path[:200]} is not allowed")

  sys.addaudithook(hook)


# --- roles ---------------------------------------------------------------------------------------


def _describe(e: BaseException) -> str:
  try:
    return f"{type(e).__name__}: {e}"[:2000]
  except BaseException:  # a hostile __str__
    return type(e).__name__


def _readable_roots() -> list[str]:
  """What the audit hook lets the candidate read: the standard library, the harness, a few devices."""
  stdlib = os.path.dirname(os.__file__)
  dynload = [p for p in sys.path if p.endswith("lib-dynload")]
  return [stdlib, *dynload, os.path.abspath(sys.argv[0]), "/dev/null", "/dev/zero", "/dev/urandom"]


def _flush_output() -> None:
  """The program's buffered stdout and stderr written to their files now: the parent reads them once the checker
  has its verdict, and may stop this process before it exits (when Python would have flushed them)."""
  for stream in (sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:  # noqa: B036, S110 - a stream the program closed or replaced holds nothing to lose
      pass


def candidate_main(cfg: dict) -> None:
  """Confines this process, tells the checker it started, runs the untrusted program, serves calls."""
  call_fd, reply_fd, max_bytes = cfg["call_fd"], cfg["reply_fd"], cfg["limits"]["max_message_bytes"]
  layers = confine(cfg)
  if cfg["audit_hook"]:
    install_audit_hook(cfg["workdir"], _readable_roots())
    layers.append("audit-hook")
  send(reply_fd, {"t": "layers", "layers": layers})
  program, entry_points = cfg["program"], cfg["entry_points"]
  cfg = None  # drop everything the program need not see
  try:  # the parent has read its counts: the program's clock starts now
    go = recv(call_fd, max_bytes)
  except (CandidateDied, ProtocolError):
    return
  if not (isinstance(go, dict) and go.get("t") == "go"):
    return
  try:
    code = compile(program, "<candidate>", "exec")
  except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError) as e:
    send(reply_fd, {"t": "load", "status": "syntax_error", "detail": _describe(e)})
    return
  ns = {"__name__": "__sandbox__", "__builtins__": builtins}
  try:
    exec(code, ns)
  except BaseException as e:  # noqa: B036 - SystemExit and friends are failures of the program
    status = "memory_limit" if isinstance(e, MemoryError) else "runtime_error"
    _flush_output()
    send(reply_fd, {"t": "load", "status": status, "detail": _describe(e)})
    return
  _flush_output()
  send(reply_fd, {"t": "ready"})
  while True:
    try:
      msg = recv(call_fd, max_bytes)
    except (CandidateDied, ProtocolError):
      return
    if not isinstance(msg, dict) or msg.get("t") != "call" or msg.get("name") not in entry_points:
      return
    try:
      fn = ns.get(msg["name"])
      if not callable(fn):
        raise NameError(f"the program defines no function {msg['name']!r}")
      value = fn(*decode(msg["args"]), **decode(msg["kwargs"]))
      reply = {"t": "ret", "value": encode(value)}
    except BaseException as e:  # noqa: B036
      reply = {"t": "exc", "type": type(e).__name__, "detail": _describe(e)}
    _flush_output()  # before the reply: the checker's verdict follows it
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
  """Runs the trusted tests against proxies of the candidate's entry points; reports to the parent.

  On the result pipe: {"t": "started", ...} once the candidate's harness has confined itself (the
  parent reads the run's CPU count and starts the program's clock, then writes a byte on `go_fd`, and only then
  does the candidate run the program: no CPU of it falls before the count), and one {"t": "verdict", ...} at the end.
  """
  result_fd = cfg["result_fd"]

  def report(status: str, detail: str = "", **extra: object) -> None:
    send(result_fd, {"t": "verdict", "status": status, "detail": detail[:4000], **extra})

  link = {
    "call_fd": cfg["call_fd"], "reply_fd": cfg["reply_fd"], "max_bytes": cfg["limits"]["max_message_bytes"],
    "dead": False, "protocol": "", "unsupported": "",
  }
  _set_limits(cfg["limits"], None)
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
    report("sandbox_error", f"the candidate harness failed while confining itself: {e}")
    return
  layers = [str(x)[:80] for x in first.get("layers", [])][:40]
  send(result_fd, {"t": "started", "layers": layers})
  try:
    if os.read(cfg["go_fd"], 1) != b"g":
      return  # the parent is gone
    send(link["call_fd"], {"t": "go"})
  except OSError:
    report("candidate_died", "candidate exited before loading")
    return
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
