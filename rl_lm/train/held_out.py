"""Held-out evaluation of a single-turn policy: pass@k over `eval.num_samples` samples per problem at
`eval.temperature`, and greedy accuracy, on the task's test problems that fit the prompt slots, judged by the
task's correctness reward (its faults excluded and counted, never scored 0).

Every evaluation of a run draws with the same key (common random numbers), so a difference between two of them
reflects the policy, not a fresh draw of sampling noise. The RL stage evaluates before, during and after training
(rl_lm/train/rl.py; with an environment, over whole episodes instead), "teacher_sft" before and after
(rl_lm/train/offpolicy.py): the same problems and the same draws, so their figures compare.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rl_lm import evaluation, keys
from rl_lm.config.section import ConfigError
from rl_lm.rewards import build_reward
from rl_lm.tasks.base import Problem
from rl_lm.train.context import Context
from rl_lm.train.rollout import Sampler


def fitting(ctx: Context, problems: list[Problem], what: str, log: Callable[[str], Any] = print) -> list[Problem]:
  """The problems whose prompt fits `rl.max_prompt_len` tokens; says how many were left out, and fails naming the
  key when none fits."""
  limit = ctx.config.rl.max_prompt_len
  kept = [p for p in problems if len(ctx.tokenizer.encode_prompt(p.prompt)) <= limit]
  if len(kept) < len(problems):
    log(f"{len(problems) - len(kept)} of {len(problems)} {what} problems have prompts longer than "
        f"config.rl.max_prompt_len={limit} tokens and are left out")
  if not kept:
    raise ConfigError("config.rl.max_prompt_len", f"{limit} tokens: no {what} problem's prompt fits")
  return kept


class HeldOut:
  """The samplers, problems, key and judge of a run's held-out evaluations."""

  def __init__(self, ctx: Context, scfg: Any, problems: list[Problem]):
    config, tok, rl = ctx.config, ctx.tokenizer, ctx.config.rl
    self.config, self.workdir, self.problems = config.eval, ctx.workdir, problems
    make = lambda s: Sampler(ctx.model_cfg, s, tok, ctx.mesh, ctx.rules, rl.max_prompt_len,  # noqa: E731
                             config.eval.rows, dtype=rl.sampler_dtype or None, gather=rl.sampler_gather)
    self.sampler = make(dataclasses.replace(scfg, temperature=config.eval.temperature, greedy=False))
    self.greedy = make(dataclasses.replace(scfg, greedy=True))
    self.key = keys.fold(ctx.key, 5)
    self.correct = evaluation.correct_from_reward(build_reward({"correctness": 1.0}))

  def evaluate(self, params: Any, samples: list[tuple[str, str]] | None = None) -> evaluation.EvalResult:
    """pass@k (and greedy accuracy) of `params`; the (prompt, completion) samples are appended to `samples`."""
    cfg = self.config

    def sample_fn(prompts: list[str], n: int) -> list[list[str]]:
      rows = [p for p in prompts for _ in range(n)]
      texts = self.sampler.sample(params, rows, self.key)["texts"]
      if samples is not None:
        samples.extend(zip(rows, texts, strict=True))
      return [texts[i * n: (i + 1) * n] for i in range(len(prompts))]

    def greedy_fn(prompts: list[str]) -> list[str]:
      return self.greedy.sample(params, prompts, self.key)["texts"]

    return evaluation.evaluate(self.problems, sample_fn, self.correct, cfg.num_samples,
                               greedy_fn=greedy_fn if cfg.greedy else None)
