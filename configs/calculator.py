"""The tiny model learns to call a calculator: three-digit products it cannot do in its head (issue 15's demo).

  python -m rl_lm.main --config=configs/calculator.py --workdir=/tmp/rl_lm/calculator

Stages: SFT on demonstrations of two kinds (rl_lm/tasks/products.py): half call the calculator
(`[calc(347*862)]`, read its answer, copy it), half write the product straight away. The tiny model cannot
multiply three-digit numbers, so imitating the second kind it guesses; GRPO over whole episodes
(rl_lm/envs/calculator.py: reward 1 for the exact product) teaches it to reach for the tool. Held-out pass@k
and greedy accuracy over episodes before and after RL, with the tool-call rate, turns and failure classes
(episodes/*) every step.

Variants: `smoke` (seconds, for tests), `faults` (injected crashes, hangs and slow steps that cost about 10% of
the episodes: the classifier's precision and recall, and learning with broken environments masked), `local`
(environments in this process), `compose` (continuous batching over the episodes and sampling one step ahead).

Sweep (`sweep()`: fault-free and faults, seeds 0-2; experiments/agents/README.md has the table):

  python -m rl_lm.sweep --config=configs/calculator.py --workdir=/tmp/rl_lm/calculator_sweep --parallel=2 \
    --metrics=before:pass@1,after:pass@1,after:tool_call_rate
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import base_config

# About 10% of episodes lost to environment faults: a crash or hang takes down the episodes its worker holds (8 of
# the 128 with 16 workers), so the per-step rates are small; slow steps (1 s, answered) cost time, not episodes.
FAULTS = {"env.workers": 16, "env.step_timeout_s": 2.0, "env.faults.crash": 0.006, "env.faults.hang": 0.003,
          "env.faults.slow": 0.04}

# Continuous batching over the episodes (32 cache rows for the 128 episodes of a step) and each step's episodes
# sampled ahead by the policy one update old: the features single-turn runs have, in an agent run.
COMPOSE = {"sampling.slots": 32, "rl.max_staleness": 1}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = base_config()
  config.stages = ("sft", "rl")
  config.model.preset = "tiny"
  config.task.name = "products"
  config.task.digits = 3
  config.task.test_fraction = 0.2
  config.task.tool_demos = 0.5
  config.task.eval_size = 100
  config.env.name = "calculator"
  config.env.max_turns = 3
  config.env.turn_tokens = 16  # "[calc(999*999)]" and its stop token
  config.env.max_tokens = 64
  config.env.workers = 2
  config.env.step_timeout_s = 5.0
  config.sampling.max_new_tokens = 16
  config.sft.steps = 300
  config.sft.max_len = 48
  config.rl.algorithm = "grpo"
  config.rl.steps = 40
  config.rl.prompts_per_step = 16
  config.rl.group_size = 8
  config.rl.max_prompt_len = 12
  config.rl.minibatches = 4
  config.rl.learning_rate = 1e-4
  config.rl.kl.coef = 0.01
  config.eval.num_samples = 8
  config.eval.rows = 128
  if arg == "smoke":
    config.model.preset = "test"
    config.sft.steps = 10
    config.sft.log_every = 5
    config.rl.steps = 2
    config.rl.prompts_per_step = 4
    config.rl.group_size = 4
    config.rl.minibatches = 1
    config.task.pool_size = 100
    config.task.eval_size = 8
    config.eval.num_samples = 2
    config.eval.rows = 16
    config.env.workers = 1
  elif arg == "faults":
    config.update_from_flattened_dict(FAULTS)
  elif arg == "local":
    config.env.workers = 0
  elif arg == "compose":
    config.update_from_flattened_dict(COMPOSE)
  elif arg:
    raise ValueError(f"configs/calculator.py: unknown variant {arg!r}; known: smoke, faults, local, compose")
  return config


def sweep(arg: str | None = None) -> list[dict]:
  """Fault-free against injected faults (FAULTS), seeds 0, 1, 2: learning with broken environments masked."""
  del arg
  return [{"seed": seed, **faults} for faults in ({}, FAULTS) for seed in (0, 1, 2)]
