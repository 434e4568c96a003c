"""What a frozen teacher or judge costs: its resident bytes and the extra time of an RL step, in one run.

  python -m experiments.benchmarks.teacher_cost [--frozen=teacher] [--loss=reward] [--preset=tiny] [--prompts=32]
      [--dtype=bfloat16] [--rounds=3] [--steps=3] [--json=PATH]

The fixed shape of `rl_step.py` (GRPO, `--prompts` x 8 samples, 16 prompt slots, 8 new tokens, the char tokenizer),
and a frozen model of preset `--preset` (a random initialisation saved as a checkpoint: the cost does not depend on
the weights' values), stored in `--dtype` and loaded as a run loads it (its resident bytes are the loader's):
- `--frozen=teacher`: a distillation teacher, `rl.distill.coef` 1, `rl.distill.loss` `--loss` (the per-token
  reward, or the GKD divergence "jsd"); the policy is of the same preset (a teacher shares its student's
  vocabulary). Two trainers, without and with it, are built once; each round times `--steps` steps of both. The
  teacher's forward is its own call, timed in the prepare phase; with "jsd" the update makes the teacher's logits
  from its hidden states, chunk by chunk beside the student's.
- `--frozen=judge`: the pointwise judge reward (`judge`, the default rubric) for a tiny policy. The judge's cost is
  its reward call on the step's rows, in the scoring phase: each round times `--steps` steps of the trainer
  without a judge, then `--steps` calls of the judge on as many rows (the task's prompts and random completions of
  `max_new_tokens` characters the char tokenizer spells: a random policy's ids past the alphabet are unreadable,
  a valid 0 the judge never runs). `judge.rows` is the step's rows up to 64; each forward is as wide as the next
power of two of its longest prompt (128 tokens here).
After a warm-up step (and call), the medians over all timed steps are compared. Printed, never asserted; `--json`
writes the medians (`<arm>_<phase>_s`) for `experiments.benchmarks.ab`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import jax
import numpy as np

from experiments.benchmarks.rl_step import bench_config
from rl_lm.checkpoint import Checkpointer
from rl_lm.models import build, presets
from rl_lm.rewards.judge import PointwiseJudge
from rl_lm.train import teacher as teacher_lib
from rl_lm.train.context import make_context
from rl_lm.train.rl import RLTrainer
from rl_lm.train.source import task_from_config

ALPHABET = "0123456789+-*= "


def _judge_call(config: Any, ctx: Any) -> Any:
  """A zero-argument call of the pointwise judge on one step's rows (readable completions), timed by the caller."""
  judge = PointwiseJudge(teacher_lib.load_judge(config, ctx, lambda _: None), config.judge.rubric,
                         config.judge.scale, config.judge.min_mass)
  rows = config.rl.prompts_per_step * config.rl.group_size
  problems = [p for p in task_from_config(config).train_problems(config.rl.prompts_per_step, seed=0)
              for _ in range(config.rl.group_size)]
  rng = np.random.default_rng(0)
  completions = ["".join(rng.choice(list(ALPHABET), config.sampling.max_new_tokens)) for _ in range(rows)]

  def call() -> None:
    results = judge.batch(problems, completions)
    assert all(r.valid for r in results), "the benchmark's rows must all be judged"

  return call


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--frozen", default="teacher", choices=("teacher", "judge"))
  parser.add_argument("--loss", default="reward", choices=("reward", "jsd"), help="the teacher's rl.distill.loss")
  parser.add_argument("--preset", default="tiny", choices=presets.names(), help="the frozen model's")
  parser.add_argument("--prompts", type=int, default=32, help="prompts per step (8 samples each)")
  parser.add_argument("--dtype", default="bfloat16", help="the frozen model's parameter dtype")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--json", default="", help="write the medians here")
  args = parser.parse_args()
  policy = args.preset if args.frozen == "teacher" else "tiny"
  with tempfile.TemporaryDirectory() as tmp:
    trainers, frozen, judge_call = {}, None, None
    for arm in ("without", "with"):
      config = bench_config(prompts=args.prompts)
      config.model.preset = policy
      if arm == "with":
        section = config.teacher if args.frozen == "teacher" else config.judge
        section.init_from, section.preset, section.param_dtype = f"{tmp}/frozen", args.preset, args.dtype
        config.rl.distill.coef = 1.0 if args.frozen == "teacher" else 0.0
        config.rl.distill.loss = args.loss
        config.judge.min_mass, config.judge.rows = 0.0, min(64, args.prompts * config.rl.group_size)
      ctx = make_context(config, f"{tmp}/{arm}")
      if arm == "with":
        with Checkpointer(f"{tmp}/frozen") as ckpt:
          ckpt.save(1, {"params": build.init_params(presets.get(args.preset), ctx.mesh, ctx.rules,
                                                    jax.random.key(1))})
        frozen = teacher_lib.load(config, ctx, print, args.frozen)  # its resident bytes, as a run loads it
        if args.frozen == "judge":
          judge_call = _judge_call(config, ctx)
          judge_call()  # compiles
          continue
      trainers[arm] = RLTrainer(ctx, log=lambda _: None)
      trainers[arm].train_step(1)  # compiles
    phases = ("scoring", "prepare", "update", "step")
    times: dict[str, dict[str, list[float]]] = {arm: {p: [] for p in phases} for arm in ("without", "with")}
    step = 2
    for _ in range(args.rounds):
      for arm, trainer in trainers.items():
        for _ in range(args.steps):
          m = trainer.train_step(step)
          for phase in phases:
            times[arm][phase].append(m[f"perf/time_{'total' if phase == 'step' else phase}_s"])
          step += 1
      for _ in range(args.steps if judge_call else 0):
        start = time.perf_counter()
        judge_call()
        times["with"]["scoring"].append(time.perf_counter() - start)
    for trainer in trainers.values():
      trainer.source.close()
  assert frozen is not None
  print(f"\njax {jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}; policy {policy}, "
        f"{args.prompts * 8} rows a step; {args.frozen} {args.preset} in {args.dtype}"
        f"{f' (loss {args.loss})' if args.frozen == 'teacher' else ''}: {frozen.num_params:,} "
        f"parameters, {frozen.nbytes / 2**20:.1f} MiB resident ({frozen.per_device / 2**20:.1f} MiB on a device)")
  med = lambda arm, phase: statistics.median(times[arm][phase])  # noqa: E731
  k = args.steps

  def per_round(ratio: Any) -> str:  # the ratio of each round's medians: the run's range
    return ", ".join(f"{ratio(i):.2f}" for i in range(args.rounds))

  round_med = lambda arm, phase, i: statistics.median(times[arm][phase][i * k: (i + 1) * k])  # noqa: E731
  if args.json:
    with open(args.json, "w") as f:
      json.dump({f"{arm}_{phase}_s": med(arm, phase) for arm in times for phase in phases if times[arm][phase]}, f)
  if judge_call:
    step, judge = med("without", "step"), med("with", "scoring")
    print(f"step without the judge {step:.3f} s; the judge's call on its {args.prompts * 8} rows {judge:.3f} s: "
          f"with / without {(step + judge) / step:.2f}x (rounds: "
          f"{per_round(lambda i: 1 + round_med('with', 'scoring', i) / round_med('without', 'step', i))})")
    return
  print(f"phase | without the {args.frozen} (s) | with (s) | with - without (s) | with / without")
  for phase in phases:
    a, b = med("without", phase), med("with", phase)
    rounds = per_round(lambda i, p=phase: round_med("with", p, i) / round_med("without", p, i))
    print(f"{phase} | {a:.3f} | {b:.3f} | {b - a:+.3f} | {b / a:.2f}x (rounds: {rounds})")


if __name__ == "__main__":
  main()
