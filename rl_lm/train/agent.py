"""The RL loop's multi-turn side (`config.env.name`): episodes instead of single completions, their metrics, and
held-out pass@k over episodes.

The loop (rl_lm/train/rl.py) is unchanged past the rollout: a batch of episodes is the same `RolloutBatch` a
single-turn rollout gives (rl_lm/envs/episodes.py builds it), with the episode's return as its score, environment
failures as invalid rows (masked from the gradient, like a verifier's error, never a reward of 0), and every
episode's verdict as its status (`success`, `task: ...`, `model: ...`, `environment: ...`, rl_lm/envs/failures.py).

Environments run in `config.env.workers` processes (rl_lm/envs/workers.py; 0: in this process). Faults are
injected at `config.env.faults` rates, drawn per (episode, turn) from the run's seed, so a resumed run injects
the same ones; the classifier's precision and recall against them are logged every step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rl_lm import evaluation, keys, sampling
from rl_lm.envs import base, episodes, failures, workers
from rl_lm.rollout.batch import RolloutBatch
from rl_lm.tasks.base import Problem


class Transcript(str):
  """An episode's text for evaluation, carrying its verdict (`success`, and whether the environment failed)."""

  success: bool = False
  env_failed: bool = False


def correct(problem: Any, transcript: Transcript) -> bool | None:
  """`evaluation.evaluate`'s judge for episodes: None (excluded, counted) for an environment failure."""
  del problem
  return None if transcript.env_failed else bool(transcript.success)


class FaultPlan:
  """Which environment step gets an injected fault: a fixed draw per (seed, batch, row, turn), so a resumed run
  injects what the uninterrupted one did. `batch` (the training step and its rollout number) is set per batch."""

  def __init__(self, faults: Any, seed: int):
    self.rates = (faults.crash, faults.hang, faults.slow)
    self.seed = seed
    self.batch = (0, 0)

  def __call__(self, rows: Sequence[int], turn: int) -> list[str]:
    out = []
    for row in rows:
      u = np.random.default_rng([self.seed, *self.batch, row, turn, 7]).random()
      edges = np.cumsum(self.rates)
      out.append(next((name for name, e in zip(("crash", "hang", "slow"), edges, strict=True) if u < e), ""))
    return out

  @property
  def active(self) -> bool:
    return sum(self.rates) > 0


class Agent:
  """Episode runners for training (`rl.prompts_per_step` x `rl.group_size` rows), sampled and greedy evaluation
  (`eval.rows`), over one environment pool."""

  def __init__(self, config: Any, model_cfg: Any, scfg: sampling.SamplingConfig, tok: Any, mesh: Any, rules: Any,
               rows: int, log: Any = print):
    env = config.env
    where = base.locate(env.name)
    if env.workers:
      self.envs: Any = workers.EnvPool(where, env.workers, env.step_timeout_s, env.step_timeout_s)
    else:
      self.envs = episodes.LocalEnvs(lambda: base.build(where))
    self.faults = FaultPlan(env.faults, config.seed)
    limits = episodes.EpisodeLimits(env.max_turns, env.turn_tokens, env.max_tokens)
    turn = dataclasses.replace(scfg, max_new_tokens=env.turn_tokens)
    faults = self.faults if self.faults.active else None
    self.train = episodes.EpisodeRunner(model_cfg, turn, tok, self.envs, limits, rows, mesh, rules, faults,
                                        slots=config.sampling.slots)  # continuous batching when > 0
    ev = config.eval
    self.sampled = episodes.EpisodeRunner(model_cfg, dataclasses.replace(turn, temperature=ev.temperature), tok,
                                          self.envs, limits, ev.rows, mesh, rules)
    self.greedy = episodes.EpisodeRunner(model_cfg, dataclasses.replace(turn, greedy=True), tok, self.envs, limits,
                                         ev.rows, mesh, rules)
    self.seed = config.seed
    log(f"rl: environment {env.name!r} ({where[0]}.{where[1]}), "
        f"{f'{env.workers} worker processes' if env.workers else 'in process'}, up to {env.max_turns} turns of "
        f"{env.turn_tokens} tokens, {env.max_tokens} tokens an episode")

  def close(self) -> None:
    self.envs.close()

  def _seeds(self, step: int, k: int, n: int) -> list[int]:
    return [int(s) for s in np.random.SeedSequence([self.seed, step, k, 11]).generate_state(n)]

  def train_episodes(self, params: Any, rows: list[Problem], rng: jax.Array, step: int, k: int = 0
                     ) -> RolloutBatch:
    """One batch of training episodes (row b: `rows[b]`), for step `step`'s k-th rollout (its faults and seeds)."""
    self.faults.batch = (step, k)
    return self.train.run(params, rows, rng, self._seeds(step, k, len(rows)))

  def metrics(self, batches: Sequence[RolloutBatch]) -> dict[str, float]:
    """episodes/* over every batch of the step: failure fractions by class (and of them, the episodes an
    observation that could not be framed ended, `failures.UNFRAMED`), turns, tool calls; faults/* when
    faults are injected (the classifier's precision and recall on the injected crashes and hangs)."""
    verdicts = [v for b in batches for v in b.host.verdicts]
    n = max(len(verdicts), 1)
    calls = np.concatenate([b.host.tool_calls for b in batches])
    out = {f"episodes/failure_{name}": sum(v.outcome == outcome for v in verdicts) / n
           for name, outcome in (("task", "task"), ("model", "model"), ("env", "environment"))}
    out["episodes/success_rate"] = sum(v.outcome == "success" for v in verdicts) / n
    # Of the model and environment failures: episodes ended by an observation that could not become tokens.
    out["episodes/unframed_observations"] = sum(v.reason.startswith(failures.UNFRAMED) for v in verdicts) / n
    out["episodes/turns_mean"] = float(np.mean(np.concatenate([b.host.turns for b in batches])))
    out["episodes/tool_calls_mean"] = float(np.mean(calls))
    out["episodes/tool_call_rate"] = float(np.mean(calls > 0))
    out["perf/policy_turns_s"] = sum(b.seconds["policy"] for b in batches)  # sampling the turns on device
    out["perf/env_s"] = sum(b.seconds["env"] for b in batches)  # resets and steps of the environments
    if self.faults.active:
      injected = np.concatenate([b.host.injected for b in batches]).tolist()
      flagged = [v.outcome == "environment" for v in verdicts]
      precision, recall = failures.precision_recall(flagged, injected)
      out.update({"faults/injected_frac": float(np.mean(injected)), "faults/precision": precision,
                  "faults/recall": recall})
    if isinstance(self.envs, workers.EnvPool):
      out["episodes/workers_replaced"] = float(self.envs.stats["replaced"])
    return out

  def evaluate(self, params: Any, problems: Sequence[Problem], n: int, greedy: bool, rng: jax.Array
               ) -> evaluation.EvalResult:
    """Held-out pass@k over episodes: `n` sampled episodes per problem (and one greedy), environment failures
    excluded and counted as the verifier's errors are."""
    by_prompt = {p.prompt: p for p in problems}
    calls: list[np.ndarray] = []  # tool calls of the sampled episodes

    def run(runner: episodes.EpisodeRunner, rows: list[Problem], salt: int) -> list[Transcript]:
      out: list[Transcript] = []
      R = runner.rows
      for c in range(0, len(rows), R):
        chunk = rows[c: c + R]
        padded = chunk + [chunk[0]] * (R - len(chunk))
        seeds = self._seeds(10**9, salt + c, R)  # a "step" no training batch has
        batch = runner.run(params, padded, keys.fold(rng, c // R + salt), seeds)
        host = batch.host
        if runner is self.sampled:
          calls.append(host.tool_calls[: len(chunk)])
        for b in range(len(chunk)):
          t = Transcript(host.texts[b])
          t.success = bool(host.success[b])
          t.env_failed = host.verdicts[b].outcome == "environment"
          out.append(t)
      return out

    def sample_fn(prompts: list[str], k: int) -> list[list[str]]:
      texts = run(self.sampled, [by_prompt[p] for p in prompts for _ in range(k)], 0)
      return [texts[i * k: (i + 1) * k] for i in range(len(prompts))]

    def greedy_fn(prompts: list[str]) -> list[str]:
      return run(self.greedy, [by_prompt[p] for p in prompts], 10**6)

    result = evaluation.evaluate(list(problems), sample_fn, correct, n, greedy_fn=greedy_fn if greedy else None)
    every = np.concatenate(calls)
    result.extra.update({"tool_call_rate": float(np.mean(every > 0)), "tool_calls_mean": float(np.mean(every))})
    return result
