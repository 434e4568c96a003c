"""Environment worker pool throughput (rl_lm/envs/workers.py): resets/s and steps/s of an echo environment with
1, 2 and 4 workers, and what replacing a worker costs with each start method.

    python -m experiments.benchmarks.env_workers [--episodes=1000] [--steps=4] [--workers=1,2,4] [--rounds=10]

Throughput: `--episodes` episodes reset in one batch, then `--steps` step batches over all of them, then closed;
the environment does no work (the prompt back, "echo:" + action), so the figures are the pool's own cost per
request (pickling, the pipe, the round trip) and its ceiling. The same with each reset and step waiting 1 ms
(`time.sleep`, as a tool call waits on I/O) shows the workers overlapping. Replacement: on a 1-worker pool, an injected
"crash" followed by a reset of a new episode, which waits for the replacement worker to be ready; the median of
`--rounds`, for "forkserver" (a fork of the server, which preloads the modules) and "spawn" (a fresh
interpreter), each in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rl_lm.envs import base  # noqa: E402
from rl_lm.envs.workers import EnvPool  # noqa: E402
from rl_lm.tasks.base import Problem  # noqa: E402

MODULE = "experiments.benchmarks.env_workers"  # by name: run with -m, this module is __main__
WHERE = (MODULE, "EchoEnv")


class EchoEnv(base.Environment):
  def reset(self, problem, rng):
    return problem.prompt

  def step(self, action):
    return base.Step(observation="echo:" + action, reward=float(len(action)), done=False)


class WaitingEchoEnv(EchoEnv):
  def reset(self, problem, rng):
    time.sleep(0.001)
    return super().reset(problem, rng)

  def step(self, action):
    time.sleep(0.001)
    return super().step(action)


def _problems(n: int) -> list[Problem]:
  return [Problem(id=f"p{i}", prompt=f"What is {i} + {i}?", answer=str(2 * i), task="arithmetic") for i in range(n)]


def throughput(env: str, workers: int, episodes: int, steps: int) -> dict:
  problems = _problems(episodes)
  with EnvPool((MODULE, env), workers, step_timeout_s=30.0, reset_timeout_s=30.0) as pool:
    t0 = time.perf_counter()
    out = pool.reset([(i, p, i) for i, p in enumerate(problems)])
    reset_s = time.perf_counter() - t0
    assert all(o.ok for o in out)
    t0 = time.perf_counter()
    for t in range(steps):
      out = pool.step([(i, f"answer {i} turn {t}", "") for i in range(episodes)])
      assert all(o.ok for o in out)
    step_s = time.perf_counter() - t0
    pool.close_episodes(range(episodes))
  return dict(workers=workers, resets_per_s=episodes / reset_s, steps_per_s=episodes * steps / step_s)


def replacement(context: str, rounds: int) -> dict:
  problems = _problems(rounds + 1)
  t0 = time.perf_counter()
  with EnvPool(WHERE, 1, step_timeout_s=30.0, reset_timeout_s=30.0, context=context) as pool:
    start_s = time.perf_counter() - t0
    times = []
    for r in range(rounds):
      assert pool.reset([(r, problems[r], r)])[0].ok
      assert pool.step([(r, "x", "crash")])[0].failure == "crash"
      t0 = time.perf_counter()
      assert pool.reset([(r + 1000, problems[r + 1], r)])[0].ok  # waits for the replacement
      times.append(time.perf_counter() - t0)
      pool.close_episodes([r, r + 1000])
  return dict(context=context, first_pool_s=start_s, replacement_ms=1000 * statistics.median(times))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--episodes", type=int, default=1000)
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--workers", default="1,2,4")
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--replacement_only", default="", help=argparse.SUPPRESS)  # a context: one fresh process
  args = parser.parse_args()
  if args.replacement_only:
    print(json.dumps(replacement(args.replacement_only, args.rounds)))
    return
  print(f"{args.episodes} episodes x {args.steps} steps, forkserver")
  print("| environment | workers | resets/s | steps/s |")
  print("|--|--:|--:|--:|")
  for env, label in (("EchoEnv", "echo"), ("WaitingEchoEnv", "echo + 1 ms wait")):
    for w in [int(x) for x in args.workers.split(",")]:
      r = throughput(env, w, args.episodes, args.steps)
      print(f"| {label} | {w} | {r['resets_per_s']:,.0f} | {r['steps_per_s']:,.0f} |", flush=True)
  print()
  print(f"replacing a crashed worker (median of {args.rounds}; a fresh process per start method)")
  print("| context | first pool (s) | replacement (ms) |")
  print("|--|--:|--:|")
  for context in ("forkserver", "spawn"):
    cmd = [sys.executable, "-m", "experiments.benchmarks.env_workers", f"--replacement_only={context}",
           f"--rounds={args.rounds}"]
    r = json.loads(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    print(f"| {context} | {r['first_pool_s']:.2f} | {r['replacement_ms']:.0f} |", flush=True)


if __name__ == "__main__":
  main()
