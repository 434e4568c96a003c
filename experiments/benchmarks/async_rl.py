"""Rollouts sampled ahead (`config.rl.max_staleness`): completion tokens/s and the step's time split at staleness
0, 1 and 2, alternating fresh processes, in one run.

  python -m experiments.benchmarks.async_rl [--tasks=default,code] [--staleness=0,1,2] [--steps=6] [--warmup=2]
                                            [--rounds=3]

Tasks:
- default: `configs/default.py`'s RL stage (tiny model, arithmetic, exact verifier: scoring takes milliseconds),
  from random weights (timing only).
- code: HumanEval prompts (data/humaneval: the 45 in ASCII under 300 characters) scored by running each
  completion against the problem's tests in the code sandbox (`reward.weights = {"code": 1.0}`, one sandbox
  worker); 8 prompts x 4 samples, 128 new tokens; tiny character model from random weights: its completions are
  junk, but each still costs a sandboxed run, which is what makes scoring slow. HumanEval has no training split;
  here its problems are the training pool, for timing only (nothing is evaluated).

Each (task, staleness, round) is a fresh process: `--warmup` steps (compilation), then `--steps` timed steps of
`RLTrainer.train_step`, with `rl.steps` = warmup + steps so the pipeline drains at the end. Reported: completion
tokens/s over the timed steps (completion tokens of the trained rollouts / wall time), and the host's time per
step in each phase, as `train_step` times them:
- sampling: the host waiting for a rollout's tokens (at staleness s > 0 the rollout was dispatched s steps ago);
- scoring: the host running the verifier (the device samples ahead meanwhile when s > 0);
- prepare, update: the host waiting for the device's prepare and update (at s > 0 they queue behind the
  rollout being sampled ahead, so part of the sampling time shows up here);
- other: the rest of the step (curriculum, metrics).
And the share of the machine's cores kept busy over the timed steps (CPU seconds of this process's threads and of
the sandbox's finished processes / (wall seconds x cores)): overlapping can only fill the idle share, so
1 / cores busy at staleness 0 bounds what it can gain on this machine.
On this CPU the device and the host share two cores: what overlapping wins is mostly the host's scoring time.
Medians over rounds; the ratio to staleness 0 is the figure to read on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PHASES = ("sampling", "scoring", "prepare", "update")


def config(task: str, staleness: int, steps: int):
  from configs import default

  c = default.get_config()
  c.stages = ("rl",)
  c.rl.steps = steps
  c.rl.max_staleness = staleness
  c.eval.every = 0
  c.logging.wandb_mode = "disabled"
  c.logging.tensorboard = False
  if task == "code":
    c.task.name = "humaneval"
    c.reward.weights = {"code": 1.0}
    c.rl.max_prompt_len = 300  # characters, bos included: the HumanEval prompts that fit
    c.rl.prompts_per_step = 8
    c.rl.group_size = 4
    c.sampling.max_new_tokens = 128
    c.rl.curriculum.enabled = False
  return c


def _cpu_seconds() -> float:
  """CPU seconds of this process (every thread: the host's Python and XLA's) and of its finished children (the
  sandbox's processes)."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


def child(task: str, staleness: int, warmup: int, steps: int) -> dict:
  import jax

  from rl_lm.train import rl as rl_lib
  from rl_lm.train.context import make_context

  if task == "code":  # HumanEval has no training split: its problems stand in as the pool (timing only)
    real = rl_lib.task_from_config

    def ascii_task(c):  # the problems the character tokenizer can encode
      t = real(c)
      kept = [p for p in t.test_problems() if all(ch == "\n" or 32 <= ord(ch) < 127 for ch in p.prompt)]
      t.test_problems = lambda n=None, seed=0: kept[:n] if n else kept
      return t

    rl_lib.task_from_config = ascii_task
    rl_lib.training_pool = lambda t, size, seed: t.test_problems()
  c = config(task, staleness, warmup + steps)
  with tempfile.TemporaryDirectory() as workdir:
    trainer = rl_lib.RLTrainer(make_context(c, workdir), log=lambda _: None)
    for step in range(1, warmup + 1):
      trainer.train_step(step)
    jax.block_until_ready(trainer.state)
    phases = {p: 0.0 for p in PHASES}
    cpu0 = _cpu_seconds()
    tokens, start = 0, time.perf_counter()
    for step in range(warmup + 1, warmup + steps + 1):
      m = trainer.train_step(step)
      tokens += m["rollout/response_length_mean"] * trainer.B
      for p in PHASES:
        phases[p] += m.get(f"perf/time_{p}_s", 0.0)
    wall = time.perf_counter() - start
    busy = (_cpu_seconds() - cpu0) / (wall * len(os.sched_getaffinity(0)))
  return {"tokens_per_s": tokens / wall, "step_s": wall / steps, "cores_busy": busy,
          **{f"{p}_s": v / steps for p, v in phases.items()}, "staleness_mean": m["offpolicy/staleness_mean"]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tasks", default="default,code")
  parser.add_argument("--staleness", default="0,1,2")
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    task, s = args.child.split(":")
    print(json.dumps(child(task, int(s), args.warmup, args.steps)))
    return
  tasks, levels = args.tasks.split(","), [int(s) for s in args.staleness.split(",")]
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  runs: dict[tuple[str, int], list[dict]] = {(t, s): [] for t in tasks for s in levels}
  for r in range(args.rounds):
    for task in tasks:
      for s in (levels if r % 2 == 0 else levels[::-1]):  # alternate the order between rounds
        cmd = [sys.executable, "-m", "experiments.benchmarks.async_rl", f"--child={task}:{s}",
               f"--warmup={args.warmup}", f"--steps={args.steps}"]
        out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root})
        if out.returncode:
          raise SystemExit(f"{task} at staleness {s} failed:\n{out.stderr[-3000:]}")
        runs[task, s].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1} {task} staleness {s}: {runs[task, s][-1]['tokens_per_s']:,.0f} completion tokens/s",
              flush=True)
  print("\ntask | staleness | completion tokens/s (median) | vs staleness 0 | step s | sampling | scoring | prepare "
        "| update | other (s per step) | cores busy")
  print("--- | --- | --- | --- | --- | --- | --- | --- | --- | --- | ---")
  for task in tasks:
    med = lambda s, k, task=task: statistics.median(x[k] for x in runs[task, s])
    for s in levels:
      other = med(s, "step_s") - sum(med(s, f"{p}_s") for p in PHASES)
      rate, ratio = med(s, "tokens_per_s"), med(s, "tokens_per_s") / med(levels[0], "tokens_per_s")
      split = " | ".join(f"{med(s, f'{p}_s'):.3f}" for p in PHASES)
      busy = med(s, "cores_busy")
      print(f"{task} | {s} | {rate:,.0f} | {ratio:.2f}x | {med(s, 'step_s'):.3f} | {split} | {other:.3f} | {busy:.0%}")


if __name__ == "__main__":
  main()
