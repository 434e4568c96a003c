"""The configuration schema shared by every `configs/*.py`, and its validation.

Each section is a dataclass (rl_lm/config/run.py, train.py, rl.py) whose fields hold their default, comment
and allowed values side by side (rl_lm/config/section.py); a field that names a registered part (stage, task,
reward, environment, advantage estimator, policy loss) allows what its registry holds (rl_lm/registry.py).
`base_config()` builds the ConfigDict a config file starts from out of those defaults. `validate(config)` runs
before anything is compiled and raises `ConfigError` naming the offending key: every float must be finite (the
fields whose allowed interval closes on "inf]" may be +inf, see ALLOW_INF), each section the run reads must build
from its ConfigDict section, and the rules between sections must hold (rl_lm/config/cross.py).
"""

from __future__ import annotations

import ml_collections

from rl_lm.config import cross
from rl_lm.config.cross import data_parallelism
from rl_lm.config.flags import explain_flag_error
from rl_lm.config.rl import AlarmConfig, CurriculumConfig, Env, Eval, Judge, Rl, Teacher
from rl_lm.config.run import DTYPES, WANDB_MODES, Checkpoint, Logging, Mesh, Model, Run, Sample, Sampling
from rl_lm.config.section import ConfigError, Section
from rl_lm.config.train import Cai, Dpo, Preferences, Reward, RewardModel, Sft, Task

# The top-level fields (Run) and then each top-level section; nested ones (rl.kl, ...) come with their parent.
SECTIONS: tuple[type[Section], ...] = (Run, Checkpoint, Logging, Model, Mesh, Sampling, Sample, Task, Reward, Sft, Cai,
                                       Preferences, RewardModel, Dpo, Rl, Teacher, Judge, Env, Eval)
# Float fields that may be +inf (their comment says what inf means); every other float must be finite.
ALLOW_INF = frozenset(key for cls in SECTIONS for key in cls.inf_keys())


def base_config() -> ml_collections.ConfigDict:
  """Every field a run reads, with its default."""
  config = Run.config_dict()
  for cls in SECTIONS[1:]:
    config[cls.KEY] = cls.config_dict()
  return config


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises ConfigError (naming the key) for any impossible value. Compiles nothing."""
  if num_devices is None:
    import jax

    num_devices = jax.device_count()
  cross.check_finite(config, ALLOW_INF)
  stages = set(Run.from_section(config).stages)
  for cls in SECTIONS[1:]:
    if not cls.STAGES or stages & set(cls.STAGES):
      cls.from_section(config[cls.KEY])
  cross.check(config, num_devices)


__all__ = ["ALLOW_INF", "DTYPES", "SECTIONS", "WANDB_MODES", "AlarmConfig", "ConfigError", "CurriculumConfig",
           "Sampling", "Section", "base_config", "data_parallelism", "explain_flag_error", "validate"]
