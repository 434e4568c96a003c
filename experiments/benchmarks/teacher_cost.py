"""What a distillation teacher costs: its resident bytes and the extra time of an RL step, in one run.

  python -m experiments.benchmarks.teacher_cost [--preset=tiny] [--teacher_dtype=bfloat16] [--rounds=3]

The fixed shape of `rl_step.py` (GRPO, 32 prompts x 8 samples, 16 prompt slots, 8 new tokens), on preset
`--preset`, with and without a teacher of the same preset (a random initialisation saved as a checkpoint: the
cost does not depend on the weights' values), `rl.distill.coef` 1. Two trainers are built once; `--rounds`
alternating rounds each time `--steps` steps of both after a warm-up step, and the medians over all timed steps
are compared: step and `prepare` seconds, where the teacher's forward runs. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import jax

from experiments.benchmarks.rl_step import bench_config
from rl_lm.checkpoint import Checkpointer
from rl_lm.models import build, presets
from rl_lm.train.context import make_context
from rl_lm.train.rl import RLTrainer


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="tiny")
  parser.add_argument("--teacher_dtype", default="bfloat16")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=3)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    trainers = {}
    for arm in ("without", "with"):
      config = bench_config()
      config.model.preset = args.preset
      ctx = make_context(config, f"{tmp}/{arm}")
      if arm == "with":
        with Checkpointer(f"{tmp}/teacher") as ckpt:
          ckpt.save(1, {"params": build.init_params(presets.get(args.preset), ctx.mesh, ctx.rules,
                                                    jax.random.key(1))})
        config.rl.distill.coef, config.teacher.init_from = 1.0, f"{tmp}/teacher"
        config.teacher.param_dtype = args.teacher_dtype
      trainers[arm] = RLTrainer(ctx, log=print if arm == "with" else (lambda _: None))
      trainers[arm].train_step(1)  # compiles
    times: dict[str, dict[str, list[float]]] = {arm: {"step": [], "prepare": []} for arm in trainers}
    step = 2
    for _ in range(args.rounds):
      for arm, trainer in trainers.items():
        for _ in range(args.steps):
          m = trainer.train_step(step)
          times[arm]["step"].append(m["perf/time_total_s"])
          times[arm]["prepare"].append(m["perf/time_prepare_s"])
        step += 1
    frozen = trainers["with"].teacher
    for trainer in trainers.values():
      trainer.source.close()
  print(f"\njax {jax.__version__} on {jax.devices()[0].platform}; preset {args.preset}, teacher "
        f"{args.teacher_dtype}: {frozen.num_params:,} parameters, {frozen.nbytes / 2**20:.1f} MiB resident "
        f"({frozen.per_device / 2**20:.1f} MiB on a device)")
  print("phase | without a teacher (s) | with (s) | with / without")
  for phase in ("prepare", "step"):
    a, b = (statistics.median(times[arm][phase]) for arm in ("without", "with"))
    print(f"{phase} | {a:.3f} | {b:.3f} | {b / a:.2f}x")


if __name__ == "__main__":
  main()
