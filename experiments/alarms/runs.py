"""The labelled run set the alarms are calibrated on: healthy runs of three configs and induced failures.

Every run is `python -m rl_lm.main --config=<config> --workdir=<dir>/<name> <overrides>`, with a held-out
evaluation every few steps (`eval.every`) so that the step where a failure shows can be read off. Healthy runs
are the configs as shipped (plus that evaluation); each failure changes the default GRPO run (or the RLHF PPO
run) in one named way, seed 0, and says what goes wrong and why.
"""

from __future__ import annotations

import dataclasses

from rl_lm.runs import ROOT

CONFIGS = {"default": "configs/default.py", "ppo": "configs/ppo.py", "rlhf": "configs/rlhf_ppo.py"}
EVAL_EVERY = {"default": 5, "ppo": 5, "rlhf": 10}  # held-out evaluation interval of the set's runs, steps
SEEDS = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Run:
  """One labelled run.

  Attributes:
    name: its folder under the set's workdir.
    family: the healthy config it is compared with ("default", "ppo", "rlhf").
    overrides: `--config.` overrides beside the seed and the evaluation interval.
    healthy: the label.
    cause: for a failure, what was broken and what it is expected to do.
    seed: the run's seed.
  """

  name: str
  family: str
  overrides: tuple[tuple[str, object], ...] = ()
  healthy: bool = True
  cause: str = ""
  seed: int = 0
  config_file: str = ""  # a config of its own instead of the family's (relative to the project root)

  @property
  def config(self) -> str:
    return str(ROOT / (self.config_file or CONFIGS[self.family]))

  def flags(self, smoke: bool = False) -> list[str]:
    """The command line's overrides (seed, evaluation interval, the run's own, wandb off)."""
    items = [("seed", self.seed), ("eval.every", 1 if smoke else EVAL_EVERY[self.family]), *self.overrides,
             ("logging.wandb_mode", "disabled")]
    return [f"--config.{k}={v}" for k, v in items]


FAILURES = (
  Run("fail_lr30", "default", (("rl.learning_rate", 3e-3),), False,
      "learning rate x30 (3e-3 instead of 1e-4): updates overshoot, the policy collapses"),
  Run("fail_entropy", "default", (("sampling.temperature", 0.3),), False,
      "sampling temperature 0.3 and no entropy bonus: the tempered policy sharpens onto few answers, "
      "exploration stops"),
  Run("fail_kl_runaway", "rlhf", (("rl.kl.coef", 0.0),), False,
      "KL coefficient 0 against the learned reward: over-optimisation, the proxy rises while the gold falls"),
  Run("fail_length", "default", (("sampling.max_new_tokens", 16),), False,
      "a length-rewarding bug (the length reward with +1 per character where a penalty was meant) and no "
      "overlong handling: completions grow to the budget and stop being answers",
      config_file="experiments/alarms/length_bug.py"),
  Run("fail_broken_verifier", "default", (("reward.weights.correctness", 0.0),), False,
      "a broken verifier (the correctness weight 0): every reward is 0, nothing is learned"),
  Run("fail_mismatch", "default", (("rl.sampler_dtype", "bfloat16"), ("rl.correction.cap", 0.0),
                                   ("rl.learning_rate", 1e-3)), False,
      "sampler/trainer mismatch: a bfloat16 sampler, no truncated importance sampling, learning rate x10"),
)


def run_set() -> list[Run]:
  """The failures first (seed 0), then the 9 healthy runs."""
  healthy = [Run(f"{family}_s{seed}", family, seed=seed) for family in CONFIGS for seed in SEEDS]
  return [*FAILURES, *healthy]
