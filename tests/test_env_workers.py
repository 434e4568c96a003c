"""The environment worker pool (rl_lm/envs/workers.py): answers, each failure it classifies, and no leaked
processes.

The environments are defined here, at the top level, so that workers import them as this module (pytest puts
tests/ on sys.path, and the workers inherit it). Timeouts are short (1 s); the time bounds leave seconds of
slack, since the machine may be busy with other tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rl_lm.envs import base
from rl_lm.envs.workers import EnvPool
from rl_lm.tasks.base import Problem

TIMEOUT_S = 1.0


class EchoEnv(base.Environment):
  """reset: the prompt; step: "echo:" + action, reward len(action), done on "stop"."""

  def reset(self, problem, rng):
    self.problem = problem
    return problem.prompt

  def step(self, action):
    return base.Step(observation="echo:" + action, reward=float(len(action)), done=action == "stop")

  def close(self):
    marker = self.problem.metadata.get("closed_marker")
    if marker:
      Path(marker).write_text("closed")


class RaiseInStepEnv(EchoEnv):
  def step(self, action):
    if action.startswith("raise"):
      raise RuntimeError(f"bad action {action!r}")
    return super().step(action)


class RaiseInResetEnv(EchoEnv):
  def reset(self, problem, rng):
    raise ValueError(f"no such puzzle {problem.id}")


class SleepyEnv(EchoEnv):
  """A real hang: the prompt or action "sleep" blocks far past any timeout."""

  def reset(self, problem, rng):
    if problem.prompt == "sleep":
      time.sleep(600)
    return super().reset(problem, rng)

  def step(self, action):
    if action == "sleep":
      time.sleep(600)
    return super().step(action)


class DyingEnv(EchoEnv):
  """A real crash: the worker exits in reset (prompt "die") or step (action "die")."""

  def reset(self, problem, rng):
    if problem.prompt == "die":
      os._exit(13)
    return super().reset(problem, rng)

  def step(self, action):
    if action == "die":
      os._exit(13)
    return super().step(action)


class ChildProcessEnv(EchoEnv):
  """Starts a subprocess at reset (its pid is the observation), as a tool environment might."""

  def reset(self, problem, rng):
    super().reset(problem, rng)
    self.child = subprocess.Popen(["sleep", "600"])
    return str(self.child.pid)


def _problem(i: int, prompt: str | None = None, **metadata) -> Problem:
  return Problem(id=f"p{i}", prompt=f"prompt {i}" if prompt is None else prompt, answer="", metadata=metadata)


def _pool(env: type, workers: int, **kw) -> EnvPool:
  kw.setdefault("step_timeout_s", TIMEOUT_S)
  kw.setdefault("reset_timeout_s", TIMEOUT_S)
  return EnvPool((__name__, env.__name__), workers, **kw)


def _gone(pid: int, within_s: float = 5.0) -> bool:
  """The process has exited (a zombie counts: nothing of it runs) within `within_s`."""
  deadline = time.monotonic() + within_s
  while True:
    try:
      os.kill(pid, 0)
      with open(f"/proc/{pid}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
          return True
    except (ProcessLookupError, FileNotFoundError):
      return True
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)


def _pids(pool: EnvPool) -> list[int]:
  return [h["pid"] for h in pool.health()]


def test_echo_across_workers():
  with _pool(EchoEnv, 3) as pool:
    first = pool.reset([(i, _problem(i), i) for i in range(6)])
    assert [o.ok for o in first] == [True] * 6
    assert [o.value for o in first] == [f"prompt {i}" for i in range(6)]
    assert [h["episodes"] for h in pool.health()] == [2, 2, 2]
    for t, action in enumerate(["a", "bb", "stop"]):
      out = pool.step([(i, f"{action}{i}" if action != "stop" else action, "") for i in range(6)])
      for i, o in enumerate(out):
        text = f"{action}{i}" if action != "stop" else action
        assert o.ok and o.failure == "" and isinstance(o.value, base.Step), (t, i, o)
        assert o.value.observation == "echo:" + text
        assert o.value.reward == float(len(text))
        assert o.value.done is (action == "stop")
        assert o.seconds >= 0
    assert pool.step([(4, "x", ""), (1, "y", "")])[1].value.observation == "echo:y"  # matched by id, any order
    assert pool.stats["resets"] == 6 and pool.stats["steps"] == 20 and pool.stats["replaced"] == 0
    with pytest.raises(KeyError):
      pool.step([(99, "x", "")])
    with pytest.raises(ValueError):
      pool.step([(0, "x", ""), (0, "y", "")])
    with pytest.raises(ValueError):
      pool.step([(0, "x", "explode")])
    with pytest.raises(ValueError):
      pool.reset([(0, _problem(0), 0)])  # still open


def test_unloadable_environment_fails_at_construction():
  with pytest.raises(ValueError, match="NoSuchEnv"):
    EnvPool((__name__, "NoSuchEnv"), 1, TIMEOUT_S, TIMEOUT_S)


def test_step_exception_is_error_and_the_worker_goes_on():
  with _pool(RaiseInStepEnv, 1) as pool:
    pid = _pids(pool)[0]
    pool.reset([(0, _problem(0), 0), (1, _problem(1), 1)])
    out = pool.step([(0, "raise now", ""), (1, "fine", "")])
    assert not out[0].ok and out[0].failure == "error" and out[0].value is None
    assert "RuntimeError" in out[0].detail and "bad action 'raise now'" in out[0].detail
    assert "in step" in out[0].detail  # the traceback's last frame
    assert out[1].ok and out[1].value.observation == "echo:fine"
    again = pool.step([(0, "after", ""), (1, "more", "")])
    assert [o.value.observation for o in again] == ["echo:after", "echo:more"]
    assert _pids(pool) == [pid] and pool.stats["replaced"] == 0 and pool.stats["errors"] == 1


def test_reset_raising_is_reset_failure():
  with _pool(RaiseInResetEnv, 2) as pool:
    pids = _pids(pool)
    out = pool.reset([(0, _problem(0), 0), (1, _problem(1), 1)])
    assert [o.failure for o in out] == ["reset_failure", "reset_failure"]
    assert "ValueError: no such puzzle p0" in out[0].detail
    assert pool.step([(0, "x", "")])[0].failure == "reset_failure"  # a failed episode stays failed
    assert _pids(pool) == pids and pool.stats["reset_failures"] == 3


def test_real_hang_is_killed_and_replaced():
  with _pool(SleepyEnv, 2) as pool:
    pool.reset([(i, _problem(i), i) for i in range(4)])  # 0, 2 on the first worker; 1, 3 on the second
    old = _pids(pool)
    t0 = time.monotonic()
    out = pool.step([(0, "sleep", ""), (1, "a", ""), (3, "b", "")])
    elapsed = time.monotonic() - t0
    assert out[0].failure == "hang" and not out[0].ok
    assert out[0].seconds >= 0.9 * TIMEOUT_S
    assert out[1].ok and out[2].ok and out[2].value.observation == "echo:b"
    assert TIMEOUT_S * 0.9 <= elapsed < TIMEOUT_S + 2.0
    assert pool.stats["replaced"] >= 1 and pool.stats["hangs"] == 1
    new = _pids(pool)
    assert new[0] != old[0] and new[1] == old[1]
    assert _gone(old[0])
    later = pool.step([(2, "x", ""), (0, "y", ""), (1, "z", "")])
    assert (later[0].failure, later[0].detail) == ("crash", "worker replaced")  # lived on the hung worker
    assert later[1].failure == "crash" and later[2].ok
    fresh = pool.reset([(10, _problem(10), 0), (11, _problem(11), 1)])
    assert all(o.ok for o in fresh)


def test_reset_hang_and_the_resets_queued_behind_it():
  with _pool(SleepyEnv, 1) as pool:
    t0 = time.monotonic()
    out = pool.reset([(0, _problem(0, "sleep"), 0), (1, _problem(1), 1)])
    assert time.monotonic() - t0 < TIMEOUT_S + 2.0
    assert out[0].failure == "hang" and "during reset" in out[0].detail
    assert out[1].ok and out[1].value == "prompt 1"  # moved to the replacement worker
    assert pool.step([(0, "x", "")])[0].failure == "reset_failure"
    assert pool.step([(1, "y", "")])[0].value.observation == "echo:y"


def test_spawn_context():
  with _pool(EchoEnv, 2, context="spawn") as pool:
    pool.reset([(i, _problem(i), i) for i in range(2)])
    out = pool.step([(0, "x", "crash"), (1, "y", "")])
    assert out[0].failure == "crash" and out[1].value.observation == "echo:y"
    assert pool.reset([(5, _problem(5), 5)])[0].value == "prompt 5"  # on the replacement


def test_queued_requests_each_get_the_timeout():
  """Requests on one worker queue; each may take most of the timeout, though together they take longer."""
  with _pool(EchoEnv, 1) as pool:
    pool.reset([(i, _problem(i), i) for i in range(3)])
    t0 = time.monotonic()
    out = pool.step([(i, "x", "slow") for i in range(3)])
    assert all(o.ok for o in out), out
    assert time.monotonic() - t0 >= 1.4 * TIMEOUT_S
    assert pool.stats["replaced"] == 0


def test_batch_runs_workers_in_parallel():
  with _pool(EchoEnv, 4) as pool:
    pool.reset([(i, _problem(i), i) for i in range(4)])
    t0 = time.monotonic()
    out = pool.step([(i, "x", "slow") for i in range(4)])  # 0.5 s each, one per worker
    assert all(o.ok for o in out)
    assert time.monotonic() - t0 < 1.5  # the sum would be 2 s


def test_real_crash_is_replaced_and_the_pool_goes_on():
  with _pool(DyingEnv, 2) as pool:
    pool.reset([(i, _problem(i), i) for i in range(4)])
    old = _pids(pool)
    out = pool.step([(0, "die", ""), (1, "ok", "")])
    assert out[0].failure == "crash" and "exit code 13" in out[0].detail
    assert out[1].ok
    assert pool.stats["replaced"] == 1 and pool.stats["crashes"] == 1 and _pids(pool)[0] != old[0]
    assert pool.step([(2, "x", "")])[0].failure == "crash"
    fresh = pool.reset([(i, _problem(i), i) for i in range(10, 14)])
    assert all(o.ok for o in fresh)
    assert all(o.ok for o in pool.step([(i, "go", "") for i in range(10, 14)]))


def test_reset_crash_moves_the_worker_s_other_resets_to_its_replacement():
  with _pool(DyingEnv, 1) as pool:
    out = pool.reset([(0, _problem(0, "die"), 0), (1, _problem(1), 1), (2, _problem(2), 2)])
    assert out[0].failure == "reset_failure" and "exit code 13" in out[0].detail
    assert [o.value for o in out[1:]] == ["prompt 1", "prompt 2"]
    assert [o.value.observation for o in pool.step([(1, "a", ""), (2, "b", "")])] == ["echo:a", "echo:b"]


def test_injected_faults_report_what_happened():
  with _pool(EchoEnv, 3) as pool:
    pool.reset([(i, _problem(i), i) for i in range(3)])  # one per worker
    t0 = time.monotonic()
    out = pool.step([(0, "x", "crash"), (1, "y", "hang"), (2, "z", "slow")])
    assert time.monotonic() - t0 < TIMEOUT_S + 2.0
    assert out[0].failure == "crash" and "exit code 70" in out[0].detail
    assert out[1].failure == "hang"
    assert out[2].ok and out[2].value.observation == "echo:z" and out[2].seconds >= 0.4 * TIMEOUT_S
    assert pool.stats["replaced"] == 2


def test_heartbeat_catches_a_killed_worker_before_the_batch():
  with _pool(EchoEnv, 2, heartbeat_s=0.2) as pool:
    pool.reset([(i, _problem(i), i) for i in range(4)])
    victim = _pids(pool)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 5  # dead for good: reaped, all its threads gone (not only its main thread)
    while pool.health()[0]["alive"] and time.monotonic() < deadline:
      time.sleep(0.02)
    out = pool.step([(i, "x", "") for i in range(4)])
    assert [(o.failure, o.detail) for o in out[0::2]] == [("crash", "no heartbeat")] * 2
    assert all(o.ok for o in out[1::2])
    assert pool.stats["replaced"] == 1 and victim not in _pids(pool)


def test_heartbeat_catches_a_stopped_worker():
  with _pool(EchoEnv, 2, heartbeat_s=0.2) as pool:
    pool.reset([(i, _problem(i), i) for i in range(2)])
    victim = _pids(pool)[1]
    os.kill(victim, signal.SIGSTOP)
    time.sleep(1.5)  # 5 heartbeats missed
    assert pool.health()[1]["heartbeat_age_s"] > 1.0
    out = pool.step([(0, "x", ""), (1, "y", "")])
    assert out[0].ok and (out[1].failure, out[1].detail) == ("crash", "no heartbeat")
    assert _gone(victim) and victim not in _pids(pool)


def test_close_episodes_closes_the_environment(tmp_path):
  with _pool(EchoEnv, 1) as pool:
    markers = [tmp_path / f"closed{i}" for i in range(2)]
    pool.reset([(i, _problem(i, closed_marker=str(m)), i) for i, m in enumerate(markers)])
    t0 = time.monotonic()
    pool.close_episodes([0, 7])  # unknown ids are ignored
    assert time.monotonic() - t0 < 0.5
    deadline = time.monotonic() + 5
    while not markers[0].exists() and time.monotonic() < deadline:
      time.sleep(0.02)
    assert markers[0].exists() and not markers[1].exists()
    assert pool.health()[0]["episodes"] == 1
    with pytest.raises(KeyError):
      pool.step([(0, "x", "")])
    assert pool.step([(1, "y", "")])[0].ok
  assert markers[1].exists()  # close() closes what is still open


def test_close_reaps_every_worker_and_their_children():
  pool = _pool(ChildProcessEnv, 2)
  children = [int(o.value) for o in pool.reset([(i, _problem(i), i) for i in range(2)])]
  out = pool.step([(0, "x", "crash"), (1, "y", "")])  # the crashed worker's child is killed with it
  assert out[0].failure == "crash" and _gone(children[0])
  pids = _pids(pool)
  pool.close()
  pool.close()  # idempotent
  assert all(_gone(p, within_s=2.0) for p in pids + children[1:])
  with pytest.raises(RuntimeError):
    pool.step([(1, "x", "")])

  pool = _pool(EchoEnv, 2)
  pids = _pids(pool)
  del pool  # garbage collected: its finalizer stops the workers
  assert all(_gone(p) for p in pids)


def test_owner_killed_leaves_no_orphans():
  script = textwrap.dedent("""
    import os, signal
    from rl_lm.envs.workers import EnvPool
    pool = EnvPool(("rl_lm.envs.base", "Environment"), 2, 1.0, 1.0, heartbeat_s=0.2)
    print(" ".join(str(h["pid"]) for h in pool.health()), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
  """)
  root = str(Path(__file__).resolve().parents[1])
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=root,
                        env={**os.environ, "PYTHONPATH": root})
  assert proc.returncode == -signal.SIGKILL, proc.stderr
  pids = [int(p) for p in proc.stdout.split()]
  assert len(pids) == 2 and all(_gone(p) for p in pids)
