"""Host<->device transfers of one RL step, counted: every `mesh_lib.put` and `mesh_lib.fetch` call (and the arrays
in it) of a step after warm-up steps, run under `jax.transfer_guard("disallow")` so that nothing implicit is
missed, and, with an environment, the episode runner's device calls (one per round of turns).

  python -m experiments.benchmarks.transfers --config=configs/default.py
  python -m experiments.benchmarks.transfers --config=configs/calculator.py \
      --init_from=<a calculator run>/checkpoints/sft [--override=sampling.slots=32 --override=rl.max_staleness=1]

Counts, not times: they do not depend on the machine. They do depend on the policy where episodes are run (how
many turns it takes), hence `--init_from` (an SFT checkpoint) for a realistic multi-turn step.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from typing import Any

import jax

from rl_lm import mesh as mesh_lib
from rl_lm.sweep import config_module
from rl_lm.train import rl as rl_lib
from rl_lm.train import stage_run
from rl_lm.train.context import make_context


def load_config(spec: str) -> Any:
  """`get_config(variant)` of a `path[:variant]` config file."""
  path, _, variant = spec.partition(":")
  module = config_module(path)
  return module.get_config(variant) if variant else module.get_config()


def _set(config: Any, override: str) -> None:
  key, value = override.split("=", 1)
  *path, last = key.split(".")
  node = config
  for part in path:
    node = node[part]
  node[last] = type(node[last])(value)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True, help="a config file, optionally with its variant: path[:variant]")
  parser.add_argument("--init_from", default="", help="the policy's checkpoint folder (rl.init_from)")
  parser.add_argument("--override", action="append", default=[], help="key=value, repeatable")
  parser.add_argument("--warmup", type=int, default=2)
  args = parser.parse_args()
  config = load_config(args.config)
  for override in args.override:
    _set(config, override)
  config.rl.steps = args.warmup + 2  # sampling ahead never passes the last step
  counts: collections.Counter = collections.Counter()
  put, fetch = mesh_lib.put, mesh_lib.fetch

  def counted_put(x: Any, sharding: Any) -> Any:
    counts["put"] += 1
    counts["put arrays"] += len(jax.tree.leaves(x))
    return put(x, sharding)

  def counted_fetch(tree: Any) -> Any:
    counts["fetch"] += 1
    counts["fetch arrays"] += len(jax.tree.leaves(tree))
    return fetch(tree)

  with tempfile.TemporaryDirectory() as workdir:
    ctx = make_context(config, workdir)
    if args.init_from:
      ctx.policy = stage_run.start_params(ctx, args.init_from, "rl")
    trainer = rl_lib.RLTrainer(ctx, log=lambda *_: None)
    try:
      for step in range(1, args.warmup + 1):
        trainer.train_step(step)
      agent = trainer.source.agent
      if agent is not None:
        advance = agent.train._advance

        def counted_advance(*a: Any) -> Any:
          counts["runner device calls"] += 1
          return advance(*a)

        agent.train._advance = counted_advance
      mesh_lib.put, mesh_lib.fetch = counted_put, counted_fetch
      try:
        with jax.transfer_guard("disallow"):
          metrics = trainer.train_step(args.warmup + 1)
      finally:
        mesh_lib.put, mesh_lib.fetch = put, fetch
    finally:
      trainer.source.close()
  rows = trainer.source.B
  extra = f", {metrics['episodes/turns_mean']:.2f} turns an episode" if "episodes/turns_mean" in metrics else ""
  print(f"{args.config} {' '.join(args.override)}: one step of {rows} rows{extra}")
  print(f"host -> device: {counts['put']} puts ({counts['put arrays']} arrays); device -> host: {counts['fetch']} "
        f"fetches ({counts['fetch arrays']} arrays)" + (f"; the episode runner's device calls: "
                                                        f"{counts['runner device calls']}" if extra else ""))


if __name__ == "__main__":
  main()
