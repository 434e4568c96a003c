"""The RL loop: one loop for PPO and the GRPO family, the algorithm chosen by `config.rl.algorithm`.

  batch    = source.next(step)                            rl_lm/train/source.py: prompts from the curriculum,
                                                          rollouts (sampled ahead, dynamic sampling) or episodes,
                                                          scored on the host; tokens stay on device
  teacher  = teacher(teacher_params, batch)               jit, with a teacher (rl.distill): its log-probs (and
                                                          hidden states for the JSD), a call of its own whose
                                                          failure masks the step's rows, not the run
  train    = prepare(policy, reference, value, batch)     jit: old / reference log-probs, values, advantages
                                                          (group-relative | leave-one-out | GAE | REINFORCE++),
                                                          KL penalty, IS weights, rollout diagnostics; with
                                                          a teacher its per-token reward too
  state    = update(state, train)                         jit (rl_update.py): epochs x minibatches as lax.scan,
                                                          the policy loss (rl/policy_losses.py), KL controller
  log; alarms; evaluation every N steps; checkpoints

The trainer holds the train state (policy, value, KL controller) and nothing of the pipeline: the rollout source
owns the curriculum, the queue of rollouts sampled ahead and the environments.

The sampler runs the policy's own parameters (cast to `rl.sampler_dtype` when set). Its log-probs
and the trainer's for the same tokens are both kept: the gap is logged every step and corrected by
importance weights and rejection (`rl.correction`).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import diagnostics, evaluation, health, keys
from rl_lm import mesh as mesh_lib
from rl_lm import metrics as metrics_lib
from rl_lm.models import heads
from rl_lm.models import lora as lora_lib
from rl_lm.rl import kl as kl_lib
from rl_lm.train import held_out, rl_update, stage_run
from rl_lm.train import state as state_lib
from rl_lm.train import teacher as teacher_lib
from rl_lm.train.context import Context
from rl_lm.train.source import RolloutSource

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
    self.B = rl.prompts_per_step * rl.group_size
    self.N = config.sampling.max_new_tokens
    self.norm_constant = rl.norm_constant or self.N
    self.temperature = config.sampling.temperature
    self.health = health.Monitor(diagnostics.AlarmConfig.from_section(rl.alarms))
    self._skips = stage_run.SkipCounter(config.stop_after_nonfinite, "rl")
    self.lora = lora_lib.from_section(config.model)  # None: every weight trains
    self.source = RolloutSource(ctx, self.policy, lambda step: stage_run.checkpoint_due(config, rl.steps, step),
                                self.log)
    self.test_problems = self.source.fitting(self.source.task.test_problems(config.task.eval_size, seed=config.seed),
                                             "held-out")
    self.held_out = held_out.HeldOut(ctx, self.source.scfg, self.test_problems)
    self._build_state()

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
    self.teacher = teacher_lib.load(self.config, ctx, self.log) if rl.distill.coef else None  # frozen, on the mesh
    teacher_cfg = self.teacher.model_cfg if self.teacher else None
    self.update_fn = rl_update.make_update_fn(ctx.model_cfg, rl, self.temperature, self.norm_constant,
                                              (self.policy_opt, self.value_opt), shardings, ctx.mesh, ctx.rules,
                                              self.lora, teacher_cfg)
    self.prepare_fn = rl_update.make_prepare_fn(ctx.model_cfg, rl, self.temperature, ctx.mesh, ctx.rules, self.lora)
    if self.teacher:
      self.teacher_fn = rl_update.make_teacher_fn(teacher_cfg, rl, self.temperature, ctx.mesh, ctx.rules)
      self._failed_teacher_fn: Any = None  # made at the teacher's first failure
    if self.teacher and rl.distill.on_policy < 1:  # some steps sample from the teacher, with the policy's sampler
      teacher_lib.check_samples(ctx.model_cfg, self.teacher.model_cfg, self.lora)
      self.source.teacher_params = self.teacher.params

  def policy(self) -> Any:
    """The current policy's parameters as the model takes them (with LoRA: the base carrying the adapters)."""
    return rl_update.policy_params(self.state.policy.params, self.reference, self.lora)

  def merged(self, trainable: Any) -> Any:
    """Plain parameters of a trained policy (LoRA merged in), for the stages after RL and for export."""
    return lora_lib.merge(self.reference, trainable, self.lora) if self.lora else trainable

  # --- one step ----------------------------------------------------------------------------------

  def train_step(self, step: int) -> dict[str, float]:
    """next batch -> prepare (log-probs, values, advantages) -> update; returns the step's metrics."""
    timings: dict[str, float] = {}
    batch, seen, stats = self.source.next(step, step - 1, timings)  # the policy has had step - 1 updates
    with diagnostics.timed(timings, "prepare"):  # log-probs, values, advantages, IS weights, diagnostics
      value = self.state.value.params if self.state.value is not None else None
      host = batch.host
      scored = self._device(rl_update.Scored(host.scores, host.valid, self.source.trains(batch), host.success))
      teacher = self.teacher and self.teacher.params
      teacher_scores, teacher_error = self._score_teacher(step, batch.device) if self.teacher else (None, None)
      by_student = None  # with on_policy < 1: whether the student sampled this step's rollouts
      if self.rl.distill.on_policy < 1:
        by_student = mesh_lib.put(np.float32(not batch.by_teacher), mesh_lib.replicated(self.ctx.mesh))
      train_batch, rollout_metrics = self.prepare_fn(self.state.policy.params, self.reference, value, batch.device,
                                                     scored, self.state.kl.coef, teacher_scores, by_student)
      jax.block_until_ready(train_batch)
    with diagnostics.timed(timings, "update"):  # epochs x minibatches, then the KL controller, in one jit
      key = keys.fold(self.ctx.key, 4, step)
      self.state, update_metrics = self.update_fn(self.state, train_batch, key, self.reference if self.lora else None,
                                                  teacher if self.rl.distill.loss == "jsd" else None)
      rollout_metrics, update_metrics = mesh_lib.fetch((rollout_metrics, update_metrics))
    flags = update_metrics.pop("train/skipped_flags")
    self._skips.count(flags.tolist(), [update_metrics] * len(flags), step)
    metrics = {k: float(v) for k, v in {**rollout_metrics, **update_metrics}.items()}
    if self.rl.dynamic_sampling:  # the trained batch's own fraction, after refilling
      metrics["dynamic/zero_variance_frac_trained"] = metrics["groups/zero_variance_frac"]
    metrics.update(stats)
    metrics.update(self.source.metrics(batch, seen, timings))
    if self.teacher:
      metrics["distill/teacher_error"] = float(teacher_error is not None)
    if self.rl.distill.on_policy < 1:
      metrics["distill/teacher_step"] = float(batch.by_teacher)
    if batch.by_teacher:  # the rollout's own account describes the teacher's samples: logged apart, not alarmed on
      own = set(rollout_metrics) | set(stats)
      metrics = {(f"teacher_samples/{k}" if k in own or k.startswith(("rollout/", "groups/")) else k): v
                 for k, v in metrics.items()}
    return metrics

  def _score_teacher(self, step: int, rollout: Any) -> tuple[rl_update.TeacherScores, str | None]:
    """The teacher's scores of the rollout, and None; or, when its forward raises (an XLA runtime error, a host
    failure), scores that fail every row (non-finite log-probs: `prepare` masks the rows and counts them in
    distill/teacher_invalid_frac, which alarms; the update then takes no step) and the error, logged. The run goes
    on: a teacher that fails every step shows as that alarm at every step. (On a multi-host mesh the failure must
    reach every process, as an error of the collective program does; one that fails alone would stall the
    others at their next collective, as any host-side failure does.)"""
    attn = rollout.prompt_mask | rollout.completion_mask
    try:
      return jax.block_until_ready(self.teacher_fn(self.teacher.params, rollout.tokens, attn)), None
    except Exception as e:  # noqa: BLE001 -- any failure of the teacher is its rows', counted and alarmed
      error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
      self.log(f"rl: step {step}: the teacher's forward failed ({error}); its {rollout.tokens.shape[0]} rows are "
               "masked (distill/teacher_invalid_frac)")
      return self._failed_teacher(rollout.tokens), error

  def _failed_teacher(self, tokens: jax.Array) -> rl_update.TeacherScores:
    """TeacherScores shaped and placed like the teacher's own, every log-prob nan (hidden states 0: finite)."""
    if self._failed_teacher_fn is None:
      cfg, jsd = self.teacher.model_cfg, self.rl.distill.loss == "jsd"

      def failed(tokens: jax.Array) -> rl_update.TeacherScores:  # [B, T] -> logp [B, T], hidden [B, T-1, D']
        B, T = tokens.shape
        logp = mesh_lib.constrain(jnp.full((B, T), jnp.nan, jnp.float32), ("batch", None))
        hidden = jnp.zeros((B, T - 1, cfg.d_model), cfg.compute_dtype)
        return rl_update.TeacherScores(logp, mesh_lib.constrain(hidden, ("batch", None, None)) if jsd else None)

      self._failed_teacher_fn = jax.jit(mesh_lib.bind(failed, self.ctx.mesh, self.ctx.rules))
    return self._failed_teacher_fn(tokens)

  def _device(self, tree: Any) -> Any:
    """Host [B] arrays onto the mesh, the batch sharded like the rollout's."""
    return mesh_lib.put(tree, mesh_lib.batch_sharding(self.ctx.mesh, self.ctx.rules, (self.B,)))

  # --- evaluation --------------------------------------------------------------------------------

  def evaluate(self, step: int, label: str) -> evaluation.EvalResult:
    """Held-out pass@k and greedy accuracy (`held_out.HeldOut`: the same draws at every evaluation)."""
    cfg, params, sampled = self.config.eval, self.policy(), []
    if self.source.agent is not None:  # pass@k over whole episodes, the environment the judge
      result = self.source.agent.evaluate(params, self.test_problems, cfg.num_samples, cfg.greedy, self.held_out.key)
    else:
      result = self.held_out.evaluate(params, sampled)
    gold = self.source.reward if self.source.learned is not None else self.source.gold
    if gold is not None:  # the gold the learned reward (or a judge) stands in for, on the same samples
      by_prompt = {p.prompt: p for p in self.test_problems}
      scored = gold.batch([by_prompt[p] for p, _ in sampled], [t for _, t in sampled])
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

  def _save(self, stage: stage_run.StageRun, step: int, before: evaluation.EvalResult,
            curves: dict[str, dict[int, float]]) -> None:
    cur = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.source.curriculum.state_dict().items()}
    extra = {"curriculum": cur, "before": before.to_dict(), "health": self.health.state_dict(),
             "curves": {label: {str(k): v for k, v in c.items()} for label, c in curves.items()}}
    stage.save(step, self._checkpoint_items(), extra)

  def run(self) -> dict[str, Any]:
    """The RL stage: resumes from `<workdir>/checkpoints/rl` when it holds checkpoints."""
    try:
      return self._stage_run()
    finally:
      self.source.close()

  def _stage_run(self) -> dict[str, Any]:
    with stage_run.StageRun(self.config, self.ctx.workdir, "rl", self.rl.steps, "metrics.jsonl", self._skips,
                            self.log) as stage:
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
      self.source.curriculum.load_state_dict(extra["curriculum"])
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
      self.log(f"rl: before RL: {before.line()}")
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
        for line in self.health.update(step, metrics, rules=not metrics.get("distill/teacher_step")):
          progress.log(line)  # alarms and notes, once a condition held `patience` steps (on the student's samples)
      if stage.due(step):
        self._save(stage, step, before, curves)
    after = self.evaluate(rl.steps, "after RL")
    writer.write(rl.steps, after.metrics())
    writer.close()
    curves["after RL"] = after.pass_at_k
    summary = {"before": before.to_dict(), "after": after.to_dict(), "health": self.health.summary()}
    if main:
      for line in self.health.summary_lines() + self.source.summary_lines():
        self.log(line)
      evaluation.plot_pass_at_k_curves(curves, os.path.join(workdir, "pass_at_k.png"), "held-out pass@k")
      metrics_lib.plot_curves(stage.metrics_path, CURVES, os.path.join(workdir, "curves.png"),
                              title=f"{rl.algorithm} on {self.config.task.name}")
      self.log(f"rl: after RL:  {after.line()}")
      self.log(f"rl: {evaluation.compare(before, after)}")
    stage.finish(summary)
    self.ctx.policy = self.merged(self.state.policy.params)
    return summary


def run(ctx: Context) -> dict[str, Any]:
  """The "rl" stage: from `config.rl.init_from` when set, else from the policy the stage before left."""
  ctx.policy = stage_run.start_params(ctx, ctx.config.rl.init_from, "rl")
  return RLTrainer(ctx).run()
