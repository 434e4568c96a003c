"""The stages a run can chain (`config.stages`), by name. Each takes the run's Context and leaves
its policy in `ctx.policy` for the next.

Stages are registered in `STAGES` (rl_lm/registry.py), which makes the name valid in `config.stages`:

  @stages.register("my_stage")
  def my_stage(ctx: Context) -> Any: ...

`rl_lm.main` runs `STAGES[name](ctx)` for each name in `config.stages`, in order. The built-in stages import
their trainers when they run, so that validating `config.stages` against this registry (rl_lm.config does, for
every run and every bad config) loads nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rl_lm.registry import Registry

if TYPE_CHECKING:
  from rl_lm.train.context import Context

Stage = Callable[["Context"], Any]
STAGES: Registry[Stage] = Registry("stage")


def register(name: str) -> Callable[[Stage], Stage]:
  """Decorator: `config.stages` may name the decorated stage function, run with the run's Context."""
  return STAGES.register(name)


@register("sample")
def _sample(ctx: Context) -> Any:
  from rl_lm.train import sample

  return sample.run(ctx)


@register("sft")
def _sft(ctx: Context) -> Any:
  from rl_lm.train import sft, source

  return sft.train(ctx, source.task_from_config(ctx.config), ctx.config.sft)


@register("teacher_sft")
def _teacher_sft(ctx: Context) -> Any:
  """Off-policy distillation: SFT on a frozen teacher's samples (`config.teacher`; rl_lm/train/offpolicy.py)."""
  from rl_lm.train import offpolicy, source

  return offpolicy.train(ctx, source.task_from_config(ctx.config))


@register("cai_sft")
def _cai_sft(ctx: Context) -> Any:
  """Constitutional AI, supervised: SFT on the policy's own critiqued revisions (rl_lm/train/constitution.py)."""
  from rl_lm.train import constitution, source

  return constitution.train(ctx, source.task_from_config(ctx.config))


@register("reward_model")
def _reward_model(ctx: Context) -> Any:
  from rl_lm.train import reward_model, source

  return reward_model.train(ctx, source.task_from_config(ctx.config))


@register("dpo")
def _dpo(ctx: Context) -> Any:
  from rl_lm.train import dpo, source

  return dpo.train(ctx, source.task_from_config(ctx.config))


@register("rl")
def _rl(ctx: Context) -> Any:
  from rl_lm.train import rl

  return rl.run(ctx)
