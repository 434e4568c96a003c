"""The stages a run can chain (`config.stages`), by name. Each takes the run's Context and leaves
its policy in `ctx.policy` for the next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl_lm.train import dpo, reward_model, rl, sample, sft
from rl_lm.train.context import Context


def _sft(ctx: Context) -> Any:
  return sft.train(ctx, rl.task_from_config(ctx.config), ctx.config.sft)


def _reward_model(ctx: Context) -> Any:
  return reward_model.train(ctx, rl.task_from_config(ctx.config))


def _dpo(ctx: Context) -> Any:
  return dpo.train(ctx, rl.task_from_config(ctx.config))


STAGES: dict[str, Callable[[Context], Any]] = {
  "sample": sample.run,
  "sft": _sft,
  "reward_model": _reward_model,
  "dpo": _dpo,
  "rl": rl.run,
}
