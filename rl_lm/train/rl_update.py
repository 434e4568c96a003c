"""The two jitted halves of an RL step (rl_lm/train/rl.py): `prepare` and `update`, both on device; with a
teacher, its forward before them as a call of its own.

  teacher(teacher_params, tokens, attn)                                -> TeacherScores
  prepare(policy, reference, value, rollout, scored, kl_coef[, teacher]) -> (TrainBatch, rollout diagnostics)
  update(state, batch, key)                                            -> (state, update metrics)

Between the sampler and the optimizer nothing leaves the device: the rollout's token arrays stay where the
sampler wrote them, the host sends the scores once (`Scored`), and only scalar metrics come back.

Arrays are aligned per token: `logp[b, t]` is the log-prob of `tokens[b, t]` given the tokens before it,
and `mask[b, t]` marks completion tokens that train. Values follow the same alignment: `values[b, t]` is
the value of the state just before token t.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rl_lm import diagnostics, sampling
from rl_lm import mesh as mesh_lib
from rl_lm.models import heads, lora, scoring, transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.rl import advantages as adv_lib
from rl_lm.rl import correction, distill, losses, masked, policy_losses
from rl_lm.rl import kl as kl_lib
from rl_lm.train import state as state_lib


class RLState(NamedTuple):
  policy: state_lib.TrainState
  value: state_lib.TrainState | None  # PPO only
  kl: kl_lib.KLState


class Scored(NamedTuple):
  """The host's verdict on each episode, sent to the device once per step. All [B]."""

  scores: jax.Array  # float32: what trains (the learned reward when there is one; penalties included)
  valid: jax.Array  # bool: the verifier decided
  trains: jax.Array  # bool: valid, and (with overlong masking) the completion finished
  success: jax.Array  # bool: solved


class TrainBatch(NamedTuple):
  """One step's update inputs, [B, T] each, on device; the PPO fields are None for the other algorithms."""

  tokens: jax.Array
  attn_mask: jax.Array
  mask: jax.Array  # completion tokens of the rows that train
  old_logp: jax.Array
  ref_logp: jax.Array
  advantages: jax.Array
  is_weights: jax.Array
  old_values: jax.Array | None = None
  returns: jax.Array | None = None
  teacher_hidden: jax.Array | None = None  # [B, T-1, D'] the teacher's final hidden states (rl.distill.loss "jsd")


class TeacherScores(NamedTuple):
  """The teacher's forward on a rollout, made by `make_teacher_fn` before `prepare`."""

  logp: jax.Array  # [B, T] float32, aligned like the policy's log-probs; non-finite where the teacher failed
  hidden: jax.Array | None = None  # [B, T-1, D'] its final hidden states, for the "jsd" loss of the update


# ------------------------------------------------------------------------------------------------
# Per-token quantities


def token_values(cfg: ModelConfig, value_params: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """values[b, t]: the value head at position t - 1, the state before token t. -> [B, T]."""
  v = heads.forward(cfg, value_params, tokens, mask)
  return jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], 1)


def advantages(rl: Any, scores: jax.Array, trains: jax.Array, completion_mask: jax.Array, old_logp: jax.Array,
               ref_logp: jax.Array, values: jax.Array | None, kl_coef: jax.Array
               ) -> tuple[jax.Array, jax.Array | None]:
  """Advantages [B, T] (and returns [B, T] for PPO, else None) by the estimator `rl.algorithm` names
  (rl_lm.rl.advantages.ESTIMATORS); rows that do not train get 0. scores, trains: [B]; the rest [B, T]."""
  estimator, token_rewards = adv_lib.ESTIMATORS.get(rl.algorithm), None
  if not estimator.group:  # per-token rewards, with the KL penalty when it is placed in the reward
    kl_tok = kl_lib.estimate(old_logp, ref_logp, rl.kl.estimator, mask=completion_mask)
    coef = kl_coef if rl.kl.placement == "reward" else 0.0
    token_rewards = kl_lib.penalised_rewards(scores, kl_tok, completion_mask, coef)
  adv, returns = estimator.fn(adv_lib.Inputs(scores, trains, completion_mask, token_rewards, values), rl)
  return jnp.where(completion_mask & trains[:, None], adv, 0.0), returns


# ------------------------------------------------------------------------------------------------
# prepare


def policy_params(trainable: Any, reference: Any, lora_cfg: lora.LoraConfig | None) -> Any:
  """The policy's parameters as the model takes them: `trainable` itself, or with LoRA the reference (the frozen
  base) carrying the trainable adapters."""
  return lora.combine(reference, trainable, lora_cfg) if lora_cfg else trainable


def row_chunks(fn: Callable, c: int, *xs: jax.Array) -> Any:
  """fn over the rows of xs ([B, ...] each) in c chunks, one after another (peak memory / c): chunk i holds rows i,
  i + c, i + 2c, ..., so that every chunk is spread over the batch's shards alike. Outputs [B, ...] as fn's."""
  if c == 1:
    return fn(*xs)
  B = xs[0].shape[0]
  split = lambda x: x.reshape(B // c, c, *x.shape[1:]).swapaxes(0, 1)  # noqa: E731 -- [B, ...] -> [c, B/c, ...]
  out = jax.lax.map(lambda ys: fn(*ys), tuple(split(x) for x in xs))
  return jax.tree.map(lambda y: y.swapaxes(0, 1).reshape(B, *y.shape[2:]), out)


def make_teacher_fn(teacher_cfg: ModelConfig, rl: Any, temperature: float, mesh: Any, rules: mesh_lib.Rules
                    ) -> Callable:
  """jit(teacher, tokens [B, T], attn [B, T]) -> TeacherScores: the frozen teacher's per-token log-probs of a
  rollout, and with `rl.distill.loss` = "jsd" its final hidden states for the update (its forward is then not run
  again per minibatch; the update makes its logits chunk by chunk from them). Rows in `rl.prepare_chunks` chunks.

  A call of its own, not fused into `prepare`, so that the RL step can catch the teacher's failure (a crash) and
  mask its rows (rl_lm/train/rl.py), as it masks the rows the teacher scores non-finitely."""
  keep_hidden = rl.distill.loss == "jsd"

  def teacher_scores(teacher: Any, tokens: jax.Array, attn: jax.Array) -> TeacherScores:
    def one(tokens: jax.Array, attn: jax.Array) -> TeacherScores:
      h = transformer.hidden_states(teacher_cfg, teacher, tokens, attn)[:, :-1]  # [b, T-1, D']
      logp = scoring.scores_from_hidden(teacher_cfg, teacher, h, tokens, temperature).logp  # [b, T]
      return TeacherScores(logp, h if keep_hidden else None)

    out = row_chunks(one, rl.prepare_chunks, tokens, attn)
    hidden = out.hidden if out.hidden is None else mesh_lib.constrain(out.hidden, ("batch", None, None))
    return TeacherScores(mesh_lib.constrain(out.logp, ("batch", None)), hidden)

  return jax.jit(mesh_lib.bind(teacher_scores, mesh, rules))


def make_prepare_fn(cfg: ModelConfig, rl: Any, temperature: float, mesh: Any, rules: mesh_lib.Rules,
                    lora_cfg: lora.LoraConfig | None = None) -> Callable:
  """jit(policy, reference, value, rollout: sampling.Rollout, scored: Scored, kl_coef, teacher=None, by_student=None)
  -> (TrainBatch, metrics). `policy` is the trainable tree (the adapters, with `lora_cfg`); `teacher` the
  TeacherScores of the rollout (`make_teacher_fn`) when `rl.distill.coef` > 0.

  Everything between the scores and the update: old and reference log-probs, values, advantages (with the
  KL penalty in the reward when configured, and the distillation reward with a teacher), truncated importance
  weights, and the rollout's run-health metrics (`diagnostics.rollout_metrics`, float32 scalars).

  `by_student` (a float32 scalar, 1 or 0; with `rl.distill.on_policy` < 1) says whether the student sampled the
  rollout. On the teacher's samples (0) no policy gradient is taken (advantages 0; the sequences train the
  distillation loss only) and no sampler correction applies: the sampler was another model.
  """
  is_ppo = rl.algorithm == "ppo"
  distilling = rl.distill.coef > 0

  def prepare(policy, reference, value, rollout: sampling.Rollout, scored: Scored, kl_coef: jax.Array,
              teacher: TeacherScores | None = None, by_student: jax.Array | None = None):
    if distilling and teacher is None:
      raise ValueError("rl.distill.coef > 0: prepare needs the teacher's scores (make_teacher_fn)")
    comp = rollout.completion_mask  # [B, T]
    attn = rollout.prompt_mask | comp
    policy = policy_params(policy, reference, lora_cfg)

    def score(tokens: jax.Array, attn: jax.Array) -> tuple[jax.Array, ...]:  # [b, T] -> 3 or 4 x [b, T]
      s = scoring.score_tokens(cfg, policy, tokens, attn, temperature)
      logp, entropy = s.logp, s.entropy
      ref_logp = scoring.score_tokens(cfg, reference, tokens, attn, temperature).logp
      return (logp, entropy, ref_logp) + ((token_values(cfg, value, tokens, attn),) if is_ppo else ())

    scores = row_chunks(score, rl.prepare_chunks, rollout.tokens, attn)
    old_logp, entropy, ref_logp = scores[:3]  # [B, T] each
    values = scores[3] if is_ppo else None
    adv, returns = advantages(rl, scored.scores, scored.trains, comp, old_logp, ref_logp, values, kl_coef)
    metrics: dict[str, jax.Array] = {}
    trains_rows = scored.trains  # [B]
    if distilling:  # a row the teacher scored non-finitely is its failure: masked and counted, never a 0
      teacher_ok = jnp.all(jnp.isfinite(teacher.logp) | ~comp, axis=1)  # [B]
      teacher_logp = jnp.where(comp & teacher_ok[:, None], teacher.logp, 0.0)
      trains_rows = trains_rows & teacher_ok
      trains = comp & trains_rows[:, None]
      if rl.distill.loss == "reward":  # the teacher's per-token reward on the student's own samples
        adv = distill.advantages(adv, old_logp, teacher_logp, trains, rl.distill.coef, rl.distill.verifier)
      else:  # the divergence is a loss term of the update; the verifier's advantage keeps its weight
        adv = rl.distill.verifier * adv
    if by_student is not None:
      adv = adv * by_student
    is_w, keep, fix = jnp.ones_like(old_logp), comp, rl.correction
    if fix.cap > 0:
      is_w, metrics = correction.importance_weights(old_logp, rollout.logprobs, comp, fix.level, fix.cap, fix.lower)
    if fix.reject != "none":
      keep, rejected = correction.rejection_mask(old_logp, rollout.logprobs, comp, fix.reject, fix.reject_low,
                                                 fix.reject_high)
      metrics.update(rejected)
    metrics.update(diagnostics.rollout_metrics(
      completion_mask=comp, scores=scored.scores, valid=scored.valid, success=scored.success, group_size=rl.group_size,
      sampler_logprobs=rollout.logprobs, logprobs=old_logp, ref_logprobs=ref_logp, entropy=entropy,
      truncated=~rollout.finished, lengths=rollout.lengths, values=values, returns=returns))
    if distilling:
      metrics.update(distill.metrics(old_logp, teacher_logp, comp & teacher_ok[:, None]))
      has_comp = jnp.any(comp, axis=1)
      metrics["distill/teacher_invalid_frac"] = (jnp.sum(has_comp & ~teacher_ok) /
                                                 jnp.maximum(jnp.sum(has_comp), 1)).astype(jnp.float32)
    if by_student is not None:  # the teacher sampled: its tokens all train the divergence, unweighted
      is_w, keep = jnp.where(by_student > 0, is_w, 1.0), jnp.where(by_student > 0, keep, comp)
    mask = keep & trains_rows[:, None]
    hidden = teacher.hidden if distilling else None
    return TrainBatch(rollout.tokens, attn, mask, old_logp, ref_logp, adv, is_w, values, returns, hidden), metrics

  return jax.jit(mesh_lib.bind(prepare, mesh, rules))


# ------------------------------------------------------------------------------------------------
# update


def is_max_metric(key: str) -> bool:
  """Metrics that combine across micro-batches and minibatches by max rather than by (weighted) mean."""
  return key.endswith("_max")


def micro_weights(mask: jax.Array, mode: str) -> jax.Array:
  """Weights of the micro-batches [A, m, T] of one minibatch, so that the weighted sum of their aggregated
  losses is the minibatch's aggregated loss exactly. -> [A] float32."""
  if mode == "token-mean":
    per = jnp.sum(mask, axis=(1, 2), dtype=jnp.float32)
  elif mode == "seq-mean-token-sum-norm":
    per = jnp.full(mask.shape[:1], mask.shape[1], jnp.float32)
  else:
    per = jnp.sum(jnp.any(mask, axis=2), axis=1, dtype=jnp.float32)
  total = jnp.sum(per)
  return jnp.where(total > 0, per / jnp.maximum(total, 1.0), 0.0)


def make_update_fn(cfg: ModelConfig, rl: Any, temperature: float, norm_constant: int, optimizers: tuple,
                   shardings: RLState, mesh: Any, rules: mesh_lib.Rules, lora_cfg: lora.LoraConfig | None = None,
                   teacher_cfg: ModelConfig | None = None) -> Callable:
  """update_fn(state, batch: TrainBatch, key, frozen=None, teacher=None) -> (state, metrics), jitted once with the
  state donated.

  With `lora_cfg` the policy state holds the adapters and `frozen` is the base they ride on (the reference
  policy, never donated); gradients and optimizer state exist for the adapters only. With `rl.distill.loss` =
  "jsd", `teacher` holds the teacher's parameters (model `teacher_cfg`) and the loss adds `rl.distill.coef` times
  the generalised JSD to it over the batch's trained tokens (aggregated like the policy loss); the teacher's
  logits come from its hidden states in the batch (`TrainBatch.teacher_hidden`) and its output head.

  The whole optimisation of one step runs inside: `rl.epochs` passes, each over a permutation of the B rows
  drawn on device from `key`, cut into `rl.minibatches` optimizer steps of `rl.grad_accum` micro-batches
  ([A, m, T]) each, as `lax.scan`s; then the KL controller takes its step on the rollout's KL. Metrics are
  means over the optimizer steps (maxima for `*_max`), `train/skipped` counts skipped steps and
  `train/skipped_flags` [epochs * minibatches] says which, in order.
  """
  policy_opt, value_opt = optimizers
  kl_in_loss = rl.kl.placement == "loss"
  loss_options = policy_losses.options(rl)  # the loss's own config fields (ppo: dual_clip)
  is_ppo = rl.algorithm == "ppo"
  E, M, A = rl.epochs, rl.minibatches, rl.grad_accum
  jsd = rl.distill.coef > 0 and rl.distill.loss == "jsd"

  def micro_loss(params, mb: TrainBatch, kl_coef, frozen, teacher):
    policy, value = params
    policy = policy_params(policy, frozen, lora_cfg)
    against = scoring.Teacher(teacher_cfg, teacher, rl.distill.beta, mb.teacher_hidden) if jsd else None
    scores = scoring.score_tokens(cfg, policy, mb.tokens, mb.attn_mask, temperature, against)  # [m, T] each
    logp, ent = scores.logp, scores.entropy
    mask = mb.mask
    loss, metrics = policy_losses.compute(
      rl.policy_loss, logp, mb.old_logp, mb.advantages, mask, clip_low=rl.clip_low, clip_high=rl.clip_high,
      mode=rl.loss_mode, is_weights=mb.is_weights, norm_constant=norm_constant, **loss_options)
    metrics = dict(metrics)
    metrics["policy/pg_loss"] = loss
    kl_tok = kl_lib.estimate(logp, mb.ref_logp, rl.kl.estimator, mask=mask)
    kl_term = losses.aggregate(kl_tok, mask, rl.loss_mode, norm_constant)
    metrics["policy/kl_loss"] = kl_term
    if kl_in_loss:
      loss = loss + kl_coef * kl_term
    ent_term = losses.aggregate(ent, mask, rl.loss_mode, norm_constant)
    metrics["policy/entropy_update"] = ent_term
    if rl.entropy_coef:
      loss = loss - rl.entropy_coef * ent_term
    if is_ppo:
      v = token_values(cfg, value, mb.tokens, mb.attn_mask)
      vloss, vmetrics = losses.value_loss(v, mb.old_values, mb.returns, mask, clip=rl.value.clip or None,
                                          mode=rl.loss_mode, norm_constant=norm_constant)
      loss = loss + rl.value.coef * vloss
      metrics.update(vmetrics)
      metrics["value/loss"] = vloss
    if jsd:
      div = losses.aggregate(scores.divergence, mask, rl.loss_mode, norm_constant)
      metrics["distill/jsd"] = div
      loss = loss + rl.distill.coef * div
    metrics["train/loss"] = loss
    return loss, metrics

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def optimizer_step(state: RLState, minibatch: TrainBatch, frozen: Any, teacher: Any
                     ) -> tuple[RLState, dict[str, jax.Array]]:
    """One optimizer step on a minibatch of A micro-batches [A, m, T], gradients accumulated by weight."""
    params = (state.policy.params, state.value.params if state.value is not None else None)
    weights = micro_weights(minibatch.mask, rl.loss_mode)  # [A]

    def micro(acc, xs):
      mb, w = xs
      (_, metrics), grads = grad_fn(params, mb, state.kl.coef, frozen, teacher)
      acc_grads, acc_metrics = acc
      acc_grads = jax.tree.map(lambda a, g: a + w * g, acc_grads, grads)
      acc_metrics = {k: jnp.maximum(a, metrics[k]) if is_max_metric(k) else a + w * metrics[k]
                     for k, a in acc_metrics.items()}
      return (acc_grads, acc_metrics), None

    first = jax.tree.map(lambda x: x[0], minibatch)
    shapes = jax.eval_shape(lambda: grad_fn(params, first, state.kl.coef, frozen, teacher)[0][1])
    zeros = (jax.tree.map(jnp.zeros_like, params), {k: jnp.zeros(s.shape, jnp.float32) for k, s in shapes.items()})
    (grads, metrics), _ = jax.lax.scan(micro, zeros, (minibatch, weights))

    # One step for policy and value together: taken only when every gradient and both updated states are
    # finite, else both states are kept as they were (a skipped step). A minibatch with no trained token (every row
    # masked: a teacher that failed, verifier faults) takes no step either, uncounted: its gradient is 0, and the
    # optimizer's momentum and weight decay alone would still move the weights.
    policy_grads, value_grads = grads
    ok = jnp.isfinite(state_lib.global_norm(grads))
    live = jnp.any(minibatch.mask)
    metrics["train/grad_norm"] = state_lib.global_norm(policy_grads)
    new_policy, metrics["train/update_norm"] = state_lib.propose(state.policy, policy_grads, policy_opt)
    ok = ok & state_lib.all_finite((new_policy.params, new_policy.opt_state))
    new_value = state.value
    if state.value is not None:
      metrics["value/grad_norm"] = state_lib.global_norm(value_grads)
      new_value, metrics["value/update_norm"] = state_lib.propose(state.value, value_grads, value_opt)
      ok = ok & state_lib.all_finite((new_value.params, new_value.opt_state))
      new_value = state_lib.accept(ok & live, new_value, state.value)
    metrics["train/skipped"] = (~ok).astype(jnp.float32)
    return RLState(state_lib.accept(ok & live, new_policy, state.policy), new_value, state.kl), metrics

  def epoch(state: RLState, key: jax.Array, batch: TrainBatch, frozen: Any, teacher: Any
            ) -> tuple[RLState, dict[str, jax.Array]]:
    B = batch.tokens.shape[0]
    m = B // (M * A)
    order = jax.random.permutation(key, B)

    def cut(x: jax.Array) -> jax.Array:  # [B, ...] -> [M, A, m, ...], the micro-batch rows over "batch"
      x = jnp.take(x, order, axis=0).reshape((M, A, m) + x.shape[1:])
      return mesh_lib.constrain(x, (None, None, "batch") + (None,) * (x.ndim - 3))

    return jax.lax.scan(lambda s, mb: optimizer_step(s, mb, frozen, teacher), state, jax.tree.map(cut, batch))

  def update(state: RLState, batch: TrainBatch, key: jax.Array, frozen: Any = None, teacher: Any = None
             ) -> tuple[RLState, dict[str, jax.Array]]:
    state, per_step = jax.lax.scan(lambda s, k: epoch(s, k, batch, frozen, teacher), state,
                                   jax.random.split(key, E))  # [E, M]
    metrics = {k: (jnp.max if is_max_metric(k) else jnp.mean)(v) for k, v in per_step.items()}
    metrics["train/skipped"] = jnp.sum(per_step["train/skipped"])
    metrics["train/skipped_flags"] = per_step["train/skipped"].reshape(-1)
    # The controller measures the rollout's KL (k1, over the trained tokens); its n_steps and horizon count
    # episodes (Ziegler et al. 2019), B of them per step.
    kl_now = masked.masked_mean(kl_lib.estimate(batch.old_logp, batch.ref_logp, "k1", batch.mask), batch.mask)
    kl = kl_lib.update_kl_state(state.kl, kl_now, batch.tokens.shape[0], adaptive=rl.kl.adaptive,
                                target=rl.kl.target, horizon=rl.kl.horizon)
    metrics["policy/kl_coef"] = kl.coef
    return state._replace(kl=kl), metrics

  return jax.jit(mesh_lib.bind(update, mesh, rules), out_shardings=(shardings, None), donate_argnums=(0,))
