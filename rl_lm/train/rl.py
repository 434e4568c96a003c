"""The RL loop: one loop for PPO and the GRPO family, the algorithm chosen by `config.rl.algorithm`.

  prompts  = curriculum.next_batch()                       Python: problems with ids
  rollout  = sampler(policy, prompts x G)                  jit: tokens, masks, sampler log-probs
  rewards  = reward.batch(problems, completions)           Python; verifier errors are masked, not scored 0
  batch    = prepare(policy, reference, value, rollout)    jit: old log-probs, reference log-probs, values
  batch   += advantages(rewards, batch)                    group-relative | leave-one-out | GAE | REINFORCE++
  for epoch, minibatch: state = update_fn(state, mb, rng)  jit once, the state donated
  curriculum.update(...); kl controller; diagnostics and alarms; evaluation every N steps

The sampler runs the policy's own parameters (cast to `rl.sampler_dtype` when set). Its log-probs
and the trainer's for the same tokens are both kept: the gap is logged every step and corrected by
truncated importance sampling (`rl.tis_cap`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import diagnostics, evaluation, sampling, tokenizer
from rl_lm import mesh as mesh_lib
from rl_lm import metrics as metrics_lib
from rl_lm.models import heads
from rl_lm.rewards import build_reward
from rl_lm.rl import advantages as adv_lib
from rl_lm.rl import kl as kl_lib
from rl_lm.rl import losses, masked
from rl_lm.rl.curriculum import Curriculum, CurriculumConfig
from rl_lm.tasks import make_task
from rl_lm.tasks.base import Problem, Task
from rl_lm.train import reward_model, rl_update, stage_run
from rl_lm.train import state as state_lib
from rl_lm.train.context import Context
from rl_lm.train.rollout import Sampler


def task_from_config(config: Any) -> Task:
  """The task named by `config.task`, with the options that task takes."""
  t = config.task
  if t.name == "arithmetic":
    return make_task("arithmetic", levels=tuple(t.levels), worked=t.worked, test_fraction=t.test_fraction,
                     decimal_demos=t.decimal_demos, seed=config.seed)
  if t.name == "preferences":
    return make_task("preferences", seed=config.seed, test_fraction=t.test_fraction, beta=config.preferences.beta)
  options: dict[str, Any] = {}
  if t.data_dir:
    options["data_dir"] = t.data_dir
  if t.name == "gsm8k":
    options["template"] = t.template
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
class Batch:
  """One step's episodes on the host, rows of a group adjacent."""

  problems: list[Problem]  # one per row
  rollout: dict[str, np.ndarray]  # tokens, prompt_mask, completion_mask, logprobs, lengths, finished, texts
  scores: np.ndarray  # [B] float32
  valid: np.ndarray  # [B] bool: the verifier decided
  success: np.ndarray  # [B] bool
  statuses: list[str]

  def take_groups(self, groups: Sequence[int], G: int) -> Batch:
    rows = np.concatenate([np.arange(g * G, (g + 1) * G) for g in groups]) if groups else np.zeros(0, int)
    return Batch([self.problems[i] for i in rows],
                 {k: (v[rows] if isinstance(v, np.ndarray) else [v[i] for i in rows]) for k, v in self.rollout.items()},
                 self.scores[rows], self.valid[rows], self.success[rows], [self.statuses[i] for i in rows])

  @staticmethod
  def concat(parts: Sequence[Batch]) -> Batch:
    r0 = parts[0].rollout
    return Batch(
      [p for b in parts for p in b.problems],
      {k: (np.concatenate([b.rollout[k] for b in parts]) if isinstance(r0[k], np.ndarray)
           else [x for b in parts for x in b.rollout[k]]) for k in r0},
      np.concatenate([b.scores for b in parts]), np.concatenate([b.valid for b in parts]),
      np.concatenate([b.success for b in parts]), [s for b in parts for s in b.statuses])


# The run-health curves drawn at the end of a run (curves.png in the workdir).
CURVES = ("rollout/reward_mean", "rollout/pass_rate", "policy/kl_ref_k3", "policy/entropy",
          "rollout/response_length_mean", "groups/zero_variance_frac", "offpolicy/logprob_gap_mean_abs",
          "train/grad_norm", "perf/tokens_per_s", "rollout/proxy_mean", "rollout/gold_mean", "policy/kl_ref_seq")


class RLTrainer:
  """Holds one RL run's objects; `run()` is the loop."""

  def __init__(self, ctx: Context, log: Any = print):
    self.ctx, self.config, self.rl = ctx, ctx.config, ctx.config.rl
    self.log = log if stage_run.is_main_process() else (lambda *_: None)  # one process speaks
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
    scfg = sampling.config_from(config.sampling, tok.eos_id, tok.pad_id)
    self.sampler = Sampler(ctx.model_cfg, scfg, tok, ctx.mesh, ctx.rules, rl.max_prompt_len, self.B,
                           dtype=rl.sampler_dtype or None)
    eval_scfg = dataclasses.replace(scfg, temperature=config.eval.temperature, greedy=False)
    self.eval_sampler = Sampler(ctx.model_cfg, eval_scfg, tok, ctx.mesh, ctx.rules, rl.max_prompt_len,
                                config.eval.rows, dtype=rl.sampler_dtype or None)
    self.greedy_sampler = Sampler(ctx.model_cfg, dataclasses.replace(scfg, greedy=True), tok, ctx.mesh, ctx.rules,
                                  rl.max_prompt_len, config.eval.rows, dtype=rl.sampler_dtype or None)
    pool = self._fitting(training_pool(self.task, config.task.pool_size, config.seed), "training")
    cur = rl.curriculum
    self.curriculum = Curriculum(
      pool,
      CurriculumConfig(enabled=cur.enabled, decay=cur.decay, floor=cur.floor, retire_above=cur.retire_above,
                       min_attempts=cur.min_attempts, initial_levels=cur.initial_levels,
                       promote_above=cur.promote_above, promote_min_seen=cur.promote_min_seen),
      seed=config.seed)
    self.test_problems = self._fitting(self.task.test_problems(config.task.eval_size, seed=config.seed), "held-out")
    self.alarm_cfg = diagnostics.AlarmConfig(
      entropy_min=rl.alarms.entropy_min, kl_max=rl.alarms.kl_max, logprob_gap_max=rl.alarms.logprob_gap_max,
      zero_variance_max=rl.alarms.zero_variance_max)
    self._skips = stage_run.SkipCounter(config.stop_after_nonfinite, "rl")
    self.learned = None  # a reward_model.RewardModel when config.reward.learned
    if config.reward.learned:
      self.learned = (reward_model.load(ctx, config.reward.model_checkpoint) if config.reward.model_checkpoint
                      else ctx.reward_model)
      if self.learned is None:
        raise ValueError("config.reward.learned needs a reward_model stage before rl or config.reward.model_checkpoint")
    self._build_state()

  def _fitting(self, problems: list[Problem], what: str) -> list[Problem]:
    """The problems whose prompt fits `rl.max_prompt_len` tokens; says how many were left out."""
    kept = [p for p in problems if len(tokenizer.encode_prompt(self.ctx.tokenizer, p.prompt)) <= self.rl.max_prompt_len]
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
    copy = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=ctx.param_shardings)
    self.reference = copy(ctx.policy)  # frozen; never donated
    policy_sh = state_lib.state_shardings(self.policy_opt, jax.eval_shape(lambda: ctx.policy), ctx.param_shardings,
                                          ctx.mesh)
    policy_state = state_lib.create(copy(ctx.policy), self.policy_opt, ctx.mesh, ctx.param_shardings)
    value_state, value_sh = None, None
    if is_ppo:
      axes = heads.param_axes(ctx.model_cfg)
      init = lambda r: heads.init(ctx.model_cfg, r, backbone=ctx.policy)
      abstract = jax.eval_shape(init, jax.random.key(0))
      v_shardings = mesh_lib.tree_shardings(ctx.mesh, ctx.rules, abstract, axes)
      value_params = jax.jit(init, out_shardings=v_shardings)(jax.random.fold_in(ctx.key, 2))
      value_sh = state_lib.state_shardings(self.value_opt, abstract, v_shardings, ctx.mesh)
      value_state = state_lib.create(value_params, self.value_opt, ctx.mesh, v_shardings)
    rep = self._replicated = mesh_lib.replicated(ctx.mesh)
    kl_state = mesh_lib.put(kl_lib.init_kl_state(rl.kl.coef), rep)  # placed as update_fn returns it: one compile
    self.state = rl_update.RLState(policy_state, value_state, kl_state)
    shardings = rl_update.RLState(policy_sh, value_sh, jax.tree.map(lambda _: rep, self.state.kl))
    self._shardings = shardings
    self.update_fn = rl_update.make_update_fn(ctx.model_cfg, rl, self.temperature, self.norm_constant,
                                              (self.policy_opt, self.value_opt), shardings, ctx.mesh, ctx.rules)
    self.prepare_fn = rl_update.make_prepare_fn(ctx.model_cfg, self.temperature, ctx.mesh, ctx.rules, is_ppo)

  # --- rollouts ----------------------------------------------------------------------------------

  def _rollout(self, problems: list[Problem], rng: jax.Array) -> Batch:
    rows = [p for p in problems for _ in range(self.G)]
    t0 = time.perf_counter()
    out = self.sampler.sample(self.state.policy.params, [p.prompt for p in rows], rng)
    t1 = time.perf_counter()
    results = self.reward.batch(rows, out["texts"])
    scores = np.asarray([r.score for r in results], np.float32)
    valid = np.asarray([r.valid for r in results], bool)
    success = valid & (scores >= self.config.reward.success_threshold)
    if self.learned is not None:  # train on the proxy; the configured rewards are the gold, measured beside it
      out["gold"] = np.where(valid, scores, np.nan).astype(np.float32)
      attn = out["prompt_mask"] | out["completion_mask"]
      scores = reward_model.score(self.ctx, self.learned.params, out["tokens"], attn, self.B) - self.learned.offset
      scores, valid = scores.astype(np.float32), np.ones_like(valid)
    self._timings["sampling"] += t1 - t0
    self._timings["scoring"] += time.perf_counter() - t1
    if self.rl.overlong == "penalty":
      scores = scores + overlong_penalty(out["lengths"], out["finished"], self.N, self.rl.overlong_buffer,
                                         self.rl.overlong_penalty)
    return Batch(rows, out, scores, valid, success, [r.status for r in results])

  def _train_valid(self, batch: Batch) -> np.ndarray:
    """Rows that train: the verifier decided, and (with overlong masking) the completion finished. [B]"""
    finished = batch.rollout["finished"] if self.rl.overlong == "mask" else True
    return batch.valid & finished

  def _zero_variance(self, batch: Batch) -> np.ndarray:
    """Groups whose training rows all scored the same (no signal). [groups]"""
    return np.asarray(adv_lib.group_zero_variance(jnp.asarray(batch.scores), self.G,
                                                  jnp.asarray(self._train_valid(batch))))

  def collect(self, step: int) -> tuple[Batch, dict[str, float]]:
    """One step's episodes; with dynamic sampling, zero-variance groups are replaced by fresh ones."""
    P, G = self.rl.prompts_per_step, self.G
    key = jax.random.fold_in(jax.random.fold_in(self.ctx.key, 3), step)
    batch = self._rollout(self.curriculum.next_batch(P), jax.random.fold_in(key, 0))
    zero_var = self._zero_variance(batch)
    # The fraction in the first draw: what a run without dynamic sampling would have trained on.
    stats = {"groups/zero_variance_frac": float(zero_var.mean()), "dynamic/extra_rollouts": 0.0}
    self._seen = [batch]
    if not self.rl.dynamic_sampling:
      return batch, stats
    kept = [batch.take_groups([g for g in range(P) if not zero_var[g]], G)]
    dropped = [batch.take_groups([g for g in range(P) if zero_var[g]], G)]
    n_kept = int((~zero_var).sum())
    for extra in range(self.rl.max_extra_rollouts):
      if n_kept >= P:
        break
      more = self._rollout(self.curriculum.next_batch(P), jax.random.fold_in(key, extra + 1))
      self._seen.append(more)
      zv = self._zero_variance(more)
      kept.append(more.take_groups([g for g in range(P) if not zv[g]], G))
      dropped.append(more.take_groups([g for g in range(P) if zv[g]], G))
      n_kept += int((~zv).sum())
      stats["dynamic/extra_rollouts"] = float(extra + 1)
    # Fill to exactly P groups (fixed shapes): signal first, zero-variance groups only if short.
    merged = Batch.concat([b for b in kept + dropped if b.problems])
    batch = merged.take_groups(list(range(P)), G)
    stats["dynamic/kept_signal_frac"] = float(min(n_kept, P) / P)
    return batch, stats

  # --- one step ----------------------------------------------------------------------------------

  def _device(self, x: np.ndarray) -> jax.Array:
    return mesh_lib.put(x, mesh_lib.batch_sharding(self.ctx.mesh, self.ctx.rules, x.shape))

  def train_step(self, step: int) -> dict[str, float]:
    timings = self._timings = {"sampling": 0.0, "scoring": 0.0}
    batch, stats = self.collect(step)
    r = batch.rollout
    tokens, comp = r["tokens"], r["completion_mask"]
    attn = r["prompt_mask"] | comp
    t1 = time.perf_counter()
    value_params = self.state.value.params if self.state.value is not None else None
    prepared = self.prepare_fn(self.state.policy.params, self.reference, value_params, self._device(tokens),
                               self._device(attn))
    prepared = mesh_lib.fetch(prepared)
    train_valid = self._train_valid(batch)
    adv = rl_update.compute_advantages(self.rl, batch.scores, train_valid, comp, prepared, float(self.state.kl.coef))
    if self.rl.tis_cap > 0:
      is_w, tis_metrics = losses.truncated_is_weights(jnp.asarray(prepared["old_logp"]), jnp.asarray(r["logprobs"]),
                                                      jnp.asarray(comp), self.rl.tis_cap)
      is_w, tis_metrics = np.asarray(is_w), {k: float(v) for k, v in tis_metrics.items()}
    else:
      is_w, tis_metrics = np.ones_like(prepared["old_logp"]), {}
    mask = comp & train_valid[:, None]
    data = {"tokens": tokens, "attn_mask": attn, "mask": mask, "old_logp": prepared["old_logp"],
            "ref_logp": prepared["ref_logp"], "advantages": adv["advantages"].astype(np.float32),
            "is_weights": is_w.astype(np.float32)}
    if self.rl.algorithm == "ppo":
      data["old_values"] = prepared["values"].astype(np.float32)
      data["returns"] = adv["returns"].astype(np.float32)
    timings["prepare"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    update_metrics = self._update(data, step)
    timings["update"] = time.perf_counter() - t2

    # KL controller, curriculum, diagnostics.
    kl_now = float(masked.masked_mean(kl_lib.estimate(prepared["old_logp"], prepared["ref_logp"], "k1", mask), mask))
    # The controller's n_steps and horizon count episodes (Ziegler et al. 2019), B of them per step.
    kl_state = kl_lib.update_kl_state(self.state.kl, kl_now, self.B, adaptive=self.rl.kl.adaptive,
                                      target=self.rl.kl.target, horizon=self.rl.kl.horizon)
    self.state = self.state._replace(kl=mesh_lib.put(kl_state, self._replicated))  # same placement: no recompile
    for seen in self._seen:
      self._update_curriculum(seen)
    metrics = diagnostics.rollout_metrics(
      completion_mask=comp, scores=batch.scores, valid=batch.valid, success=batch.success, group_size=self.G,
      sampler_logprobs=r["logprobs"], logprobs=prepared["old_logp"], ref_logprobs=prepared["ref_logp"],
      entropy=prepared["entropy"], truncated=~r["finished"], lengths=r["lengths"],
      values=data.get("old_values"), returns=data.get("returns"))  # IS-weight statistics come from tis_metrics
    metrics = {k: float(v) for k, v in metrics.items()}
    if self.learned is not None:
      metrics["rollout/proxy_mean"] = float(np.mean(batch.scores))
      metrics["rollout/gold_mean"] = float(np.nanmean(r["gold"])) if np.isfinite(r["gold"]).any() else float("nan")
    if self.rl.dynamic_sampling:  # the trained batch's own fraction, after refilling
      metrics["dynamic/zero_variance_frac_trained"] = metrics["groups/zero_variance_frac"]
    metrics.update(stats)
    metrics.update(tis_metrics)
    metrics.update(update_metrics)
    metrics.update(self.curriculum.metrics())
    metrics["policy/kl_coef"] = float(self.state.kl.coef)
    metrics["rollout/verifier_errors"] = float(sum((~b.valid).sum() for b in self._seen))  # dropped groups too
    # Timeouts the completions caused (their program or answer overran): scored 0, counted apart.
    metrics["rollout/timeouts"] = float(sum(s == "timeout" for b in self._seen for s in b.statuses))
    n_tokens = int(sum(b.rollout["lengths"].sum() for b in self._seen))
    metrics.update(diagnostics.perf_metrics(timings, n_tokens))
    return metrics

  def _update_curriculum(self, batch: Batch) -> None:
    G = self.G
    problems = batch.problems[::G]
    succ = batch.success.reshape(-1, G)
    val = batch.valid.reshape(-1, G)
    self.curriculum.update(problems, (succ & val).sum(1).tolist(), val.sum(1).tolist())

  def _update(self, data: dict[str, np.ndarray], step: int) -> dict[str, float]:
    rl = self.rl
    B = self.B
    n_mb = rl.minibatches
    A = rl.grad_accum
    m = B // (n_mb * A)
    rng = np.random.default_rng([self.config.seed, step])
    key = jax.random.fold_in(jax.random.fold_in(self.ctx.key, 4), step)
    collected = []
    for epoch in range(rl.epochs):
      order = rng.permutation(B)
      for j in range(n_mb):
        rows = order[j * m * A: (j + 1) * m * A]
        mb = {k: v[rows].reshape((A, m) + v.shape[1:]) for k, v in data.items()}
        weight = rl_update.micro_weights(mb["mask"], rl.loss_mode)
        mb = {k: mesh_lib.put(v, self._micro_sharding(v.shape)) for k, v in mb.items()}
        mb["weight"] = jnp.asarray(weight)
        self.state, met = self.update_fn(self.state, mb, jax.random.fold_in(key, epoch * n_mb + j))
        collected.append(met)
    collected = mesh_lib.fetch(collected)
    self._skips.count([float(c["train/skipped"]) for c in collected], collected, step)
    out = {k: float((np.max if rl_update.is_max_metric(k) else np.mean)([c[k] for c in collected]))
           for k in collected[0]}
    out["train/skipped"] = float(np.sum([c["train/skipped"] for c in collected]))
    return out

  def _micro_sharding(self, shape: tuple[int, ...]) -> jax.sharding.NamedSharding:
    return mesh_lib.named_sharding(self.ctx.mesh, (None, "batch") + (None,) * (len(shape) - 2), self.ctx.rules, shape)

  # --- evaluation --------------------------------------------------------------------------------

  def evaluate(self, step: int, label: str) -> evaluation.EvalResult:
    cfg = self.config.eval
    # The same key at every evaluation (common random numbers): before/after differences reflect the
    # policy, not a fresh draw of sampling noise.
    key = jax.random.fold_in(self.ctx.key, 5)
    params = self.state.policy.params

    sampled: list[tuple[str, str]] = []

    def sample_fn(prompts: list[str], n: int) -> list[list[str]]:
      texts = self.eval_sampler.sample(params, [p for p in prompts for _ in range(n)], key)["texts"]
      sampled.extend(zip([p for p in prompts for _ in range(n)], texts, strict=True))
      return [texts[i * n: (i + 1) * n] for i in range(len(prompts))]

    def greedy_fn(prompts: list[str]) -> list[str]:
      return self.greedy_sampler.sample(params, prompts, key)["texts"]

    correct_fn = evaluation.correct_from_reward(self.correctness)  # verifier faults: excluded, counted
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

  def _resume(self) -> tuple[evaluation.EvalResult, dict[str, dict[int, float]]]:
    """Restores the latest checkpoint: train states, KL controller, curriculum; returns the pre-RL
    evaluation and the pass@k curves recorded so far."""
    items, extra = self._stage.restore(self._checkpoint_targets())
    value = stage_run.state_from_items(items, "value_") if self.state.value is not None else None
    self.state = rl_update.RLState(stage_run.state_from_items(items), value, items["kl"])
    self.curriculum.load_state_dict(extra["curriculum"])
    curves = {label: {int(k): v for k, v in c.items()} for label, c in extra["curves"].items()}
    return evaluation.EvalResult.from_dict(extra["before"]), curves

  def _save(self, step: int, before: evaluation.EvalResult, curves: dict[str, dict[int, float]]) -> None:
    cur = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.curriculum.state_dict().items()}
    extra = {"curriculum": cur, "before": before.to_dict(),
             "curves": {label: {str(k): v for k, v in c.items()} for label, c in curves.items()}}
    self._stage.save(step, self._checkpoint_items(), extra)

  def run(self) -> dict[str, Any]:
    """The RL stage: resumes from `<workdir>/checkpoints/rl` when it holds checkpoints."""
    stage = self._stage = stage_run.StageRun(self.config, self.ctx.workdir, "rl", self.rl.steps, "metrics.jsonl",
                                             self._skips, self.log)
    try:
      if stage.complete:
        items, _ = stage.restore({"params": stage_run.abstract(jax.eval_shape(lambda: self.state.policy.params),
                                                              self._shardings.policy.params)})
        self.ctx.policy = items["params"]
        self.log(f"rl: complete in {stage.directory} (step {stage.start_step}); its policy is loaded")
        path = os.path.join(self.ctx.workdir, "rl_summary.json")
        return json.load(open(path)) if os.path.exists(path) else {}
      return self._run(stage)
    finally:
      stage.close()

  def _run(self, stage: stage_run.StageRun) -> dict[str, Any]:
    rl, workdir = self.rl, self.ctx.workdir
    main = stage_run.is_main_process()
    if stage.start_step:
      before, curves = self._resume()
      self.log(f"rl: resuming from step {stage.start_step} of {rl.steps} ({stage.directory})")
    else:
      stage.fresh_metrics()
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
        for alarm in diagnostics.check_alarms(metrics, self.alarm_cfg):
          progress.log(alarm)
      if stage.due(step):
        self._save(step, before, curves)
    after = self.evaluate(rl.steps, "after RL")
    writer.write(rl.steps, after.metrics())
    writer.close()
    curves["after RL"] = after.pass_at_k
    summary = {"before": before.to_dict(), "after": after.to_dict()}
    if main:
      evaluation.plot_pass_at_k_curves(curves, os.path.join(workdir, "pass_at_k.png"), "held-out pass@k")
      metrics_lib.plot_curves(stage.metrics_path, CURVES, os.path.join(workdir, "curves.png"),
                              title=f"{rl.algorithm} on {self.config.task.name}")
      self.log(f"rl: after RL:  {_eval_line(after)}")
      self.log(f"rl: {evaluation.compare(before, after)}")
      with open(os.path.join(workdir, "rl_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    stage.finish()
    self.ctx.policy = self.state.policy.params
    return summary


def _eval_line(r: evaluation.EvalResult) -> str:
  ks = sorted(r.pass_at_k)
  parts = [f"pass@{k} {r.pass_at_k[k]:.3f}" for k in ks if k in (1, ks[-1]) or k == 8]
  if r.greedy_accuracy is not None:
    parts.append(f"greedy {r.greedy_accuracy:.3f}")
  return " | ".join(parts)


def run(ctx: Context) -> dict[str, Any]:
  """The "rl" stage: from `config.rl.init_from` when set, else from the policy the stage before left."""
  if ctx.config.rl.init_from:
    target = stage_run.abstract(jax.eval_shape(lambda: ctx.policy), ctx.param_shardings)
    ctx.policy = stage_run.load_params(ctx.config.rl.init_from, target)
    if stage_run.is_main_process():
      print(f"rl: starting from the policy in {ctx.config.rl.init_from}", flush=True)
  return RLTrainer(ctx).run()
