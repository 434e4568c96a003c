"""The sections of the "rl" stage: rl (with its kl, value, curriculum and alarms) and eval.

The choices of algorithm, policy loss, loss mode and correction level come from the modules that implement them
(their registries and constants in rl_lm/rl/), so a loss or estimator registered there is a valid value here."""

from __future__ import annotations

import dataclasses
import math

from rl_lm.config.run import DTYPES
from rl_lm.config.section import Section, folder, knob, registered
from rl_lm.models import presets
from rl_lm.rl import advantages, correction, losses, policy_losses


@dataclasses.dataclass(frozen=True)
class Kl(Section):
  """The KL penalty towards the reference policy."""

  KEY = "rl.kl"
  placement: str = knob("loss", ("loss", "reward", "none"))  # loss (GRPO) | reward (InstructGPT, PPO) | none
  estimator: str = knob("k3", ("k1", "k2", "k3"))
  coef: float = knob(0.01, "[0, inf)")
  adaptive: bool = False  # Ziegler et al. (2019) proportional controller towards target
  target: float = knob(0.05, "(0, inf)")  # per-token KL (mean k1 over completion tokens) the adaptive coef aims at
  horizon: int = knob(10000, "(0, inf)")  # in episodes: the adaptive coefficient moves by at most 20% per horizon


@dataclasses.dataclass(frozen=True)
class Value(Section):
  """The value head: ppo only."""

  KEY = "rl.value"
  learning_rate: float = 1e-3  # > 0 (checked for ppo)
  coef: float = knob(0.5, "[0, inf)")
  clip: float = knob(0.2, "[0, inf)")  # value clip around the old values; 0: off
  gamma: float = knob(1.0, "[0, 1]")
  lam: float = knob(0.95, "[0, 1]")
  whiten_advantages: bool = True


@dataclasses.dataclass(frozen=True)
class Correction(Section):
  """Rollout correction for the sampler/trainer gap and for stale rollouts (rl_lm.rl.correction): importance
  weights pi_old / pi_rollout on each token's loss, and rejection of tokens or rows far off-policy."""

  KEY = "rl.correction"
  level: str = knob("token", correction.LEVELS)  # the IS ratio: per token, the row's product, its geometric mean
  cap: float = knob(2.0, "[0, inf)")  # IS weight cap C (>= 1): truncated IS min(r, C); 0: no IS weights
  lower: float = knob(0.0, "[0, 1]")  # > 0: two-sided (IcePop) masking, weight 0 outside [lower, cap], not truncated
  reject: str = knob("none", ("none",) + correction.LEVELS)  # drop tokens / rows whose ratio leaves the band
  reject_low: float = knob(0.5, "[0, 1]")  # rejection band [reject_low, reject_high] on pi_old / pi_rollout
  reject_high: float = knob(2.0, "[1, inf)")

  def check(self) -> None:
    self.require(self.cap == 0 or self.cap >= 1, "cap", f"must be 0 or >= 1, got {self.cap}")
    self.require(self.lower == 0 or self.cap > 0, "lower", "two-sided masking needs IS weights (cap > 0)")


@dataclasses.dataclass(frozen=True)
class CurriculumConfig(Section):
  """Which training prompts RL draws (rl_lm.rl.curriculum)."""

  KEY = "rl.curriculum"
  enabled: bool = True  # False: uniform draws over the open pool, nothing retired or promoted
  decay: float = knob(0.9, "(0, 1]")  # per-update decay of a prompt's Beta counts
  floor: float = knob(0.02, "[0, inf)")  # added to every weight, so unseen or extreme prompts still appear
  retire_above: float = knob(0.95, "[0, 1]")  # pass-rate estimate above which a prompt is retired
  min_attempts: int = knob(16, "[0, inf)")  # samples of a prompt before it can be retired
  initial_levels: int = knob(3, "[1, inf)")  # levels open at the start (the easiest ones)
  promote_above: float = knob(0.6, "[0, 1]")  # mean estimate over the highest open level that opens the next one
  promote_min_seen: float = knob(0.5, "[0, 1]")  # fraction of the highest open level's prompts seen before promoting


@dataclasses.dataclass(frozen=True)
class AlarmConfig(Section):
  """Thresholds of the run-health alarms and notes in the log (rl_lm.health). Defaults calibrated on the labelled
  run set of experiments/alarms (no alarm on its 9 healthy runs, every induced failure flagged)."""

  KEY = "rl.alarms"
  patience: int = knob(3, "(0, inf)")  # consecutive logged steps a condition must hold before it is reported
  entropy_min: float = knob(0.03, "[0, inf)")  # policy/entropy (nats per token) below: entropy collapsed; 0: off
  kl_max: float = knob(0.5, "(0, inf]")  # policy/kl_ref_k1 (nats per token) above: drifted from the reference
  grad_norm_max: float = knob(50.0, "(0, inf]")  # train/grad_norm (before clipping) above, one step: blew up
  logprob_gap_max: float = knob(1e-3, "(0, inf]")  # offpolicy/logprob_gap_mean_abs above: sampler and trainer
  #                                                  disagree (an alarm without IS weights, a note with them)
  sampler_trainer_kl_max: float = knob(math.inf, "(0, inf]")  # offpolicy/sampler_trainer_kl above; inf: off
  reward_std_min: float = knob(1e-6, "[0, inf)")  # rollout/reward_std at or below, batch not all solved: every
  #                                                 reward the same (a broken verifier); 0: off
  zero_variance_max: float = knob(0.8, "[0, 1]")  # groups/zero_variance_frac above: a note (solved or too hard)
  invalid_frac_max: float = knob(0.1, "[0, 1]")  # rollout/invalid_frac (or distill/teacher_invalid_frac) above
  truncation_max: float = knob(0.2, "[0, 1]")  # rollout/truncation_rate above: completions hit max_new_tokens
  is_weight_max: float = knob(math.inf, "(0, inf]")  # offpolicy/is_weight_max above; inf: off
  env_failure_max: float = knob(0.1, "[0, 1]")  # episodes/failure_env above: environments keep failing (config.env)
  check_finite: bool = True  # any NaN or inf metric raises an alarm (at once, no patience)


@dataclasses.dataclass(frozen=True)
class Distill(Section):
  """Distillation towards `config.teacher` (rl_lm/rl/distill.py), beside the verifier's advantage or instead of it:
  "reward", a per-token reward log pi_teacher - log pi_student on the student's own samples (a policy gradient);
  "jsd", the GKD family: the generalised JSD between the two next-token distributions over the whole vocabulary,
  a loss term differentiated directly, on the student's samples or (1 - on_policy of the steps) the teacher's."""

  KEY = "rl.distill"
  coef: float = knob(0.0, "[0, inf)")  # weight of the distillation reward or loss; 0: off (no teacher is loaded)
  verifier: float = knob(1.0, "[0, inf)")  # weight of the verifier's advantage (0: pure distillation)
  loss: str = knob("reward", ("reward", "jsd"))
  beta: float = knob(0.5, "[0, 1]")  # "jsd": 0 forward KL(teacher || student), 1 reverse KL, 0.5 the symmetric JSD
  on_policy: float = knob(1.0, "[0, 1]")  # lambda: the fraction of steps on the student's samples ("jsd")

  def check(self) -> None:
    self.require(self.on_policy == 1.0 or self.loss == "jsd", "on_policy", "steps on the teacher's samples "
                 "need loss = 'jsd': the per-token reward is a policy gradient, true on the student's samples only")


@dataclasses.dataclass(frozen=True)
class Teacher(Section):
  """A frozen model beside the reference on the mesh, scored by the same forward (rl_lm/train/teacher.py): an
  rl_lm checkpoint of a preset, or a Hugging Face folder. It must share the policy's vocabulary. The "rl" stage
  distils towards it on-policy (`rl.distill`); the "teacher_sft" stage trains on its samples (off-policy)."""

  KEY, STAGES = "teacher", ("rl", "teacher_sft")
  init_from: str = knob("", folder)  # an rl_lm checkpoint folder holding "params" (<run>/checkpoints/rl)
  preset: str = ""  # the checkpoint's preset; "": model.preset
  hf_checkpoint: str = knob("", folder)  # or a Hugging Face folder (its config.json, weights and tokenizer)
  param_dtype: str = knob("bfloat16", DTYPES)  # storage: a frozen model keeps no optimizer state and may be bf16
  dtype: str = knob("float32", DTYPES)  # compute dtype of its forward
  samples_per_problem: int = knob(4, "(0, inf)")  # "teacher_sft": the teacher's completions of each training problem

  def check(self) -> None:
    self.require(not (self.init_from and self.hf_checkpoint), "hf_checkpoint", "set init_from or hf_checkpoint, "
                 "not both")
    self.require(not self.preset or self.preset in presets.PRESETS, "preset",
                 f"unknown preset {self.preset!r}; known: {', '.join(presets.names())}")


@dataclasses.dataclass(frozen=True)
class Judge(Section):
  """An LLM judge for the rewards "judge" (pointwise) and "judge_pairwise" (rl_lm/rewards/judge.py) and for AI
  preference labels (`preferences.labeller = "judge"`, rl_lm/train/pairs.py): a frozen
  model on the mesh, loaded like the teacher, with its own tokenizer (a Hugging Face folder's, or the run's for an
  rl_lm checkpoint): the texts are re-tokenised for it. Its verdict is read from its next-token distribution."""

  KEY, STAGES = "judge", ("rl", "reward_model", "dpo")
  init_from: str = knob("", folder)  # an rl_lm checkpoint folder holding "params"
  preset: str = ""  # the checkpoint's preset; "": model.preset
  hf_checkpoint: str = knob("", folder)  # or a Hugging Face folder (its config.json, weights and tokenizer)
  param_dtype: str = knob("bfloat16", DTYPES)  # storage (no optimizer state)
  dtype: str = knob("float32", DTYPES)  # compute dtype of its forward
  # Pointwise: the rubric, ending where the judge's answer begins; {prompt} and {completion} are filled in.
  rubric: str = "Question: {prompt}\nAnswer: {completion}\nRate the answer from 1 (wrong) to 5 (right): "
  scale: str = "12345"  # the answer tokens, worst to best, each one token; score k of K is (k - 1) / (K - 1) in [0, 1]
  # Pairwise ("judge_pairwise", the completion against the problem's reference): {prompt}, {first}, {second}.
  compare: str = "Question: {prompt}\nAnswer 1: {first}\nAnswer 2: {second}\nThe better answer is "
  choices: str = "12"  # the tokens that pick the first and the second answer
  min_mass: float = knob(0.5, "[0, 1]")  # below this probability on the answer tokens: a judge failure, masked
  max_len: int = knob(512, "(0, inf)")  # judge prompt tokens; a longer prompt is a judge failure, masked
  rows: int = knob(64, "(0, inf)")  # judge prompts per forward (padded to the next power of two of the longest)

  def check(self) -> None:
    self.require(not (self.init_from and self.hf_checkpoint), "hf_checkpoint", "set init_from or hf_checkpoint, "
                 "not both")
    self.require(not self.preset or self.preset in presets.PRESETS, "preset",
                 f"unknown preset {self.preset!r}; known: {', '.join(presets.names())}")
    self.require(len(self.scale) >= 2 and len(set(self.scale)) == len(self.scale), "scale",
                 f"{self.scale!r}: at least two distinct answer tokens")
    self.require(len(self.choices) == 2 and self.choices[0] != self.choices[1], "choices",
                 f"{self.choices!r}: two distinct answer tokens")
    for name, fields in (("rubric", ("{prompt}", "{completion}")), ("compare", ("{prompt}", "{first}", "{second}"))):
      missing = [f for f in fields if f not in getattr(self, name)]
      self.require(not missing, name, f"the template lacks {', '.join(missing)}")


@dataclasses.dataclass(frozen=True)
class Rl(Section):
  """The "rl" stage: one loop for PPO and the GRPO family."""

  KEY, STAGES = "rl", ("rl",)
  algorithm: str = knob("grpo", advantages.ESTIMATORS.problem)  # grpo | dr_grpo | rloo | reinforce_pp | ppo
  steps: int = knob(100, "(0, inf)")
  prompts_per_step: int = knob(32, "(0, inf)")
  group_size: int = knob(8, "(0, inf)")  # samples per prompt (G); rows per step = prompts_per_step * group_size
  max_prompt_len: int = knob(16, "(0, inf)")  # prompt slots of the sampler (bos included)
  epochs: int = knob(1, "(0, inf)")  # passes over each step's batch
  minibatches: int = knob(1, "(0, inf)")  # optimizer steps per epoch
  grad_accum: int = knob(1, "(0, inf)")  # micro-batches per optimizer step
  prepare_chunks: int = knob(1, "(0, inf)")  # prepare scores the rows in this many chunks, one after another
  #                                           (less memory at pod scale; 1: the whole batch at once)
  learning_rate: float = knob(1e-3, "(0, inf)")
  warmup_steps: int = knob(0, "[0, inf)")
  weight_decay: float = knob(0.0, "[0, inf)")
  grad_clip: float = knob(1.0, "[0, inf)")  # global-norm clip of the gradients; 0: off
  clip_low: float = knob(0.2, "(0, inf)")  # ratio clip below 1 - clip_low (>= 1: none; CISPO clips above only)
  clip_high: float = knob(0.2, "(0, inf)")  # ratio clip above 1 + clip_high (clip-higher: > clip_low)
  dual_clip: float = 0.0  # dual-clip constant for negative advantages (> 1), 0: off (ppo loss only)
  policy_loss: str = knob("ppo", policy_losses.LOSSES.problem)  # ppo: clipped surrogate | gspo | cispo | gmpo |
  #                                                               clip_cov | kl_cov (gspo, gmpo: seq-mean-token-mean)
  cov_ratio: float = knob(2e-4, "(0, 1]")  # clip_cov / kl_cov: fraction of tokens cut or penalised
  cov_low: float = 1.0  # clip_cov: covariance band (cov_low, cov_high) of the tokens cut
  cov_high: float = 5.0
  cov_kl_coef: float = knob(0.1, "[0, inf)")  # kl_cov: coefficient of |logp - old| on the penalised tokens
  loss_mode: str = knob("token-mean", losses.MODES)
  norm_constant: int = knob(0, "[0, inf)")  # seq-mean-token-sum-norm divisor; 0: sampling.max_new_tokens
  scale_by_std: bool = True  # grpo: divide by the group std (False is Dr. GRPO)
  entropy_coef: float = knob(0.0, "[0, inf)")
  sampler_dtype: str = knob("", ("",) + DTYPES)  # sampler compute dtype ("" = model.dtype); bfloat16 samples cheaper
  # The sampler holds the weights gathered over the fsdp axis, once a rollout: its decode steps then read them
  # locally instead of all-gathering every weight for every token (FSDP's pattern); costs the whole weights (over
  # the tensor axis, in the sampler's dtype) per chip while it samples. No effect without an fsdp axis.
  sampler_gather: bool = False
  max_staleness: int = knob(0, "[0, inf)")  # rollouts sampled up to this many updates ahead (0: synchronous)
  dynamic_sampling: bool = False  # drop zero-variance groups and refill the batch (DAPO)
  max_extra_rollouts: int = knob(2, "[0, inf)")  # extra sampling rounds dynamic sampling may spend per step
  overlong: str = knob("none", ("none", "mask", "penalty"))  # truncated completions: out of the gradient, DAPO soft
  overlong_buffer: int = knob(4, "[0, inf)")  # penalty ramps over the last this-many tokens of the budget
  overlong_penalty: float = knob(1.0, "[0, inf)")  # penalty at the budget
  kl: Kl = dataclasses.field(default_factory=Kl)
  correction: Correction = dataclasses.field(default_factory=Correction)
  value: Value = dataclasses.field(default_factory=Value)
  curriculum: CurriculumConfig = dataclasses.field(default_factory=CurriculumConfig)
  alarms: AlarmConfig = dataclasses.field(default_factory=AlarmConfig)
  distill: Distill = dataclasses.field(default_factory=Distill)
  log_every: int = knob(1, "(0, inf)")
  init_from: str = knob("", folder)  # checkpoint folder RL starts from (<run>/checkpoints/sft); "": the stage before

  def check(self) -> None:
    group = advantages.ESTIMATORS.get(self.algorithm).group
    loss = policy_losses.LOSSES.get(self.policy_loss)
    self.require(not group or self.group_size >= 2, "group_size",
                 f"{self.algorithm} compares samples within a group: needs >= 2, got {self.group_size}")
    rows, per_update = self.prompts_per_step * self.group_size, self.minibatches * self.grad_accum
    self.require(rows % per_update == 0, "minibatches",
                 f"rows per step ({rows}) must split into minibatches * grad_accum = {per_update} equal parts")
    self.require(rows % self.prepare_chunks == 0, "prepare_chunks",
                 f"rows per step ({rows}) must split into {self.prepare_chunks} equal chunks")
    self.require(self.dual_clip == 0 or self.dual_clip > 1, "dual_clip", f"must be 0 or > 1, got {self.dual_clip}")
    self.require(not loss.sequence_level or self.loss_mode == "seq-mean-token-mean", "loss_mode",
                 f"{self.policy_loss} is a sequence-level loss: needs 'seq-mean-token-mean', got {self.loss_mode!r}")
    self.require(self.cov_low < self.cov_high, "cov_high", f"must exceed cov_low = {self.cov_low}")
    dual = [n for n in policy_losses.LOSSES if "dual_clip" in policy_losses.LOSSES.get(n).options.values()]
    self.require(self.dual_clip == 0 or self.policy_loss in dual, "dual_clip",
                 f"the dual clip belongs to the {' and '.join(dual)} loss, not {self.policy_loss}")
    self.require(not group or self.kl.placement != "reward", "kl.placement",
                 f"{self.algorithm} scores whole sequences; put the KL in the loss ('loss') or turn it off ('none')")
    self.require(self.algorithm != "ppo" or self.value.learning_rate > 0, "value.learning_rate",
                 f"must be > 0, got {self.value.learning_rate}")


@dataclasses.dataclass(frozen=True)
class Faults(Section):
  """Faults injected into environment steps (rl_lm/envs/workers.py runs them), each at a rate per step, to measure
  the failure classifier and learning under broken environments."""

  KEY = "env.faults"
  crash: float = knob(0.0, "[0, 1]")  # the worker process dies mid-step
  hang: float = knob(0.0, "[0, 1]")  # the step never answers (the worker is killed at the step timeout)
  slow: float = knob(0.0, "[0, 1]")  # the step takes half the step timeout, then answers normally

  def check(self) -> None:
    self.require(self.crash + self.hang + self.slow <= 1, "slow", "the fault rates must add up to at most 1")


@dataclasses.dataclass(frozen=True)
class Env(Section):
  """Multi-turn environments (rl_lm/envs): the RL stage runs episodes of `name` instead of single completions."""

  KEY, STAGES = "env", ("rl",)
  name: str = ""  # a registered environment (rl_lm.envs.base.ENVIRONMENTS): calculator | python_tool | ...; "": none
  max_turns: int = knob(4, "(0, inf)")  # the policy's turns per episode
  turn_tokens: int = knob(32, "(0, inf)")  # tokens of one policy turn (its stop token included)
  max_tokens: int = knob(128, "(0, inf)")  # the whole episode, prompt and observations included: the KV cache
  workers: int = knob(2, "[0, inf)")  # environment worker processes; 0: in this process (no timeouts, no faults)
  step_timeout_s: float = knob(10.0, "(0, inf)")  # a step (or reset) not answered by then: hang, worker replaced
  faults: Faults = dataclasses.field(default_factory=Faults)

  def check(self) -> None:
    problem = registered("rl_lm.envs.base", "ENVIRONMENTS")(self.name) if self.name else None
    self.require(problem is None, "name", problem)
    injected = self.faults.crash + self.faults.hang + self.faults.slow
    self.require(not injected or self.workers > 0, "workers", "injected faults need environment workers (>= 1)")
    self.require(self.turn_tokens < self.max_tokens, "turn_tokens", f"must be below max_tokens = {self.max_tokens}")


@dataclasses.dataclass(frozen=True)
class Eval(Section):
  """Held-out evaluation: before RL, every `every` steps, after."""

  KEY, STAGES = "eval", ("rl",)
  every: int = knob(0, "[0, inf)")  # 0: only before and after
  num_samples: int = knob(16, "(0, inf)")  # n samples per problem for pass@k, k = 1, 2, 4, ... n
  temperature: float = knob(1.0, "(0, inf)")
  greedy: bool = True  # also greedy accuracy
  rows: int = knob(512, "(0, inf)")  # sampler batch rows for evaluation
