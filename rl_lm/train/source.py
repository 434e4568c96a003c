"""Where the RL step's batches come from: the rollout source.

`RolloutSource.next(step, version)` returns the step's scored `RolloutBatch` (rl_lm/rollout/batch.py). It owns
everything between the policy's parameters and `prepare`:
- what the policy is scored on: a task's prompts, one completion each, scored by the configured rewards (or a
  learned reward model, the configured rewards measured beside it as the gold; `reward.gold` measures a gold beside
  configured rewards that are a proxy, an LLM judge's); or, with `config.env.name`, an
  environment's multi-turn episodes, scored by their returns (rl_lm/train/agent.py). The two produce the same
  batch, so everything below works for both;
- the curriculum that draws the prompts, and learns from every rollout drawn;
- sampling ahead (`rl.max_staleness` s > 0): the rollouts of steps step + 1 ... step + s are dispatched with the
  current policy while the host scores and the device trains; a rollout more than s updates old is dropped. The
  queue drains before a checkpoint, so a resumed run samples what the uninterrupted one did;
- dynamic sampling: zero-variance groups replaced by fresh ones, up to `rl.max_extra_rollouts` extra rollouts;
- with `rl.distill.on_policy` < 1, the steps whose rollouts the distillation teacher samples (`teacher_params`,
  set by the trainer): a coin per step (`distill.teacher_step`). Their rows do not teach the curriculum, which
  tracks the student's pass rates.

Where a part plugs in: a task (rl_lm/tasks, `TASKS`), a reward (rl_lm/rewards, `REWARDS`), an environment
(rl_lm/envs, `ENVIRONMENTS`); each is named in the config and built here.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from rl_lm import diagnostics, keys, sampling
from rl_lm import mesh as mesh_lib
from rl_lm.rewards import build_reward
from rl_lm.rl import advantages as adv_lib
from rl_lm.rl import distill
from rl_lm.rl.curriculum import Curriculum, CurriculumConfig
from rl_lm.rollout.batch import Host, RolloutBatch
from rl_lm.tasks import make_task
from rl_lm.tasks.base import Problem, Task
from rl_lm.train import agent as agent_lib
from rl_lm.train import held_out, reward_model
from rl_lm.train.context import Context
from rl_lm.train.rollout import Sampler


def task_from_config(config: Any) -> Task:
  """The task named by `config.task`, with the options that task takes."""
  t = config.task
  if t.name == "arithmetic":
    return make_task("arithmetic", levels=tuple(t.levels), worked=t.worked, test_fraction=t.test_fraction,
                     decimal_demos=t.decimal_demos, seed=config.seed, template=t.template)
  if t.name == "products":
    return make_task("products", digits=t.digits, test_fraction=t.test_fraction, tool_demos=t.tool_demos,
                     seed=config.seed)
  if t.name == "judge_pairs":
    return make_task("judge_pairs", seed=config.seed, test_fraction=t.test_fraction,
                     pairs=config.preferences.train_pairs, compare=config.judge.compare, choices=config.judge.choices)
  if t.name == "preferences":
    return make_task("preferences", seed=config.seed, test_fraction=t.test_fraction, beta=config.preferences.beta)
  options: dict[str, Any] = {}
  if t.data_dir:
    options["data_dir"] = t.data_dir
  options["template"] = t.template
  if t.name == "gsm8k":
    options["ascii_text"] = config.tokenizer == "char"
  return make_task(t.name, **options)


def training_pool(task: Task, size: int, seed: int) -> list[Problem]:
  """Up to `size` distinct training problems: the curriculum's pool."""
  seen: dict[str, Problem] = {}
  for p in task.train_problems(size * 4 if size else None, seed=seed):
    seen.setdefault(p.id, p)
    if len(seen) >= size:
      break
  return list(seen.values())


def overlong_penalty(lengths: np.ndarray, finished: np.ndarray, budget: int, buffer: int, factor: float) -> np.ndarray:
  """DAPO's soft overlong punishment: 0 up to budget - buffer tokens, then a linear ramp to -factor at the
  budget; a completion cut at the budget without stopping gets -factor. [B] -> [B]."""
  start = budget - buffer
  ramp = np.clip((lengths - start) / max(buffer, 1), 0.0, 1.0)
  return np.where(~finished, -factor, -factor * ramp).astype(np.float32)


class RolloutSource:
  """The RL step's batches (see the module docstring). `policy()` gives the current policy's parameters;
  `checkpoint_due(step)` says whether a step ends in a checkpoint (sampling ahead stops there)."""

  def __init__(self, ctx: Context, policy: Callable[[], Any], checkpoint_due: Callable[[int], bool],
               log: Callable[[str], Any] = print):
    config, rl = ctx.config, ctx.config.rl
    self.ctx, self.config, self.rl, self.log = ctx, config, rl, log
    self.policy, self.checkpoint_due = policy, checkpoint_due
    self.G, self.B, self.N = rl.group_size, rl.prompts_per_step * rl.group_size, config.sampling.max_new_tokens
    self.task = task_from_config(config)
    options: dict[str, dict[str, Any]] = {}
    if {"judge", "judge_pairwise"} & set(config.reward.weights):  # the LLM judge, a frozen model on the mesh
      from rl_lm.train import teacher as frozen_models

      judge, j = frozen_models.load_judge(config, ctx, log), config.judge
      options = {"judge": dict(judge=judge, rubric=j.rubric, scale=j.scale, min_mass=j.min_mass),
                 "judge_pairwise": dict(judge=judge, compare=j.compare, choices=j.choices, min_mass=j.min_mass)}
    self.reward = build_reward(dict(config.reward.weights), options)
    # The gold measured beside what trains: the configured rewards under a learned reward, else `reward.gold`.
    self.gold = build_reward(dict(config.reward.gold)) if config.reward.gold else None
    tok = ctx.tokenizer
    self.scfg = sampling.config_from(config.sampling, tok)
    self.sampler = Sampler(ctx.model_cfg, self.scfg, tok, ctx.mesh, ctx.rules, rl.max_prompt_len, self.B,
                           dtype=rl.sampler_dtype or None, gather=rl.sampler_gather)
    pool = self.fitting(training_pool(self.task, config.task.pool_size, config.seed), "training")
    self.curriculum = Curriculum(pool, CurriculumConfig.from_section(rl.curriculum), seed=config.seed)
    self.agent = agent_lib.Agent(config, ctx.model_cfg, self.scfg, tok, ctx.mesh, ctx.rules, self.B, log
                                 ) if config.env.name else None  # multi-turn episodes
    self.learned = None  # a reward_model.RewardModel when config.reward.learned
    if config.reward.learned:
      self.learned = (reward_model.load(ctx, config.reward.model_checkpoint) if config.reward.model_checkpoint
                      else ctx.reward_model)
      if self.learned is None:
        raise ValueError("config.reward.learned needs a reward_model stage before rl or config.reward.model_checkpoint")
    self.teacher_params: Any = None  # the teacher's parameters, when some steps train on its samples
    self.queue: collections.deque[RolloutBatch] = collections.deque()  # dispatched ahead, oldest first
    self._take = jax.jit(lambda tree, rows: jax.tree.map(lambda x: x[rows], tree),
                         out_shardings=mesh_lib.batch_sharding(ctx.mesh, ctx.rules, (self.B,)))

  def fitting(self, problems: list[Problem], what: str) -> list[Problem]:
    """The problems whose prompt fits `rl.max_prompt_len` tokens (`held_out.fitting`)."""
    return held_out.fitting(self.ctx, problems, what, lambda line: self.log(f"rl: {line}"))

  def summary_lines(self) -> list[str]:
    """What the run's rewards measured over the whole run (the pairwise judge's position bias)."""
    return [r.summary() for _, r in self.reward.components.values() if hasattr(r, "summary")]

  def close(self) -> None:
    if self.agent is not None:
      self.agent.close()  # the environment workers

  def key(self, step: int, i: int) -> jax.Array:
    """The sampling key of a step's i-th rollout (i > 0: dynamic sampling's extras)."""
    return keys.fold(self.ctx.key, 3, step, i)

  # --- one rollout: dispatched, then scored ------------------------------------------------------

  def by_teacher(self, step: int) -> bool:
    """Whether step `step`'s rollouts are the distillation teacher's samples (rl_lm/rl/distill.py)."""
    return self.teacher_params is not None and distill.teacher_step(self.config.seed, step, self.rl.distill.on_policy)

  def dispatch(self, step: int, version: int, problems: list[Problem], rng: jax.Array, extra: int = 0,
               by_teacher: bool | None = None) -> RolloutBatch:
    """G rollouts per problem with the current policy (or, `by_teacher`, the teacher; default: step `step`'s coin).
    Single-turn: started on the device, returns at once. Multi-turn: the episodes run to their end here (the
    environments take turns with the policy)."""
    rows = [p for p in problems for _ in range(self.G)]
    if self.agent is None:
      teacher = self.by_teacher(step) if by_teacher is None else by_teacher
      params = self.teacher_params if teacher else self.policy()
      return RolloutBatch(step, version, rows, self.sampler.dispatch(params, [p.prompt for p in rows], rng),
                          by_teacher=teacher)
    batch = self.agent.train_episodes(self.policy(), rows, rng, step or version + 1, extra)
    batch.step, batch.version = step, version
    return batch

  def score(self, batch: RolloutBatch, version: int, timings: dict[str, float]) -> RolloutBatch:
    """Waits for a dispatched rollout and scores it: the configured rewards, or the learned one with them as the
    gold; an episode by its return. Sampling ahead is topped up while the host scores."""
    staleness = np.full((len(batch.problems),), version - batch.version, np.float32)
    if batch.host is not None:  # episodes: scored by their environments as they ran
      batch.host.staleness = staleness
      self.top_up(batch.step, version)
      return batch
    with diagnostics.timed(timings, "sampling"):  # the host waits for the device's tokens
      host, texts = self.sampler.finish(batch.device)
    self.top_up(batch.step, version)  # the device samples ahead while the host scores
    with diagnostics.timed(timings, "scoring"):
      results = self.reward.batch(batch.problems, texts)
      scores = np.asarray([r.score for r in results], np.float32)
      valid = np.asarray([r.valid for r in results], bool)
      success = valid & (scores >= self.config.reward.success_threshold)
      gold = None
      if self.learned is not None:  # train on the proxy; the configured rewards are the gold, measured beside it
        gold = np.where(valid, scores, np.nan).astype(np.float32)
        rollout = batch.device
        # On device, in prepare's row chunks: the whole batch's activations at once can outgrow the update's.
        chunks = math.gcd(rollout.tokens.shape[0], self.rl.prepare_chunks)
        proxy = reward_model.score_fn(self.ctx.model_cfg, chunks)(self.learned.params, rollout.tokens,
                                                                 rollout.prompt_mask | rollout.completion_mask)
        scores = (mesh_lib.fetch(proxy) - self.learned.offset).astype(np.float32)
        valid = np.ones_like(valid)
      elif self.gold is not None:  # train on the configured rewards (a judge's); the gold measured beside them
        measured = self.gold.batch(batch.problems, texts)
        gold = np.asarray([r.score if r.valid else np.nan for r in measured], np.float32)
      if self.rl.overlong == "penalty":
        scores = scores + overlong_penalty(host["lengths"], host["finished"], self.N, self.rl.overlong_buffer,
                                           self.rl.overlong_penalty)
    batch.host = Host(host["tokens"], host["lengths"], host["finished"], texts, scores, valid, success,
                      [r.status for r in results], staleness, gold)
    return batch

  def top_up(self, step: int, version: int) -> None:
    """With `rl.max_staleness` s > 0, keeps the rollouts of steps step + 1 ... step + s dispatched, sampled by the
    current policy. Never past the last step, nor past a step that ends in a checkpoint: the queue drains there,
    so a resumed run regenerates the same rollouts (from the saved parameters) as the run that was not
    interrupted."""
    if not step:  # a fresh rollout (dynamic sampling's extras), not the step's own
      return
    horizon = step
    while horizon < min(step + self.rl.max_staleness, self.rl.steps) and not self.checkpoint_due(horizon):
      horizon += 1
    queued = self.queue[-1].step if self.queue else step
    for t in range(queued + 1, horizon + 1):
      self.queue.append(self.dispatch(t, version, self.curriculum.next_batch(self.rl.prompts_per_step),
                                      self.key(t, 0)))

  def first(self, step: int, version: int, timings: dict[str, float]) -> tuple[RolloutBatch, float]:
    """The step's own rollout: the one dispatched ahead for it (at most `rl.max_staleness` updates old), or a
    fresh one. Returns (it, scored; how many rollouts were dropped as too stale)."""
    dropped = 0.0
    while self.queue and (self.queue[0].step < step or version - self.queue[0].version > self.rl.max_staleness):
      self.queue.popleft()  # sampled by a policy too old (or for a step already past): never trained on
      dropped += 1
    if self.queue and self.queue[0].step == step:
      batch = self.queue.popleft()
    else:
      with diagnostics.timed(timings, "sampling"):
        batch = self.dispatch(step, version, self.curriculum.next_batch(self.rl.prompts_per_step), self.key(step, 0))
    return self.score(batch, version, timings), dropped

  # --- a step's batch ----------------------------------------------------------------------------

  def trains(self, batch: RolloutBatch) -> np.ndarray:
    """Rows that train: the verifier decided, and (with overlong masking) the completion finished. [B]"""
    return batch.host.valid & (batch.host.finished if self.rl.overlong == "mask" else True)

  def next(self, step: int, version: int, timings: dict[str, float]
           ) -> tuple[RolloutBatch, list[RolloutBatch], dict[str, float]]:
    """Step `step`'s batch (the policy has had `version` updates), every rollout drawn for it, and the
    dynamic-sampling statistics. With dynamic sampling, zero-variance groups are replaced by fresh ones. Every
    rollout drawn, kept or dropped, is evidence for the curriculum."""
    P, G = self.rl.prompts_per_step, self.G
    first, dropped = self.first(step, version, timings)
    seen = [first]
    zero_var = [adv_lib.group_zero_variance_host(first.host.scores, G, self.trains(first))]
    # The fraction in the first draw: what a run without dynamic sampling would have trained on.
    stats = {"groups/zero_variance_frac": float(zero_var[0].mean()), "dynamic/extra_rollouts": 0.0,
             "offpolicy/dropped": dropped * self.B}
    while (self.rl.dynamic_sampling and len(seen) <= self.rl.max_extra_rollouts
           and sum(int((~z).sum()) for z in zero_var) < P):
      with diagnostics.timed(timings, "sampling"):
        extra = self.dispatch(0, version, self.curriculum.next_batch(P), self.key(step, len(seen)), len(seen),
                              by_teacher=first.by_teacher)
      seen.append(self.score(extra, version, timings))
      zero_var.append(adv_lib.group_zero_variance_host(seen[-1].host.scores, G, self.trains(seen[-1])))
      stats["dynamic/extra_rollouts"] = float(len(seen) - 1)
    for batch in seen if not first.by_teacher else ():
      succ, val = batch.host.success.reshape(-1, G), batch.host.valid.reshape(-1, G)
      self.curriculum.update(batch.problems[::G], (succ & val).sum(1).tolist(), val.sum(1).tolist())
    if not self.rl.dynamic_sampling:
      return first, seen, stats
    # Exactly P groups (fixed shapes): signal first, zero-variance groups only if short.
    flat = np.concatenate(zero_var)  # [len(seen) * P]
    groups = np.concatenate([np.flatnonzero(~flat), np.flatnonzero(flat)])[:P]
    rows = (groups[:, None] * G + np.arange(G)).reshape(-1)
    stats["dynamic/kept_signal_frac"] = float(min(int((~flat).sum()), P) / P)
    take = lambda tree, r: self._take(tree, mesh_lib.put(r, mesh_lib.replicated(self.ctx.mesh)))  # noqa: E731
    return RolloutBatch.select(seen, rows, take), seen, stats

  def metrics(self, batch: RolloutBatch, seen: list[RolloutBatch], timings: dict[str, float]) -> dict[str, float]:
    """The host's metrics of a step's rollouts: staleness, the curriculum, verifier errors and timeouts, throughput,
    and the episodes' (multi-turn)."""
    host = batch.host
    out = {}
    if host.gold is not None:  # what trains is a proxy (a reward model, a judge): the gold beside it
      out["rollout/proxy_mean"] = float(np.mean(host.scores[host.valid])) if host.valid.any() else float("nan")
      out["rollout/gold_mean"] = float(np.nanmean(host.gold)) if np.isfinite(host.gold).any() else float("nan")
    out["offpolicy/staleness_mean"] = float(np.mean(host.staleness))
    out["offpolicy/staleness_max"] = float(np.max(host.staleness))
    out.update(self.curriculum.metrics())
    out["rollout/verifier_errors"] = float(sum((~e.host.valid).sum() for e in seen))  # dropped groups too
    # Timeouts the completions caused (their program or answer overran): scored 0, counted apart.
    out["rollout/timeouts"] = float(sum(s == "timeout" for e in seen for s in e.host.statuses))
    for _, reward in self.reward.components.values():  # the judge's: failures, position bias
      out.update(getattr(reward, "stats", {}))
    out.update(diagnostics.perf_metrics(timings, int(sum(e.host.lengths.sum() for e in seen))))
    if self.agent is not None:
      out.update(self.agent.metrics(seen))
    return out
