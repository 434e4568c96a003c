"""The RL loop: one loop for PPO and the GRPO family, the algorithm chosen by `config.rl.algorithm`.

  prompts  = curriculum.next_batch()                    host: problems with ids
  rollout  = sampler.rollout(policy, prompts x G)         jit; stays on device, tokens come to the host once
  rewards  = reward.batch(problems, completions)          host (verifiers read text); errors masked, not scored 0
  batch    = prepare(policy, reference, value, rollout,   jit: old / reference log-probs, values, advantages
                     rewards)                             (group-relative | leave-one-out | GAE | REINFORCE++),
                                                          KL penalty, IS weights, rollout diagnostics
  state    = update(state, batch)                         jit: epochs x minibatches as lax.scan, KL controller
  curriculum.update(...); alarms; evaluation every N steps; checkpoints

The sampler runs the policy's own parameters (cast to `rl.sampler_dtype` when set). Its log-probs
and the trainer's for the same tokens are both kept: the gap is logged every step and corrected by
importance weights and rejection (`rl.correction`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import diagnostics, evaluation, health, keys, sampling
from rl_lm import mesh as mesh_lib
from rl_lm import metrics as metrics_lib
from rl_lm.models import heads
from rl_lm.models import lora as lora_lib
from rl_lm.rewards import build_reward
from rl_lm.rl import advantages as adv_lib
from rl_lm.rl import kl as kl_lib
from rl_lm.rl.curriculum import Curriculum, CurriculumConfig
from rl_lm.tasks import make_task
from rl_lm.tasks.base import Problem, Task
from rl_lm.train import agent as agent_lib
from rl_lm.train import reward_model, rl_update, stage_run
from rl_lm.train import state as state_lib
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


@dataclasses.dataclass
class Episodes:
  """One rollout's episodes, rows of a group adjacent: the token arrays stay on the device where the sampler
  wrote them; the host holds what it decoded and scored."""

  problems: list[Problem]  # one per row
  rollout: sampling.Rollout  # on device: tokens, masks, sampler log-probs [B, T]; lengths, finished [B]
  host: dict[str, np.ndarray]  # host copies of tokens [B, T], lengths and finished [B]
  texts: list[str]
  scores: np.ndarray  # [B] float32: what trains
  valid: np.ndarray  # [B] bool: the verifier decided
  success: np.ndarray  # [B] bool
  statuses: list[str]
  gold: np.ndarray | None = None  # [B] the configured rewards beside a learned one (NaN where invalid)
  staleness: np.ndarray | None = None  # [B] updates applied between sampling a row and training on it

  @staticmethod
  def select(parts: Sequence[Episodes], rows: np.ndarray, take: Any) -> Episodes:
    """Rows `rows` of the parts laid end to end; `take(rollout, rows)` gathers the device arrays."""
    array = lambda xs: np.concatenate(list(xs))[rows]
    items = lambda name: [x for p in parts for x in getattr(p, name)]
    return Episodes(
      [items("problems")[i] for i in rows],
      take(jax.tree.map(lambda *xs: jnp.concatenate(xs), *[p.rollout for p in parts]), rows),
      {k: array(p.host[k] for p in parts) for k in parts[0].host}, [items("texts")[i] for i in rows],
      array(p.scores for p in parts), array(p.valid for p in parts), array(p.success for p in parts),
      [items("statuses")[i] for i in rows], array(p.gold for p in parts) if parts[0].gold is not None else None,
      array(p.staleness for p in parts))


@dataclasses.dataclass
class Pending:
  """A rollout dispatched to the device and not yet scored: the step it trains at, its problems (one per row), the
  device arrays, and the policy version that samples it (the number of updates applied to the parameters)."""

  step: int
  problems: list[Problem]
  rollout: sampling.Rollout
  version: int


# The run-health curves drawn at the end of a run (curves.png in the workdir).
CURVES = ("rollout/reward_mean", "rollout/pass_rate", "policy/kl_ref_k3", "policy/entropy",
          "rollout/response_length_mean", "groups/zero_variance_frac", "offpolicy/logprob_gap_mean_abs",
          "train/grad_norm", "perf/tokens_per_s", "rollout/proxy_mean", "rollout/gold_mean", "policy/kl_ref_seq")


class RLTrainer:
  """Holds one RL run's objects; `run()` is the loop."""

  def __init__(self, ctx: Context, log: Any = print):
    self.ctx, self.config, self.rl = ctx, ctx.config, ctx.config.rl
    self.log = stage_run.speaker(log)  # one process speaks
    rl, config = self.rl, self.config
    self.G = rl.group_size
    self.B = rl.prompts_per_step * rl.group_size
    self.N = config.sampling.max_new_tokens
    self.norm_constant = rl.norm_constant or self.N
    self.temperature = config.sampling.temperature
    self.task = task_from_config(config)
    self.reward = build_reward(dict(config.reward.weights))
    self.correctness = build_reward({"correctness": 1.0})
    tok = ctx.tokenizer
    scfg = sampling.config_from(config.sampling, tok)
    self.sampler = Sampler(ctx.model_cfg, scfg, tok, ctx.mesh, ctx.rules, rl.max_prompt_len, self.B,
                           dtype=rl.sampler_dtype or None)
    eval_scfg = dataclasses.replace(scfg, temperature=config.eval.temperature, greedy=False)
    self.eval_sampler = Sampler(ctx.model_cfg, eval_scfg, tok, ctx.mesh, ctx.rules, rl.max_prompt_len,
                                config.eval.rows, dtype=rl.sampler_dtype or None)
    self.greedy_sampler = Sampler(ctx.model_cfg, dataclasses.replace(scfg, greedy=True), tok, ctx.mesh, ctx.rules,
                                  rl.max_prompt_len, config.eval.rows, dtype=rl.sampler_dtype or None)
    pool = self._fitting(training_pool(self.task, config.task.pool_size, config.seed), "training")
    self.curriculum = Curriculum(pool, CurriculumConfig.from_section(rl.curriculum), seed=config.seed)
    self.test_problems = self._fitting(self.task.test_problems(config.task.eval_size, seed=config.seed), "held-out")
    self.agent = agent_lib.Agent(config, ctx.model_cfg, scfg, tok, ctx.mesh, ctx.rules, self.B, self.log
                                 ) if config.env.name else None  # multi-turn episodes
    self._episode_batches: list[Any] = []  # the step's episodes (for episodes/* metrics)
    self.health = health.Monitor(diagnostics.AlarmConfig.from_section(rl.alarms))
    self._skips = stage_run.SkipCounter(config.stop_after_nonfinite, "rl")
    self._inflight: collections.deque[Pending] = collections.deque()  # rollouts sampled ahead (rl.max_staleness)
    self._version = 0  # updates applied to the policy
    self._stage: stage_run.StageRun | None = None  # set by run(): its checkpoint steps drain the pipeline
    self.lora = lora_lib.from_section(config.model)  # None: every weight trains
    self.learned = None  # a reward_model.RewardModel when config.reward.learned
    if config.reward.learned:
      self.learned = (reward_model.load(ctx, config.reward.model_checkpoint) if config.reward.model_checkpoint
                      else ctx.reward_model)
      if self.learned is None:
        raise ValueError("config.reward.learned needs a reward_model stage before rl or config.reward.model_checkpoint")
    self._build_state()

  def _fitting(self, problems: list[Problem], what: str) -> list[Problem]:
    """The problems whose prompt fits `rl.max_prompt_len` tokens; says how many were left out."""
    kept = [p for p in problems if len(self.ctx.tokenizer.encode_prompt(p.prompt)) <= self.rl.max_prompt_len]
    if len(kept) < len(problems):
      self.log(f"rl: {len(problems) - len(kept)} of {len(problems)} {what} problems have prompts longer than "
               f"config.rl.max_prompt_len={self.rl.max_prompt_len} tokens and are left out")
    if not kept:
      from rl_lm.config import ConfigError

      raise ConfigError("config.rl.max_prompt_len", f"{self.rl.max_prompt_len} tokens: no {what} problem's prompt "
                        "fits")
    return kept

  # --- state -------------------------------------------------------------------------------------

  def _build_state(self) -> None:
    ctx, rl = self.ctx, self.rl
    is_ppo = rl.algorithm == "ppo"
    self.policy_opt = state_lib.make_optimizer(rl.learning_rate, weight_decay=rl.weight_decay,
                                               warmup_steps=rl.warmup_steps, grad_clip=rl.grad_clip)
    self.value_opt = state_lib.make_optimizer(rl.value.learning_rate, grad_clip=rl.grad_clip) if is_ppo else None
    if self.lora:  # the base is the reference (the policy with its adapters off): one copy of the weights
      self.reference = ctx.policy
      init = lambda r: lora_lib.init(ctx.model_cfg, self.lora, r)
      abstract = jax.eval_shape(init, jax.random.key(0))
      trainable_sh = mesh_lib.tree_shardings(ctx.mesh, ctx.rules, abstract,
                                             lora_lib.param_axes(ctx.model_cfg, self.lora))
      trainable = jax.jit(init, out_shardings=trainable_sh)(jax.random.fold_in(ctx.key, 6))
    else:
      self.reference = stage_run.frozen_copy(ctx.policy)  # never donated
      trainable, trainable_sh = ctx.policy, ctx.param_shardings  # `state_lib.create` copies it into the state
      ctx.policy = self.reference  # the same values: the run keeps one copy of the starting weights, not two
    policy_sh = state_lib.state_shardings(self.policy_opt, jax.eval_shape(lambda: trainable), trainable_sh, ctx.mesh)
    policy_state = state_lib.create(trainable, self.policy_opt, ctx.mesh, trainable_sh)
    if self.lora:
      opt_bytes = sum(x.nbytes for x in jax.tree.leaves(policy_state.opt_state))
      self.log(f"rl: LoRA rank {self.lora.rank} on {', '.join(self.lora.targets)}: "
               f"{lora_lib.num_params(trainable):,} trainable parameters "
               f"({lora_lib.num_params(trainable) / lora_lib.num_params(ctx.policy):.2%} of "
               f"{lora_lib.num_params(ctx.policy):,}), optimizer state {opt_bytes / 2**20:.1f} MiB")
    value_state, value_sh = None, None
    if is_ppo:
      axes = heads.param_axes(ctx.model_cfg)
      init = lambda r: heads.init(ctx.model_cfg, r, backbone=ctx.policy)
      abstract = jax.eval_shape(init, jax.random.key(0))
      v_shardings = mesh_lib.tree_shardings(ctx.mesh, ctx.rules, abstract, axes)
      value_params = jax.jit(init, out_shardings=v_shardings)(jax.random.fold_in(ctx.key, 2))
      value_sh = state_lib.state_shardings(self.value_opt, abstract, v_shardings, ctx.mesh)
      value_state = state_lib.create(value_params, self.value_opt, ctx.mesh, v_shardings)
    rep = mesh_lib.replicated(ctx.mesh)
    kl_state = mesh_lib.put(kl_lib.init_kl_state(rl.kl.coef), rep)  # placed as update_fn returns it: one compile
    self.state = rl_update.RLState(policy_state, value_state, kl_state)
    shardings = rl_update.RLState(policy_sh, value_sh, jax.tree.map(lambda _: rep, self.state.kl))
    self._shardings = shardings
    self.update_fn = rl_update.make_update_fn(ctx.model_cfg, rl, self.temperature, self.norm_constant,
                                              (self.policy_opt, self.value_opt), shardings, ctx.mesh, ctx.rules,
                                              self.lora)
    self.prepare_fn = rl_update.make_prepare_fn(ctx.model_cfg, rl, self.temperature, ctx.mesh, ctx.rules, self.lora)
    batch_sh = mesh_lib.batch_sharding(ctx.mesh, ctx.rules, (self.B,))  # dim 0 of every [B, ...] array
    self._take = jax.jit(lambda tree, rows: jax.tree.map(lambda x: x[rows], tree), out_shardings=batch_sh)

  def policy(self) -> Any:
    """The current policy's parameters as the model takes them (with LoRA: the base carrying the adapters)."""
    return rl_update.policy_params(self.state.policy.params, self.reference, self.lora)

  def merged(self, trainable: Any) -> Any:
    """Plain parameters of a trained policy (LoRA merged in), for the stages after RL and for export."""
    return lora_lib.merge(self.reference, trainable, self.lora) if self.lora else trainable

  # --- one step ----------------------------------------------------------------------------------

  def train_step(self, step: int) -> dict[str, float]:
    """prompts -> rollout -> rewards -> prepare (advantages) -> update; returns the step's metrics."""
    timings: dict[str, float] = {}
    self._version = step - 1
    batch, seen, stats = self.collect(step, timings)  # prompts, rollout, rewards (and dynamic sampling)
    with diagnostics.timed(timings, "prepare"):  # log-probs, values, advantages, IS weights, diagnostics
      value = self.state.value.params if self.state.value is not None else None
      scored = self._device(rl_update.Scored(batch.scores, batch.valid, self._trains(batch), batch.success))
      train_batch, rollout_metrics = self.prepare_fn(self.state.policy.params, self.reference, value, batch.rollout,
                                                     scored, self.state.kl.coef)
      jax.block_until_ready(train_batch)
    with diagnostics.timed(timings, "update"):  # epochs x minibatches, then the KL controller, in one jit
      key = keys.fold(self.ctx.key, 4, step)
      self.state, update_metrics = self.update_fn(self.state, train_batch, key, self.reference if self.lora else None)
      self._version = step
      rollout_metrics, update_metrics = mesh_lib.fetch((rollout_metrics, update_metrics))
    flags = update_metrics.pop("train/skipped_flags")
    self._skips.count(flags.tolist(), [update_metrics] * len(flags), step)
    for episodes in seen:  # every rollout, kept or dropped, is evidence for the curriculum
      self._update_curriculum(episodes)
    return self._step_metrics(batch, seen, stats, rollout_metrics, update_metrics, timings)

  def _dispatch(self, step: int, problems: list[Problem], rng: jax.Array) -> Pending:
    """Starts G episodes per problem on the device with the current policy; returns at once."""
    rows = [p for p in problems for _ in range(self.G)]
    rollout = self.sampler.dispatch(self.policy(), [p.prompt for p in rows], rng)
    return Pending(step, rows, rollout, self._version)

  def _score(self, pending: Pending, timings: dict[str, float]) -> Episodes:
    """Waits for a dispatched rollout and scores it: the configured rewards, or the learned one with them as the
    gold."""
    rows, rollout = pending.problems, pending.rollout
    with diagnostics.timed(timings, "sampling"):  # the host waits for the device's tokens
      host, texts = self.sampler.finish(rollout)
    self._refill(pending.step)  # the device samples ahead while the host scores
    with diagnostics.timed(timings, "scoring"):
      results = self.reward.batch(rows, texts)
      scores = np.asarray([r.score for r in results], np.float32)
      valid = np.asarray([r.valid for r in results], bool)
      success = valid & (scores >= self.config.reward.success_threshold)
      gold = None
      if self.learned is not None:  # train on the proxy; the configured rewards are the gold, measured beside it
        gold = np.where(valid, scores, np.nan).astype(np.float32)
        proxy = reward_model.score_fn(self.ctx.model_cfg)(self.learned.params, rollout.tokens,
                                                         rollout.prompt_mask | rollout.completion_mask)  # on device
        scores = (mesh_lib.fetch(proxy) - self.learned.offset).astype(np.float32)
        valid = np.ones_like(valid)
      if self.rl.overlong == "penalty":
        scores = scores + overlong_penalty(host["lengths"], host["finished"], self.N, self.rl.overlong_buffer,
                                           self.rl.overlong_penalty)
    staleness = np.full((len(rows),), self._version - pending.version, np.float32)
    return Episodes(rows, rollout, host, texts, scores, valid, success, [r.status for r in results], gold, staleness)

  def _rollout(self, problems: list[Problem], rng: jax.Array, timings: dict[str, float], step: int = 0
               ) -> Episodes:
    """G fresh episodes per problem (the current policy), scored; `step`: the step whose own rollout this is (0:
    an extra one, for dynamic sampling)."""
    if self.agent is not None:  # multi-turn: the policy and the environments take turns, scored as they go
      rows = [p for p in problems for _ in range(self.G)]
      with diagnostics.timed(timings, "episodes"):
        batch, fields = self.agent.episodes(self.policy(), rows, rng, self._version + 1, len(self._episode_batches))
      self._episode_batches.append(batch)
      return Episodes(rows, batch.rollout, staleness=np.zeros((len(rows),), np.float32), **fields)
    with diagnostics.timed(timings, "sampling"):
      pending = self._dispatch(step, problems, rng)
    return self._score(pending, timings)

  def _rollout_key(self, step: int, i: int) -> jax.Array:
    """The sampling key of a step's i-th rollout (i > 0: dynamic sampling's extras)."""
    return keys.fold(self.ctx.key, 3, step, i)

  def _refill(self, step: int) -> None:
    """With `rl.max_staleness` s > 0, keeps the rollouts of steps step + 1 ... step + s dispatched, sampled by the
    current policy, so the device samples them while the host scores and the device trains. Never past the last
    step, nor past a step that ends in a checkpoint: the pipeline drains there, so a resumed run regenerates the
    same rollouts (from the saved parameters) as the run that was not interrupted."""
    if not step:  # a fresh rollout (dynamic sampling's extras), not the step's own
      return
    horizon = step
    while horizon < min(step + self.rl.max_staleness, self.rl.steps) and not self._checkpoint_due(horizon):
      horizon += 1
    queued = self._inflight[-1].step if self._inflight else step
    for t in range(queued + 1, horizon + 1):
      self._inflight.append(self._dispatch(t, self.curriculum.next_batch(self.rl.prompts_per_step),
                                           self._rollout_key(t, 0)))

  def _checkpoint_due(self, step: int) -> bool:
    return self._stage is not None and self._stage.due(step)

  def _first_rollout(self, step: int, timings: dict[str, float]) -> tuple[Episodes, float]:
    """The step's own rollout: the one dispatched ahead for it (at most `rl.max_staleness` updates old), or a
    fresh one. Returns (its episodes, how many rollouts were dropped as too stale)."""
    dropped = 0.0
    while self._inflight and (self._inflight[0].step < step or
                              self._version - self._inflight[0].version > self.rl.max_staleness):
      self._inflight.popleft()  # sampled by a policy too old (or for a step already past): never trained on
      dropped += 1
    if self._inflight and self._inflight[0].step == step:
      return self._score(self._inflight.popleft(), timings), dropped
    problems = self.curriculum.next_batch(self.rl.prompts_per_step)
    return self._rollout(problems, self._rollout_key(step, 0), timings, step), dropped

  def _trains(self, episodes: Episodes) -> np.ndarray:
    """Rows that train: the verifier decided, and (with overlong masking) the completion finished. [B]"""
    return episodes.valid & (episodes.host["finished"] if self.rl.overlong == "mask" else True)

  def _zero_variance(self, episodes: Episodes) -> np.ndarray:
    """Groups whose training rows all scored the same (no signal). [groups]"""
    return adv_lib.group_zero_variance_host(episodes.scores, self.G, self._trains(episodes))

  def collect(self, step: int, timings: dict[str, float]) -> tuple[Episodes, list[Episodes], dict[str, float]]:
    """One step's episodes, every rollout drawn for them, and the dynamic-sampling statistics. With dynamic
    sampling, zero-variance groups are replaced by fresh ones."""
    P, G = self.rl.prompts_per_step, self.G
    first, dropped = self._first_rollout(step, timings)
    seen = [first]
    zero_var = [self._zero_variance(seen[0])]
    # The fraction in the first draw: what a run without dynamic sampling would have trained on.
    stats = {"groups/zero_variance_frac": float(zero_var[0].mean()), "dynamic/extra_rollouts": 0.0,
             "offpolicy/dropped": dropped * self.B}
    if not self.rl.dynamic_sampling:
      return seen[0], seen, stats
    while len(seen) <= self.rl.max_extra_rollouts and sum(int((~z).sum()) for z in zero_var) < P:
      seen.append(self._rollout(self.curriculum.next_batch(P), self._rollout_key(step, len(seen)), timings))
      zero_var.append(self._zero_variance(seen[-1]))
      stats["dynamic/extra_rollouts"] = float(len(seen) - 1)
    # Exactly P groups (fixed shapes): signal first, zero-variance groups only if short.
    flat = np.concatenate(zero_var)  # [len(seen) * P]
    groups = np.concatenate([np.flatnonzero(~flat), np.flatnonzero(flat)])[:P]
    rows = (groups[:, None] * G + np.arange(G)).reshape(-1)
    stats["dynamic/kept_signal_frac"] = float(min(int((~flat).sum()), P) / P)
    take = lambda tree, r: self._take(tree, mesh_lib.put(r, mesh_lib.replicated(self.ctx.mesh)))  # noqa: E731
    return Episodes.select(seen, rows, take), seen, stats

  def _update_curriculum(self, episodes: Episodes) -> None:
    G = self.G
    succ, val = episodes.success.reshape(-1, G), episodes.valid.reshape(-1, G)
    self.curriculum.update(episodes.problems[::G], (succ & val).sum(1).tolist(), val.sum(1).tolist())

  def _step_metrics(self, batch: Episodes, seen: list[Episodes], stats: dict[str, float], rollout_metrics: dict,
                    update_metrics: dict, timings: dict[str, float]) -> dict[str, float]:
    """One step's metrics: the device's (rollout diagnostics, update) and the host's (counts, curriculum, time)."""
    metrics = {k: float(v) for k, v in {**rollout_metrics, **update_metrics}.items()}
    if self.learned is not None:
      metrics["rollout/proxy_mean"] = float(np.mean(batch.scores))
      metrics["rollout/gold_mean"] = float(np.nanmean(batch.gold)) if np.isfinite(batch.gold).any() else float("nan")
    if self.rl.dynamic_sampling:  # the trained batch's own fraction, after refilling
      metrics["dynamic/zero_variance_frac_trained"] = metrics["groups/zero_variance_frac"]
    metrics.update(stats)
    metrics["offpolicy/staleness_mean"] = float(np.mean(batch.staleness))
    metrics["offpolicy/staleness_max"] = float(np.max(batch.staleness))
    metrics.update(self.curriculum.metrics())
    metrics["rollout/verifier_errors"] = float(sum((~e.valid).sum() for e in seen))  # dropped groups too
    # Timeouts the completions caused (their program or answer overran): scored 0, counted apart.
    metrics["rollout/timeouts"] = float(sum(s == "timeout" for e in seen for s in e.statuses))
    metrics.update(diagnostics.perf_metrics(timings, int(sum(e.host["lengths"].sum() for e in seen))))
    if self.agent is not None:
      metrics.update(self.agent.metrics(self._episode_batches))
      self._episode_batches = []
    return metrics

  def _device(self, tree: Any) -> Any:
    """Host [B] arrays onto the mesh, the batch sharded like the rollout's."""
    return mesh_lib.put(tree, mesh_lib.batch_sharding(self.ctx.mesh, self.ctx.rules, (self.B,)))

  # --- evaluation --------------------------------------------------------------------------------

  def evaluate(self, step: int, label: str) -> evaluation.EvalResult:
    cfg = self.config.eval
    # The same key at every evaluation (common random numbers): before/after differences reflect the
    # policy, not a fresh draw of sampling noise.
    key = keys.fold(self.ctx.key, 5)
    params = self.policy()

    sampled: list[tuple[str, str]] = []

    def sample_fn(prompts: list[str], n: int) -> list[list[str]]:
      texts = self.eval_sampler.sample(params, [p for p in prompts for _ in range(n)], key)["texts"]
      sampled.extend(zip([p for p in prompts for _ in range(n)], texts, strict=True))
      return [texts[i * n: (i + 1) * n] for i in range(len(prompts))]

    def greedy_fn(prompts: list[str]) -> list[str]:
      return self.greedy_sampler.sample(params, prompts, key)["texts"]

    correct_fn = evaluation.correct_from_reward(self.correctness)  # verifier faults: excluded, counted
    if self.agent is not None:  # pass@k over whole episodes, the environment the judge
      result = self.agent.evaluate(params, self.test_problems, cfg.num_samples, cfg.greedy, key)
    else:
      result = evaluation.evaluate(self.test_problems, sample_fn, correct_fn, cfg.num_samples,
                                   greedy_fn=greedy_fn if cfg.greedy else None)
    if self.learned is not None:  # the gold the learned reward stands in for, on the same samples
      by_prompt = {p.prompt: p for p in self.test_problems}
      scored = self.reward.batch([by_prompt[p] for p, _ in sampled], [t for _, t in sampled])
      valid = [r.score for r in scored if r.valid]
      if valid:
        result.extra["gold_mean"] = float(np.mean(valid))
    evaluation.write_eval(result, self.ctx.workdir, step, label=label)
    return result

  # --- the loop ----------------------------------------------------------------------------------

  def _checkpoint_items(self) -> dict[str, Any]:
    items = stage_run.state_items(self.state.policy)
    if self.state.value is not None:
      items.update(stage_run.state_items(self.state.value, "value_"))
    items["kl"] = self.state.kl
    return items

  def _checkpoint_targets(self) -> dict[str, Any]:
    sh = self._shardings
    targets = stage_run.state_items(stage_run.abstract(jax.eval_shape(lambda: self.state.policy), sh.policy))
    if self.state.value is not None:
      value = stage_run.abstract(jax.eval_shape(lambda: self.state.value), sh.value)
      targets.update(stage_run.state_items(value, "value_"))
    targets["kl"] = stage_run.abstract(jax.eval_shape(lambda: self.state.kl), sh.kl)
    return targets

  def _state_from_items(self, items: dict[str, Any]) -> rl_update.RLState:
    value = stage_run.state_from_items(items, "value_") if self.state.value is not None else None
    return rl_update.RLState(stage_run.state_from_items(items), value, items["kl"])

  def _save(self, step: int, before: evaluation.EvalResult, curves: dict[str, dict[int, float]]) -> None:
    cur = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.curriculum.state_dict().items()}
    extra = {"curriculum": cur, "before": before.to_dict(), "health": self.health.state_dict(),
             "curves": {label: {str(k): v for k, v in c.items()} for label, c in curves.items()}}
    self._stage.save(step, self._checkpoint_items(), extra)

  def run(self) -> dict[str, Any]:
    """The RL stage: resumes from `<workdir>/checkpoints/rl` when it holds checkpoints."""
    try:
      return self._stage_run()
    finally:
      if self.agent is not None:
        self.agent.close()  # the environment workers

  def _stage_run(self) -> dict[str, Any]:
    with stage_run.StageRun(self.config, self.ctx.workdir, "rl", self.rl.steps, "metrics.jsonl", self._skips,
                            self.log) as stage:
      self._stage = stage
      state, params, extra = stage.start(self.ctx, self._checkpoint_targets(), lambda _: self.state,
                                         from_items=self._state_from_items)
      if stage.complete:
        self.ctx.policy = self.merged(params)
        return stage.read_summary()
      self.state = state
      return self._run(stage, extra)

  def _run(self, stage: stage_run.StageRun, extra: dict[str, Any]) -> dict[str, Any]:
    rl, workdir = self.rl, self.ctx.workdir
    main = stage_run.is_main_process()
    if stage.start_step:  # the curriculum, the pre-RL evaluation and the pass@k curves so far
      self.curriculum.load_state_dict(extra["curriculum"])
      self.health.load_state_dict(extra.get("health", {}))
      before = evaluation.EvalResult.from_dict(extra["before"])
      curves = {label: {int(k): v for k, v in c.items()} for label, c in extra["curves"].items()}
    else:
      before = self.evaluate(0, "before RL")
      curves = {"before RL": before.pass_at_k}
    writer = metrics_lib.MultiWriter([metrics_lib.JsonlWriter(stage.metrics_path),
                                      *metrics_lib.stage_writers(self.config, workdir, "rl")] if main else [])
    progress = metrics_lib.ConsoleProgress(rl.steps, every=rl.log_every, start_step=stage.start_step)
    if not stage.start_step:
      self.log(f"rl: before RL: {_eval_line(before)}")
      writer.write(0, before.metrics())
    for step in range(stage.start_step + 1, rl.steps + 1):
      metrics = self.train_step(step)
      if self.config.eval.every and step % self.config.eval.every == 0 and step < rl.steps:
        mid = self.evaluate(step, f"step {step}")
        metrics.update(mid.metrics())
        curves[f"step {step}"] = mid.pass_at_k
      writer.write(step, metrics)
      if main:
        progress.update(step, metrics)
        for line in self.health.update(step, metrics):  # alarms and notes, once a condition held `patience` steps
          progress.log(line)
      if stage.due(step):
        self._save(step, before, curves)
    after = self.evaluate(rl.steps, "after RL")
    writer.write(rl.steps, after.metrics())
    writer.close()
    curves["after RL"] = after.pass_at_k
    summary = {"before": before.to_dict(), "after": after.to_dict(), "health": self.health.summary()}
    if main:
      for line in self.health.summary_lines():
        self.log(line)
      evaluation.plot_pass_at_k_curves(curves, os.path.join(workdir, "pass_at_k.png"), "held-out pass@k")
      metrics_lib.plot_curves(stage.metrics_path, CURVES, os.path.join(workdir, "curves.png"),
                              title=f"{rl.algorithm} on {self.config.task.name}")
      self.log(f"rl: after RL:  {_eval_line(after)}")
      self.log(f"rl: {evaluation.compare(before, after)}")
    stage.finish(summary)
    self.ctx.policy = self.merged(self.state.policy.params)
    return summary


def _eval_line(r: evaluation.EvalResult) -> str:
  ks = sorted(r.pass_at_k)
  parts = [f"pass@{k} {r.pass_at_k[k]:.3f}" for k in ks if k in (1, ks[-1]) or k == 8]
  if r.greedy_accuracy is not None:
    parts.append(f"greedy {r.greedy_accuracy:.3f}")
  if "tool_call_rate" in r.extra:
    parts.append(f"tool calls {r.extra['tool_call_rate']:.3f}")
  return " | ".join(parts)


def run(ctx: Context) -> dict[str, Any]:
  """The "rl" stage: from `config.rl.init_from` when set, else from the policy the stage before left."""
  ctx.policy = stage_run.start_params(ctx, ctx.config.rl.init_from, "rl")
  return RLTrainer(ctx).run()
