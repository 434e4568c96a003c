"""Environments in worker processes: a crash, a hang or a leak in an environment costs its episodes, never the
trainer.

  with EnvPool(("my_pkg.envs", "MyEnv"), workers=4, step_timeout_s=10, reset_timeout_s=30) as pool:
    first = pool.reset([(episode, problem, seed), ...])  # Outcome per episode, in order: .value the observation
    nxt = pool.step([(episode, action, ""), ...])        # .value a base.Step; "" or a fault: "crash"|"hang"|"slow"
    pool.close_episodes([episode, ...])

Processes. The trainer holds JAX state (threads, device handles), so it is never forked. Workers come from the
"forkserver" context (default): a server process, started once by fork+exec, forks each worker. It preloads
this module (and the environment's, when the trainer has imported it), so a replacement is ready in about
10 ms, against about 230 ms with "spawn", a fresh interpreter importing numpy and rl_lm (2 busy cores;
experiments/benchmarks/env_workers.py). Workers never import the trainer's `__main__` (see
`_keep_main_out_of_workers`), so `where` must name an importable module. Each worker is its own process group:
Ctrl-C at the terminal reaches the trainer only (it closes the pool), and a kill takes the environment's own
subprocesses with it.

Batches. Requests and answers cross one duplex Pipe per worker. An episode lives on the worker that built its
environment (a reset goes to the worker holding the fewest episodes, round robin among equals). `reset` and
`step` queue every request of the batch, then collect the answers (matched by request id) with
`connection.wait` on every pipe and process sentinel: a batch lasts about its busiest worker's share, not the
sum. A worker has one request in flight (the next is sent on its answer), so a stuck worker's pipe never fills
and the trainer never blocks on a send. The timeout is per request, from when its worker was free to start
it (the later of its sending and the worker's previous answer): requests queued on one worker may together
take longer than one timeout, and a request queued behind a slow one is not blamed for it.

Failures, as `Outcome.failure` (what really happened, whatever fault was injected):
- "error": `step` raised (or returned no `base.Step`, or an answer that does not pickle). Caught in the
  worker, which goes on; `detail` is the exception's type and message and the traceback's last frame.
- "reset_failure": building the environment or its `reset` raised (the worker goes on), or the worker died
  during the reset. Resets queued behind it on a replaced worker move to the replacement and run there.
- "hang": no answer within the timeout (a reset too). The worker is killed (SIGKILL to its group), replaced.
- "crash": the worker died (an exit, a signal, the OOM killer); replaced.
A replaced worker's environments are gone. Its steps of the batch queued behind the failed one fail the same
way (detail "worker replaced: ..."); later steps of every episode it held return Outcome(False, None, "crash",
"worker replaced"), and of an episode whose reset failed, "reset_failure", until `close_episodes` forgets the
id or a reset starts it again.

Heartbeat. A thread in each worker writes the time to a shared double every `heartbeat_s`. Before each batch
the pool drains stray messages and replaces any worker that is dead or whose heartbeat is older than
`HEARTBEAT_STALE` periods (stuck in C code holding the GIL, stopped, swapped out); its episodes are lost with
detail "no heartbeat". The thread also watches the parent's sentinel: if the trainer dies without closing the
pool (SIGKILL included), each worker kills its process group within `heartbeat_s` (one stuck holding the GIL
cannot). `close()`, garbage collection of the pool and interpreter exit stop every worker: a "stop" message
(it closes its environments), then SIGTERM, then SIGKILL to its group.

Not thread safe: one caller drives a pool.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import importlib
import itertools
import multiprocessing
import multiprocessing.spawn
import os
import select
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from multiprocessing import connection
from typing import Any

import numpy as np

from rl_lm.envs import base
from rl_lm.tasks.base import Problem

FAULTS = ("", "crash", "hang", "slow")
HEARTBEAT_STALE = 5.0  # a heartbeat older than this many periods: the worker is replaced
CRASH_EXIT_CODE = 70  # what an injected "crash" exits with
_DETAIL_CHARS = 2000
_STOP_GRACE_S = 1.0  # close(): how long workers may take to close their environments before SIGTERM
_WORKER_NAME = "rl_lm-env-worker"


@dataclasses.dataclass(frozen=True)
class Outcome:
  """The answer to one request of a batch."""

  ok: bool  # the environment answered
  value: Any  # reset: the observation (str); step: a base.Step; None when not ok
  failure: str = ""  # when not ok: "crash" | "hang" | "error" | "reset_failure"
  detail: str = ""
  seconds: float = 0.0  # wall time of the call (in the worker when it answered; else until the failure was seen)


# --- the worker process --------------------------------------------------------------------------------------


def _describe(e: BaseException) -> str:
  """"Type: message (at file:line in function)", the traceback's last frame."""
  text = f"{type(e).__name__}: {e}"
  frames = traceback.extract_tb(e.__traceback__)
  if frames:
    last = frames[-1]
    text += f" (at {last.filename}:{last.lineno} in {last.name})"
  return text[:_DETAIL_CHARS]


def _resolve(where: tuple[str, str]) -> Any:
  module, attribute = where
  obj: Any = importlib.import_module(module)
  for part in attribute.split("."):
    obj = getattr(obj, part)
  return obj


def _heartbeat(beat: Any, period_s: float) -> None:
  """Writes the time every `period_s`; if the parent dies, kills this worker's process group."""
  parent = multiprocessing.parent_process()
  sentinel = parent.sentinel if parent is not None else None
  while True:
    beat.value = time.monotonic()
    if sentinel is None:
      time.sleep(period_s)
    elif connection.wait([sentinel], period_s):  # the parent exited: no one will ever read our answers
      try:
        if os.getpgid(0) == os.getpid():
          os.killpg(0, signal.SIGKILL)  # the environment's subprocesses too
      finally:
        os._exit(0)


def _serve(conn: connection.Connection, where: tuple[str, str], beat: Any, heartbeat_s: float,
           step_timeout_s: float) -> None:
  """Worker loop: ("reset", rid, episode, problem, seed) | ("step", rid, episode, action, fault) |
  ("close", rid, episodes) | ("stop",) in; ("ready", error) once, then (rid, ok, value, failure, detail, seconds)
  per reset or step and ("closed", rid) per close out."""
  try:
    os.setpgid(0, 0)
  except OSError:
    pass
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and stops the pool
  threading.Thread(target=_heartbeat, args=(beat, heartbeat_s), name="env-heartbeat", daemon=True).start()
  try:
    _resolve(where)
  except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
    conn.send(("ready", _describe(e)))
    return
  conn.send(("ready", ""))
  envs: dict[int, base.Environment] = {}

  def answer(reply: tuple, failure: str) -> None:
    try:
      conn.send(reply)
    except (OSError, EOFError):
      raise
    except Exception as e:  # noqa: BLE001 - an unpicklable value: the environment's fault, not the worker's
      conn.send((reply[0], False, None, failure, f"answer could not be sent: {_describe(e)}", reply[5]))

  try:
    while True:
      try:
        msg = conn.recv()
      except (EOFError, OSError):
        return
      kind = msg[0]
      if kind == "stop":
        return
      if kind == "close":
        for episode in msg[2]:
          env = envs.pop(episode, None)
          if env is not None:
            try:
              env.close()
            except Exception:  # noqa: BLE001 - best effort
              pass
        conn.send(("closed", msg[1]))
        continue
      t0 = time.monotonic()
      if kind == "reset":
        _, rid, episode, problem, seed = msg
        env = None
        try:
          env = base.build(where)
          obs = env.reset(problem, np.random.default_rng(seed))
          if not isinstance(obs, str):
            raise TypeError(f"reset returned {type(obs).__name__}, not str")
        except Exception as e:  # noqa: BLE001 - the environment's failure, reported
          if env is not None:
            try:
              env.close()
            except Exception:  # noqa: BLE001
              pass
          answer((rid, False, None, "reset_failure", _describe(e), time.monotonic() - t0), "reset_failure")
          continue
        envs[episode] = env
        answer((rid, True, obs, "", "", time.monotonic() - t0), "reset_failure")
      elif kind == "step":
        _, rid, episode, action, fault = msg
        if fault == "crash":
          os._exit(CRASH_EXIT_CODE)
        elif fault == "hang":
          time.sleep(10**6)
        elif fault == "slow":
          time.sleep(0.5 * step_timeout_s)
        try:
          env = envs[episode]
        except KeyError:
          answer((rid, False, None, "error", f"episode {episode} is not on this worker", time.monotonic() - t0),
                 "error")
          continue
        try:
          result = env.step(action)
          if not isinstance(result, base.Step):
            raise TypeError(f"step returned {type(result).__name__}, not a Step")
        except Exception as e:  # noqa: BLE001 - the environment's failure, reported
          answer((rid, False, None, "error", _describe(e), time.monotonic() - t0), "error")
          continue
        answer((rid, True, result, "", "", time.monotonic() - t0), "error")
  finally:
    for env in envs.values():
      try:
        env.close()
      except Exception:  # noqa: BLE001 - best effort
        pass


# --- the parent's side ---------------------------------------------------------------------------------------


def _keep_main_out_of_workers() -> None:
  """Workers do not import the trainer's `__main__`.

  A "spawn" or "forkserver" child normally re-runs the parent's main module (as `__mp_main__`) before it
  unpickles its target: for a trainer that is a second import of the whole program, and for a script without an
  `if __name__ == "__main__"` guard, a second run of it (from `python - <<EOF` or `-c`, a crash: there is no file).
  A worker needs only this module and the environment's, so `multiprocessing.spawn.get_preparation_data` is
  wrapped (once, process-wide) to leave the main module out of the preparation data of processes named
  `_WORKER_NAME`; every other process is prepared as before.
  """
  original = multiprocessing.spawn.get_preparation_data
  if getattr(original, "_rl_lm_env_workers", False):
    return

  def get_preparation_data(name: str) -> dict[str, Any]:
    data = original(name)
    if name.startswith(_WORKER_NAME):
      data.pop("init_main_from_name", None)
      data.pop("init_main_from_path", None)
    return data

  get_preparation_data._rl_lm_env_workers = True  # type: ignore[attr-defined]
  multiprocessing.spawn.get_preparation_data = get_preparation_data


@dataclasses.dataclass(eq=False)
class _Request:
  index: int  # in the batch
  kind: str  # "reset" | "step"
  episode: int
  message: tuple
  timeout_s: float
  sent_at: float = 0.0


def _preload(ctx: Any, module: str) -> None:
  """Adds this module, and the environment's if this process imported it already (so it is known to import:
  the forkserver dies of any error but ImportError in a preload), to what the forkserver imports when it starts.
  A worker is then a fork of a process that has them: a replacement is ready in about 10 ms, against about
  0.2 s importing numpy and rl_lm in each worker, or with "spawn" (2 busy cores). No effect once the server runs
  (another pool or library started it): workers import what they need themselves."""
  from multiprocessing import forkserver

  current = list(getattr(forkserver._forkserver, "_preload_modules", None) or [])
  wanted = [m for m in (__name__, module if module in sys.modules else None) if m and m not in current]
  if wanted:
    ctx.set_forkserver_preload(current + wanted)


_worker_numbers = itertools.count()


class _Worker:
  """The parent's handle on one worker process."""

  def __init__(self, ctx: Any, where: tuple[str, str], heartbeat_s: float, step_timeout_s: float) -> None:
    self.beat = ctx.Value("d", time.monotonic(), lock=False)
    self.conn, child = ctx.Pipe(duplex=True)
    self.proc = ctx.Process(target=_serve, args=(child, where, self.beat, heartbeat_s, step_timeout_s),
                            name=f"{_WORKER_NAME}-{next(_worker_numbers)}", daemon=True)
    self.proc.start()
    child.close()
    self.pid: int = self.proc.pid
    self.started_at = time.monotonic()
    self.ready = False  # its ("ready", "") came
    self.last_message_at = self.started_at
    self.episodes: set[int] = set()
    self.queue: collections.deque[_Request] = collections.deque()  # this batch's, not sent yet
    self.inflight: collections.deque[_Request] = collections.deque()  # sent, not answered
    self.closes = 0  # close messages not acknowledged

  def heartbeat_age(self) -> float:
    return time.monotonic() - self.beat.value

  def writable(self) -> bool:
    try:
      return bool(select.select([], [self.conn.fileno()], [], 0)[1])
    except (OSError, ValueError):
      return False

  def kill(self) -> None:
    """SIGKILL to its process group (the environment's subprocesses too) and to it; reaped; pipe closed."""
    for send in (lambda: os.killpg(self.pid, signal.SIGKILL), self.proc.kill):
      try:
        send()
      except (OSError, ValueError, AttributeError):
        pass
    try:
      self.proc.join(5.0)
    except (OSError, ValueError, AssertionError):
      pass
    try:
      self.conn.close()
    except OSError:
      pass

  def exit_text(self) -> str:
    self.proc.join(1.0)  # a pipe's EOF can come a moment before the exit status
    code = self.proc.exitcode
    if code is None:
      return "worker died"
    if code < 0:
      try:
        return f"worker died (killed by {signal.Signals(-code).name})"
      except ValueError:
        return f"worker died (signal {-code})"
    return f"worker died (exit code {code})"


def _stop_all(handles: list[_Worker]) -> None:
  """Stops every worker: "stop" (they close their environments), SIGTERM, then SIGKILL to the group."""
  for w in handles:
    if w.proc.exitcode is None and w.writable():
      try:
        w.conn.send(("stop",))
      except (OSError, ValueError):
        pass
  for grace, hit in ((_STOP_GRACE_S, lambda w: w.proc.terminate()), (0.5, None)):
    deadline = time.monotonic() + grace
    for w in handles:
      try:
        w.proc.join(max(0.0, deadline - time.monotonic()))
      except (OSError, ValueError, AssertionError):
        pass
    if hit is not None:
      for w in handles:
        if w.proc.exitcode is None:
          try:
            hit(w)
          except (OSError, ValueError, AttributeError):
            pass
  for w in handles:
    w.kill()
  handles.clear()


class EnvPool:
  """Environments of one kind, `where` = (module, attribute), served by `workers` processes (see the module
  docstring for the protocol and the failures).

  `stats` counts, over the pool's life: "resets", "steps" (requests answered or failed), "crashes", "hangs",
  "errors", "reset_failures" (Outcomes returned with that failure, lost episodes' steps included) and "replaced"
  (workers started to replace dead, hung or silent ones).
  """

  def __init__(self, where: tuple[str, str], workers: int, step_timeout_s: float, reset_timeout_s: float,
               heartbeat_s: float = 1.0, context: str = "forkserver", startup_timeout_s: float = 60.0) -> None:
    if workers < 1:
      raise ValueError(f"EnvPool needs at least one worker, got {workers}")
    if context == "fork":
      raise ValueError("EnvPool never forks the trainer: use context 'forkserver' or 'spawn'")
    self.where = (str(where[0]), str(where[1]))
    self.step_timeout_s, self.reset_timeout_s = float(step_timeout_s), float(reset_timeout_s)
    self.heartbeat_s, self.startup_timeout_s = float(heartbeat_s), float(startup_timeout_s)
    if self.where[0] == "__main__":
      raise ValueError("EnvPool: the environment must be importable by module name, not defined in __main__")
    self._ctx = multiprocessing.get_context(context)
    _keep_main_out_of_workers()
    if context == "forkserver":
      _preload(self._ctx, self.where[0])
    self.stats: dict[str, int] = dict.fromkeys(
      ("replaced", "crashes", "hangs", "errors", "reset_failures", "resets", "steps"), 0)
    self._rid = itertools.count()
    self._home: dict[int, _Worker] = {}  # live episode -> the worker holding its environment
    self._lost: dict[int, tuple[str, str]] = {}  # episode -> (failure, detail) its later steps return
    self._next = 0  # round robin among the least loaded
    self._workers: list[_Worker] = []
    self._handles: list[_Worker] = []  # what the finalizer stops: every worker not yet killed
    self._finalizer = weakref.finalize(self, _stop_all, self._handles)
    atexit.register(self._finalizer)  # before multiprocessing's own exit hook, which would only SIGTERM them
    try:
      for _ in range(workers):
        self._workers.append(self._start())
      self._await_ready()
    except BaseException:
      self.close()
      raise

  # -- public ---------------------------------------------------------------------------------------------------

  def reset(self, episodes: Sequence[tuple[int, Problem, int]]) -> list[Outcome]:
    """Builds a fresh environment for each (episode, problem, seed) and returns its first observation."""
    ids = [int(e) for e, _, _ in episodes]
    self._check_open()
    self._check_unique(ids)
    for e in ids:
      if e in self._home:
        raise ValueError(f"episode {e} is already open: close_episodes([{e}]) first")
    self._check_health()
    for e in ids:
      self._lost.pop(e, None)  # a failed or lost episode's id may start again
    load = {id(w): len(w.episodes) for w in self._workers}
    for i, (e, problem, seed) in enumerate(episodes):
      w = self._least_loaded(load)
      load[id(w)] += 1
      w.queue.append(_Request(i, "reset", int(e), ("reset", next(self._rid), int(e), problem, int(seed)),
                              self.reset_timeout_s))
    return self._run(len(ids))

  def step(self, actions: Sequence[tuple[int, str, str]]) -> list[Outcome]:
    """Sends each (episode, action, fault) to its environment; fault "" runs it plainly, "crash" / "hang" /
    "slow" inject that fault in the worker first (the Outcome is what really happens)."""
    ids = [int(e) for e, _, _ in actions]
    self._check_open()
    self._check_unique(ids)
    for e, _, fault in actions:
      if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {FAULTS}")
      if int(e) not in self._home and int(e) not in self._lost:
        raise KeyError(f"episode {e} was never reset here (or was closed)")
    self._check_health()
    outcomes: list[Outcome | None] = [None] * len(ids)
    for i, (e, action, fault) in enumerate(actions):
      e = int(e)
      if e in self._lost:
        failure, detail = self._lost[e]
        outcomes[i] = self._count("step", Outcome(False, None, failure, detail))
      else:
        self._home[e].queue.append(_Request(i, "step", e, ("step", next(self._rid), e, str(action), fault),
                                            self.step_timeout_s))
    return self._run(len(ids), outcomes)

  def close_episodes(self, ids: Sequence[int]) -> None:
    """Closes the episodes' environments (in their workers, without waiting) and forgets them. Never raises."""
    try:
      by_worker: dict[int, tuple[_Worker, list[int]]] = {}
      for e in ids:
        e = int(e)
        self._lost.pop(e, None)
        w = self._home.pop(e, None)
        if w is not None:
          w.episodes.discard(e)
          by_worker.setdefault(id(w), (w, []))[1].append(e)
      for w, episodes in by_worker.values():
        if w.proc.exitcode is None and w.writable():  # a stuck worker's full pipe must not block us
          try:
            w.conn.send(("close", next(self._rid), episodes))
            w.closes += 1
          except (OSError, ValueError):
            pass
    except Exception:  # noqa: BLE001 - best effort by contract
      pass

  def health(self) -> list[dict[str, Any]]:
    """One dict per worker: pid, alive, heartbeat_age_s, episodes (held), ready."""
    return [dict(pid=w.pid, alive=w.proc.exitcode is None, heartbeat_age_s=w.heartbeat_age(),
                 episodes=len(w.episodes), ready=w.ready) for w in self._workers]

  def close(self) -> None:
    """Stops every worker (environments closed where they still answer) and reaps them. Idempotent."""
    self._finalizer()
    atexit.unregister(self._finalizer)
    self._workers = []
    self._home.clear()
    self._lost.clear()

  def __enter__(self) -> EnvPool:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  # -- workers --------------------------------------------------------------------------------------------------

  def _start(self) -> _Worker:
    w = _Worker(self._ctx, self.where, self.heartbeat_s, self.step_timeout_s)
    self._handles.append(w)
    return w

  def _await_ready(self) -> None:
    deadline = time.monotonic() + self.startup_timeout_s
    for w in self._workers:
      while not w.ready:
        left = deadline - time.monotonic()
        if left <= 0 or not w.conn.poll(left):
          raise RuntimeError(f"EnvPool: an environment worker did not start within {self.startup_timeout_s:g} s")
        try:
          msg = w.conn.recv()
        except (EOFError, OSError):
          raise RuntimeError(f"EnvPool: an environment worker did not start: {w.exit_text()}") from None
        if msg[0] == "ready":
          if msg[1]:
            raise ValueError(f"EnvPool: cannot load environment {self.where}: {msg[1]}")
          w.ready, w.last_message_at = True, time.monotonic()

  def _least_loaded(self, load: dict[int, int]) -> _Worker:
    n = len(self._workers)
    order = [self._workers[(self._next + k) % n] for k in range(n)]
    w = min(order, key=lambda w: load[id(w)])
    self._next = (self._workers.index(w) + 1) % n
    return w

  def _replace(self, w: _Worker, lost_detail: str) -> _Worker:
    """Kills `w`, starts its replacement in the same slot; its episodes are lost. Returns the replacement."""
    w.kill()
    if w in self._handles:
      self._handles.remove(w)
    for e in w.episodes:
      self._home.pop(e, None)
      self._lost[e] = ("crash", lost_detail)
    w.episodes.clear()
    fresh = self._start()
    self._workers[self._workers.index(w)] = fresh
    self.stats["replaced"] += 1
    return fresh

  def _check_health(self) -> None:
    """Before a batch: drains stray messages (ready, close acknowledgements) and replaces dead or silent workers."""
    for w in list(self._workers):
      if w not in self._workers:  # replaced while draining
        continue
      dead = False
      try:
        while w.conn.poll(0):
          self._handle(w, w.conn.recv(), [])
      except (EOFError, OSError):
        dead = True
      stale = w.heartbeat_age() > HEARTBEAT_STALE * self.heartbeat_s
      if not w.ready:  # still starting: its heartbeat may not have begun
        stale = time.monotonic() - w.started_at > self.startup_timeout_s
      if w in self._workers and (dead or w.proc.exitcode is not None or stale):
        self._replace(w, "no heartbeat")

  # -- batches --------------------------------------------------------------------------------------------------

  def _check_open(self) -> None:
    if not self._workers:
      raise RuntimeError("EnvPool is closed")

  @staticmethod
  def _check_unique(ids: list[int]) -> None:
    if len(set(ids)) != len(ids):
      raise ValueError("an episode appears twice in one batch")

  def _count(self, kind: str, outcome: Outcome) -> Outcome:
    self.stats["resets" if kind == "reset" else "steps"] += 1
    if not outcome.ok:
      key = {"crash": "crashes", "hang": "hangs", "error": "errors", "reset_failure": "reset_failures"}
      self.stats[key.get(outcome.failure, "errors")] += 1
    return outcome

  def _run(self, n: int, outcomes: list[Outcome | None] | None = None) -> list[Outcome]:
    """Sends the queued requests (one in flight per worker) and collects every answer, failing what overruns."""
    outcomes = outcomes if outcomes is not None else [None] * n
    for w in list(self._workers):
      self._fill(w, outcomes)
    while True:
      busy = [w for w in self._workers if w.queue or w.inflight]
      if not busy:
        break
      now = time.monotonic()
      deadlines = {}
      for w in busy:
        if not w.ready:
          deadlines[id(w)] = w.started_at + self.startup_timeout_s
        elif w.inflight:
          head = w.inflight[0]
          deadlines[id(w)] = max(head.sent_at, w.last_message_at) + head.timeout_s
      expired = [w for w in busy if deadlines.get(id(w), now + 1) <= now]
      if expired:
        for w in expired:
          self._overran(w, outcomes)
        continue
      waitables: dict[Any, _Worker] = {}
      for w in busy:
        waitables[w.conn] = w
        waitables[w.proc.sentinel] = w
      wait_s = max(0.0, min(deadlines.values(), default=now + 1.0) - now)
      for obj in connection.wait(list(waitables), wait_s):
        w = waitables[obj]
        if w in self._workers:  # not replaced by an earlier object of this wake-up
          self._drain(w, outcomes)
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]

  def _fill(self, w: _Worker, outcomes: list[Outcome | None]) -> None:
    while w.ready and w.queue and not w.inflight:
      req = w.queue.popleft()
      req.sent_at = time.monotonic()
      w.inflight.append(req)
      try:
        w.conn.send(req.message)
      except (OSError, ValueError):
        self._died(w, outcomes)
        return

  def _drain(self, w: _Worker, outcomes: list[Outcome | None]) -> None:
    try:
      while w.conn.poll(0):
        self._handle(w, w.conn.recv(), outcomes)
        if w not in self._workers:
          return
    except (EOFError, OSError):  # its answers before the end were handled first
      self._died(w, outcomes)
      return
    if w.proc.exitcode is not None:  # its sentinel fired before the pipe's end was seen
      self._died(w, outcomes)

  def _handle(self, w: _Worker, msg: tuple, outcomes: list[Outcome | None]) -> None:
    w.last_message_at = time.monotonic()
    if msg[0] == "ready":
      if msg[1]:
        self._died(w, outcomes, f"worker could not load the environment: {msg[1]}")
        return
      w.ready = True
    elif msg[0] == "closed":
      w.closes = max(0, w.closes - 1)
    else:
      rid, ok, value, failure, detail, seconds = msg
      req = next((r for r in w.inflight if r.message[1] == rid), None)
      if req is None:  # not this batch's: nothing waits for it
        return
      w.inflight.remove(req)
      if req.kind == "reset":
        if ok:
          w.episodes.add(req.episode)
          self._home[req.episode] = w
        else:
          self._lost[req.episode] = ("reset_failure", f"the reset failed: {detail}")
      outcomes[req.index] = self._count(req.kind, Outcome(ok, value, failure, detail, seconds))
    self._fill(w, outcomes)

  def _overran(self, w: _Worker, outcomes: list[Outcome | None]) -> None:
    if not w.ready:
      self._fail_worker(w, outcomes, "hang", f"worker did not start within {self.startup_timeout_s:g} s",
                        reroute=False)
      return
    head = w.inflight[0]
    what = f"no answer within {head.timeout_s:g} s"
    if w.closes:
      what += " (the worker may be stuck closing an earlier episode)"
    self._fail_worker(w, outcomes, "hang", what, reroute=True)

  def _died(self, w: _Worker, outcomes: list[Outcome | None], text: str | None = None) -> None:
    if w not in self._workers:
      return
    self._fail_worker(w, outcomes, "crash", text or w.exit_text(), reroute=w.ready)

  def _fail_worker(self, w: _Worker, outcomes: list[Outcome | None], failure: str, detail: str,
                   reroute: bool) -> None:
    """Replaces `w`: the request it was serving fails with `failure` (a reset that crashed: "reset_failure"), and
    so does the rest of its share of the batch, except resets not yet started, which move to the replacement
    when `reroute`."""
    now = time.monotonic()
    head = w.inflight[0] if w.inflight else None
    rest = [r for r in w.inflight if r is not head] + list(w.queue)
    w.inflight.clear()
    w.queue.clear()
    fresh = self._replace(w, "worker replaced")
    if head is not None:
      seconds = now - max(head.sent_at, w.last_message_at)
      kind = "reset_failure" if head.kind == "reset" and failure == "crash" else failure
      text = detail if head.kind == "step" else f"during reset: {detail}"
      if head.kind == "reset":
        self._lost[head.episode] = ("reset_failure", f"the reset failed: {text}")
      outcomes[head.index] = self._count(head.kind, Outcome(False, None, kind, text, seconds))
    for r in rest:
      if r.kind == "reset" and reroute:
        fresh.queue.append(r)
      else:
        text = f"worker replaced: {detail}"
        if r.kind == "reset":
          self._lost[r.episode] = ("reset_failure", f"the reset failed: {text}")
        outcomes[r.index] = self._count(r.kind, Outcome(False, None, "reset_failure" if r.kind == "reset" else failure,
                                                        text))
