"""Each stage's programs (rl_lm/aot/programs.py), as its trainer builds and calls them, and what it holds.

  rl            generate (rl_lm/aot/samplers.py), the teacher's forward (rl.distill), prepare, update (with the
                value model for PPO, LoRA adapters on a frozen base, the teacher's head for the JSD), the
                evaluation's samplers, the learned reward's scores, an LLM judge's forwards
  sft           the update                      reward_model  the update, the scores
  dpo           the reference log-probs, the update            sample   generate

A stage's `resident` buffers are what its trainer keeps on the chips while each program runs: the train state,
the reference, the context's policy, rollouts in flight, a reward model, a teacher, a judge (`RLTrainer._build_state`,
`stage_run.StageRun.start`). The update's cost is E x M x A micro-batch steps (one micro-batch, E = M = A = 1,
compiled at its real size) less the (A - 1) optimizer steps per minibatch that those count once too many;
prepare's (and a teacher's) is C / g calls on g of its C row chunks (`prepare_piece`), as the run's loop makes them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.aot import flops, samplers
from rl_lm.aot.programs import (
  Abstract,
  Call,
  Program,
  Stage,
  Term,
  batch_sds,
  key_sds,
  per_chip_bytes,
  replicated_sds,
  sds,
  shardings,
  train_state,
)
from rl_lm.models import build, heads, transformer
from rl_lm.models import lora as lora_lib
from rl_lm.models.presets import ModelConfig
from rl_lm.rewards import judge as judge_lib
from rl_lm.rl import kl as kl_lib
from rl_lm.train import dpo, reward_model, rl_update, sft
from rl_lm.train import state as state_lib
from rl_lm.train import teacher as teacher_lib


def _variant(section: ml_collections.ConfigDict, **changes: Any) -> ml_collections.ConfigDict:
  out = copy.deepcopy(section)
  for k, v in changes.items():
    out[k] = v
  return out


@dataclasses.dataclass
class _RL:
  """The RL trainer's state (`RLTrainer._build_state`) for one model config, abstract."""

  policy: Any  # the starting parameters (the base with LoRA)
  trainable: Any
  reference: Any
  state: rl_update.RLState
  shardings: rl_update.RLState
  optimizers: tuple
  lora: Any


def rl_state(a: Abstract, model: ModelConfig) -> _RL:
  rl = a.config.rl
  lcfg = lora_lib.from_section(a.config.model)
  policy_opt = state_lib.make_optimizer(rl.learning_rate, weight_decay=rl.weight_decay,
                                        warmup_steps=rl.warmup_steps, grad_clip=rl.grad_clip)
  value_opt = None
  if rl.algorithm == "ppo":
    value_opt = state_lib.make_optimizer(rl.value.learning_rate, grad_clip=rl.grad_clip)
  policy = build.abstract_params(model, a.mesh, a.rules)
  trainable = policy
  if lcfg:
    trainable = mesh_lib.abstract_init(lambda r: lora_lib.init(model, lcfg, r), lora_lib.param_axes(model, lcfg),
                                       a.mesh, a.rules)
  policy_state = train_state(policy_opt, trainable, a.mesh)
  value_state = None
  if value_opt is not None:
    value = mesh_lib.abstract_init(lambda r: heads.init(model, r), heads.param_axes(model), a.mesh, a.rules)
    value_state = train_state(value_opt, value, a.mesh)
  rep = mesh_lib.replicated(a.mesh)
  kl = jax.tree.map(lambda x: sds(x.shape, x.dtype, rep), jax.eval_shape(lambda: kl_lib.init_kl_state(rl.kl.coef)))
  state = rl_update.RLState(policy_state, value_state, kl)
  return _RL(policy, trainable, policy, state, jax.tree.map(lambda x: x.sharding, state), (policy_opt, value_opt),
             lcfg)


PIECE_ROWS = 8  # rows a chip at least in a cost piece: XLA:TPU gives prepare no time at 2 or 4 (v5p-64), at 8 one


def prepare_piece(a: Abstract, rows: int, chunks: int, group: int) -> int:
  """g, the row chunks of prepare (`rl.prepare_chunks`) one cost piece holds: the fewest that give every chip
  `PIECE_ROWS` rows at least and whole groups (the advantages are the run's only over whole groups), else all.

  The run loops over the chunks (`rl_update.row_chunks`), and each chunk gathers FSDP-sharded weights again; a piece
  with all C chunks unrolled let XLA share that work between them (Qwen2.5-0.5B on v5p-8: 1.98 GB of all-gathers
  counted, 15.8 GB chunk by chunk), and was C times the size to compile. A piece of one chunk's rows is the run's
  body, but below 8 rows a chip XLA:TPU gives it no time."""
  per_chip = batch_sds(a, (rows,), bool).sharding.shard_shape((rows,))[0]
  for g in range(1, chunks):
    if chunks % g == 0 and (rows // chunks * g) % group == 0 and per_chip * g >= PIECE_ROWS * chunks:
      return g
  return chunks


def _count(n: float) -> str:
  return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def _score_fn(model: ModelConfig, chunks: int = 1) -> Any:
  """`reward_model.score_fn`, jitted afresh (`make_score_fn`): that one caches its jit per model, and a cost piece
  must be traced anew (its loops unrolled), never taken from a trace made for the run's program."""
  return reward_model.make_score_fn(model, chunks)


def _train_batch(a: Abstract, rows: int, length: int, ppo: bool, teacher: ModelConfig | None = None
                 ) -> rl_update.TrainBatch:
  """The update's batch; with `teacher` (the "jsd" loss) its hidden states [rows, length - 1, D'] too."""
  f = lambda dtype: batch_sds(a, (rows, length), dtype)
  hidden = batch_sds(a, (rows, length - 1, teacher.d_model), teacher.compute_dtype) if teacher else None
  return rl_update.TrainBatch(f(jnp.int32), f(bool), f(bool), *(f(jnp.float32) for _ in range(4)),
                              f(jnp.float32) if ppo else None, f(jnp.float32) if ppo else None, hidden)


def _rollout(a: Abstract, rows: int, length: int) -> sampling.Rollout:
  f = lambda shape, dtype: batch_sds(a, shape, dtype)
  return sampling.Rollout(f((rows, length), jnp.int32), f((rows, length), bool), f((rows, length), bool),
                          f((rows, length), jnp.float32), f((rows,), jnp.int32), f((rows,), bool))


def rl_stage(a: Abstract, cost: bool = True) -> Stage:
  config, rl = a.config, a.config.rl
  ppo = rl.algorithm == "ppo"
  B, P, N = rl.prompts_per_step * rl.group_size, rl.max_prompt_len, config.sampling.max_new_tokens
  T = P + N
  temperature, norm_constant = config.sampling.temperature, rl.norm_constant or N
  E, M, A = rl.epochs, rl.minibatches, rl.grad_accum
  m = B // (M * A)
  s = rl_state(a, a.model)
  lcfg = s.lora
  # A teacher (rl.distill): its forward a program of its own; with the "jsd" loss its hidden states and its output
  # head in the update. With on_policy < 1 it also samples, with the policy's sampler and shapes (`generate`).
  teacher = teacher_lib.model_config(config) if rl.distill.coef else None
  if teacher is not None:
    teacher_lib.check_vocabulary(config, a.model, teacher)
  jsd = teacher if teacher is not None and rl.distill.loss == "jsd" else None

  def update_fn(st: _RL, model: ModelConfig, rl_cfg: Any) -> Any:
    return rl_update.make_update_fn(model, rl_cfg, temperature, norm_constant, st.optimizers, st.shardings, a.mesh,
                                    a.rules, lcfg, jsd)

  def teacher_call(model: ModelConfig, rows: int = B, rl_cfg: Any = rl) -> Call:  # `model`: the teacher's config
    fn = rl_update.make_teacher_fn(model, rl_cfg, temperature, a.mesh, a.rules)
    return Call(fn, (build.abstract_params(model, a.mesh, a.rules), batch_sds(a, (rows, T), jnp.int32),
                     batch_sds(a, (rows, T), bool)))

  def prepare_call(model: ModelConfig, rows: int = B, rl_cfg: Any = rl) -> Call:
    st = rl_state(a, model)
    fn = rl_update.make_prepare_fn(model, rl_cfg, temperature, a.mesh, a.rules, lcfg)
    value = st.state.value.params if ppo else None
    scored = rl_update.Scored(*(batch_sds(a, (rows,), dtype) for dtype in (jnp.float32, bool, bool, bool)))
    args = (st.state.policy.params, st.reference, value, _rollout(a, rows, T), scored, st.state.kl.coef)
    if teacher is not None:  # the teacher program's output
      args += (rl_update.TeacherScores(batch_sds(a, (rows, T), jnp.float32),
                                       _train_batch(a, rows, T, False, jsd).teacher_hidden),)
    return Call(fn, args)

  C = rl.prepare_chunks
  g = prepare_piece(a, B, C, rl.group_size)
  piece = dict(rows=B // C * g, rl_cfg=_variant(rl, prepare_chunks=g))

  def chunk_term(key: str, call: Callable[..., Call], **kw: Any) -> Term:
    """Prepare's (or the teacher's) cost: C / g calls of a piece of g chunks (`prepare_piece`)."""
    return Term(C // g, key, functools.partial(call, **piece), **kw)

  def update_call(model: ModelConfig, rows: int = B, rl_cfg: Any = rl) -> Call:
    st = rl_state(a, model)
    head = build.abstract_params(jsd, a.mesh, a.rules) if jsd else None  # the update uses its output head
    return Call(update_fn(st, model, rl_cfg), (st.state, _train_batch(a, rows, T, ppo, jsd), key_sds(a),
                                               st.reference if lcfg else None, head))

  def apply_call(model: ModelConfig) -> Call:
    """One optimizer step of the update (policy, and value with PPO), on gradients shaped like the parameters."""
    st = rl_state(a, model)
    opts = st.optimizers

    def apply(state: rl_update.RLState, grads: Any) -> rl_update.RLState:
      policy = state_lib.apply_gradients(state.policy, grads[0], opts[0])[0]
      value = state_lib.apply_gradients(state.value, grads[1], opts[1])[0] if ppo else None
      return rl_update.RLState(policy, value, state.kl)

    grads = (st.state.policy.params, st.state.value.params if ppo else None)
    return Call(jax.jit(mesh_lib.bind(apply, a.mesh, a.rules), donate_argnums=0), (st.state, grads))

  def sampler_params(model: ModelConfig) -> Any:
    """`RLTrainer.policy()`: the trainable parameters, or with LoRA the base carrying the adapters (`lora.combine`,
    whose B scaled by alpha / r keeps its shape, dtype and sharding)."""
    st = rl_state(a, model)
    if not lcfg:
      return st.trainable
    layers = dict(st.reference["layers"])
    for name, ab in st.trainable["layers"].items():
      layers[name] = transformer.LoraWeight(layers[name], ab["a"], ab["b"])
    return {**st.reference, "layers": layers}

  sampler_model = a.model.replace(dtype=rl.sampler_dtype) if rl.sampler_dtype else a.model
  scfg = samplers.sampling_config(a)
  rollout_uses = frozenset({"rollout"})
  gather = rl.sampler_gather and a.mesh.shape.get("fsdp", 1) > 1  # the sampler's own copy, whole over fsdp
  copied = sampler_model.compute_dtype != jnp.float32 or gather
  own = frozenset() if copied else frozenset({"policy.params", "base"})
  spec = samplers.SamplerSpec("generate", sampler_model, scfg, B, P, sampler_params, gather=rl.sampler_gather)
  out = samplers.sampler_programs(a, "rl", spec, own | rollout_uses, cost, per_step=True)

  pre_hw = 2 * flops.total(flops.scored(a.model, B, T)) + (flops.total(flops.scored(a.model, B, T, False)) if ppo
                                                           else 0.0)
  if lcfg:
    pre_hw += 2.0 * B * T * flops.lora_params(a.model, lcfg)
  out.append(Program("rl", "prepare", prepare_call(a.model), [chunk_term("rl/prepare", prepare_call)] if cost else [],
                     pre_hw, pre_hw, frozenset({"policy.params", "reference", "base", "value.params", "rollout"}),
                     B * T, per_step=True))

  if teacher is not None:
    fwd = flops.total(flops.scored(teacher, B, T))
    out.append(Program("rl", "teacher", teacher_call(teacher), [chunk_term("rl/teacher", teacher_call, model=teacher)]
                       if cost else [], fwd, fwd, frozenset({"teacher", "rollout"}), B * T, per_step=True,
                       note=f"the teacher's forward ({_count(teacher.num_params())} parameters)"))

  judged = sorted({"judge", "judge_pairwise"} & set(config.reward.weights))
  judge = teacher_lib.model_config(config, "judge") if judged else None
  if judge is not None:  # the judge's forwards of a step's rows at their widest (judge.max_len); pairwise: both orders
    j = config.judge
    calls = sum(-(-B * (2 if name == "judge_pairwise" else 1) // j.rows) for name in judged)
    answers = len(j.scale) if "judge" in judged else len(j.choices)

    def judge_call(model: ModelConfig) -> Call:  # `model`: the judge's config (at 1, 2 or all its layers)
      return Call(judge_lib.make_answers_fn(model, a.mesh, a.rules), (
        build.abstract_params(model, a.mesh, a.rules), batch_sds(a, (j.rows, j.max_len), jnp.int32),
        batch_sds(a, (j.rows,), jnp.int32), replicated_sds(a, (answers,), jnp.int32)))

    fwd = calls * flops.total(flops.forward(judge, j.rows, j.max_len, j.max_len, 1))
    out.append(Program("rl", "judge", judge_call(judge), [Term(calls, "rl/judge", judge_call, model=judge)]
                       if cost else [], fwd, fwd, frozenset({"judge"}), calls * j.rows * j.max_len, per_step=True,
                       note=f"{calls} forward(s) of {j.rows} x {j.max_len} tokens a step (judge.max_len: the widest "
                            f"it pads to)"))

  hw, model_flops = flops.training(a.model, B, T, lora=lcfg)
  if jsd:  # the teacher's logits beside the student's, chunk by chunk: forward only (again in a chunked backward)
    t_head = flops.scored(jsd, B, T)["head"]
    hw, model_flops = hw + t_head * (1 + (0 < a.model.logit_chunk < T - 1)), model_flops + t_head
  if ppo:
    v_hw, v_model = flops.training(a.model, B, T, head=False)
    hw, model_flops = hw + v_hw, model_flops + v_model
  micro_rl = _variant(rl, epochs=1, minibatches=1, grad_accum=1)
  terms = [Term(E * M * A, "rl/update:micro", functools.partial(update_call, rows=m, rl_cfg=micro_rl)),
           Term(-E * M * (A - 1), "rl/update:apply", apply_call, per_parameter=True)] if cost else []
  out.append(Program(
    "rl", "update", update_call(a.model), [t for t in terms if t.count], E * hw, E * model_flops,
    frozenset({"policy.params", "policy.opt", "value.params", "value.opt", "kl", "base", "teacher"}), E * B * T,
    note=f"{E} epoch(s) x {M} minibatch(es) x {A} micro-batch(es) of {m} rows", per_step=True))

  eval_cfg = dataclasses.replace(scfg, temperature=config.eval.temperature, greedy=False)
  spec = samplers.SamplerSpec("eval", sampler_model, eval_cfg, config.eval.rows, P, sampler_params,
                              gather=rl.sampler_gather)
  out += samplers.sampler_programs(a, "rl", spec, own | rollout_uses, cost=False,
                                   note="memory only: it runs between steps; rl/generate:decode is its step")
  if config.eval.greedy:  # the same shapes and cache as the sampled evaluation; the draw an argmax
    out.append(Program("rl", "eval_greedy", None, [], 0.0, note="memory and cost as rl/eval (the same shapes; the "
                       "draw is an argmax): not compiled again"))

  resident = {"policy.params": per_chip_bytes(s.state.policy.params),
              "policy.opt": per_chip_bytes((s.state.policy.step, s.state.policy.opt_state)),
              "kl": per_chip_bytes(s.state.kl)}
  if lcfg:  # the base is the reference and the context's policy at once
    resident["base"] = per_chip_bytes(s.policy)
  else:  # the context's policy is the reference while RL runs (`RLTrainer._build_state`)
    resident["reference"] = per_chip_bytes(s.reference)
  if ppo:
    resident["value.params"] = per_chip_bytes(s.state.value.params)
    resident["value.opt"] = per_chip_bytes((s.state.value.step, s.state.value.opt_state))
  resident["rollout"] = per_chip_bytes(_rollout(a, B, T)) * (1 + rl.max_staleness)
  if teacher is not None:
    resident["teacher"] = per_chip_bytes(build.abstract_params(teacher, a.mesh, a.rules))
  if judge is not None:
    resident["judge"] = per_chip_bytes(build.abstract_params(judge, a.mesh, a.rules))
  if config.reward.learned:
    rm = mesh_lib.abstract_init(lambda r: heads.init(a.model, r), heads.param_axes(a.model), a.mesh, a.rules)
    resident["reward_model"] = per_chip_bytes(rm)

    def rollout_score_call(model: ModelConfig, rows: int = B, rl_cfg: Any = rl) -> Call:
      """`RolloutSource.score` with a learned reward: the rows in prepare's chunks, as prepare scores them."""
      p = mesh_lib.abstract_init(lambda r: heads.init(model, r), heads.param_axes(model), a.mesh, a.rules)
      return Call(_score_fn(model, rl_cfg.prepare_chunks), (p, batch_sds(a, (rows, T), jnp.int32),
                                                            batch_sds(a, (rows, T), bool)))

    fwd = flops.total(flops.scored(a.model, B, T, head=False))
    out.append(Program("rl", "reward_score", rollout_score_call(a.model),
                       [chunk_term("rl/reward_score", rollout_score_call)] if cost else [], fwd, fwd,
                       frozenset({"reward_model", "rollout"}), B * T, per_step=True))
  return Stage("rl", resident, out)


# ------------------------------------------------------------------------------------------------
# The supervised stages: sft, reward_model, dpo; and "sample"


def _supervised(a: Abstract, stage: str, loss: Callable[[ModelConfig], Any], section: Any, batch: Callable[[], dict],
                init: Callable[[ModelConfig], Any], hw_model: tuple[float, float], tokens: float, cost: bool
                ) -> tuple[Program, Any]:
  """One `state_lib.make_update_fn` step of a supervised stage, and its abstract state."""
  opt = state_lib.make_optimizer(section.learning_rate, weight_decay=section.weight_decay,
                                 warmup_steps=section.warmup_steps, total_steps=section.steps)

  def call(model: ModelConfig) -> Call:
    st = train_state(opt, init(model), a.mesh)
    fn = state_lib.make_update_fn(loss(model), opt, shardings(st), a.mesh, a.rules)
    return Call(fn, (st, batch(), key_sds(a)))

  st = train_state(opt, init(a.model), a.mesh)
  program = Program(stage, "update", call(a.model), [Term(1, f"{stage}/update", call)] if cost else [],
                    hw_model[0], hw_model[1], frozenset({"state.params", "state.opt"}), tokens, per_step=True)
  return program, st


def _state_resident(st: state_lib.TrainState) -> dict[str, float]:
  return {"state.params": per_chip_bytes(st.params), "state.opt": per_chip_bytes((st.step, st.opt_state))}


def sft_stage(a: Abstract, cost: bool = True) -> Stage:
  c = a.config.sft
  B, L = c.batch_size, c.max_len
  batch = lambda: {"tokens": batch_sds(a, (B, L), jnp.int32), "mask": batch_sds(a, (B, L), bool),
                   "loss_mask": batch_sds(a, (B, L), bool)}
  params = lambda model: build.abstract_params(model, a.mesh, a.rules)
  program, st = _supervised(a, "sft", sft.sft_loss, c, batch, params, flops.training(a.model, B, L), B * L, cost)
  return Stage("sft", {**_state_resident(st), "start": per_chip_bytes(params(a.model))}, [program])


def _pairs(a: Abstract, B: int, L: int, reference: bool) -> dict[str, Any]:
  out = {f"{side}_{k}": batch_sds(a, (B, L), jnp.int32 if k == "tokens" else bool)
         for side in ("chosen", "rejected") for k in ("tokens", "mask", "loss_mask")}
  if reference:
    out.update({k: batch_sds(a, (B,), jnp.float32) for k in ("ref_chosen_logp", "ref_rejected_logp")})
  return out


def reward_model_stage(a: Abstract, cost: bool = True) -> Stage:
  c, L = a.config.reward_model, a.config.preferences.max_len
  B = c.batch_size
  init = lambda model: mesh_lib.abstract_init(lambda r: heads.init(model, r), heads.param_axes(model), a.mesh, a.rules)
  program, st = _supervised(a, "reward_model", reward_model.pair_loss, c, lambda: _pairs(a, B, L, False), init,
                            flops.training(a.model, 2 * B, L, head=False), 2 * B * L, cost)

  def score_call(model: ModelConfig) -> Call:
    return Call(_score_fn(model), (init(model), batch_sds(a, (B, L), jnp.int32), batch_sds(a, (B, L), bool)))

  fwd = flops.total(flops.scored(a.model, B, L, head=False))
  score = Program("reward_model", "score", score_call(a.model), [Term(1, "reward_model/score", score_call)]
                  if cost else [], fwd, fwd, frozenset({"state.params"}), B * L)
  start = per_chip_bytes(build.abstract_params(a.model, a.mesh, a.rules))
  return Stage("reward_model", {**_state_resident(st), "start": start}, [program, score])


def dpo_stage(a: Abstract, cost: bool = True) -> Stage:
  c, L = a.config.dpo, a.config.preferences.max_len
  B = c.batch_size
  params = lambda model: build.abstract_params(model, a.mesh, a.rules)
  program, st = _supervised(a, "dpo", lambda model: dpo.dpo_loss_fn(model, c), c,
                            lambda: _pairs(a, B, L, True), params, flops.training(a.model, 2 * B, L), 2 * B * L, cost)

  def reference_call(model: ModelConfig) -> Call:
    return Call(dpo.reference_logprobs_fn(model), (params(model), _pairs(a, B, L, False)))

  fwd = flops.total(flops.scored(a.model, 2 * B, L))
  reference = Program("dpo", "reference_logprobs", reference_call(a.model),
                      [Term(1, "dpo/reference_logprobs", reference_call)] if cost else [], fwd, fwd,
                      frozenset({"reference"}), 2 * B * L)
  p = per_chip_bytes(params(a.model))
  return Stage("dpo", {**_state_resident(st), "start": p, "reference": p}, [reference, program])


def sample_stage(a: Abstract, cost: bool = True) -> Stage:
  c, tok = a.config.sample, a.tokenizer
  texts = [c.prompts[i % len(c.prompts)] for i in range(c.batch_size)]
  P = max(len(tok.encode_prompt(t)) for t in texts)
  P = -(-P // 8) * 8  # sampling.pad_prompts(..., multiple=8)
  params = lambda model: build.abstract_params(model, a.mesh, a.rules)
  spec = samplers.SamplerSpec("generate", a.model, samplers.sampling_config(a), c.batch_size, P, params,
                              through_sampler=False)
  programs = samplers.sampler_programs(a, "sample", spec, frozenset({"start"}), cost, per_step=True)
  return Stage("sample", {"start": per_chip_bytes(params(a.model))}, programs)


STAGES: dict[str, Callable[..., Stage]] = {"sample": sample_stage, "sft": sft_stage, "reward_model": reward_model_stage,
                                           "dpo": dpo_stage, "rl": rl_stage}


def configured(a: Abstract, cost: bool = True) -> list[Stage]:
  """The configured stages (each once, in order), abstract."""
  return [STAGES[name](a, cost) for name in dict.fromkeys(a.config.stages)]
