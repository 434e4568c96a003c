"""The configuration schema shared by every `configs/*.py`, and its validation.

`base_config()` returns every field with its default and a comment; a config file starts from it
and changes what its experiment needs. `validate(config)` runs before anything is compiled and
raises `ConfigError` naming the offending key: every float must be finite (a few documented fields may
be inf, see ALLOW_INF) and the important ones within their ranges.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterator
from typing import Any

import ml_collections

from rl_lm.models import presets

STAGES = ("sample", "sft", "reward_model", "dpo", "rl")
ALGORITHMS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo")
LOSS_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
DTYPES = ("float32", "bfloat16")
WANDB_MODES = ("offline", "online", "disabled")
# Float fields that may be +inf (their comment in base_config says what inf means); every other float must be finite.
ALLOW_INF = frozenset({"rl.alarms.kl_max", "rl.alarms.logprob_gap_max"})


class ConfigError(ValueError):
  """An invalid configuration value. `key` is the dotted path, e.g. 'config.mesh.data'."""

  def __init__(self, key: str, message: str):
    super().__init__(f"{key}: {message}")
    self.key = key


def base_config() -> ml_collections.ConfigDict:
  """Every field a run reads, with its default."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # every random stream is fold_in(key(seed), ...)
  c.stages = ("sample",)  # run in order; see rl_lm.config.STAGES
  c.tokenizer = "char"  # "char" (built-in tasks) or "hf" (from model.hf_checkpoint)
  c.stop_after_nonfinite = 5  # consecutive skipped updates (NaN/inf loss or gradients) that stop the run

  c.checkpoint = ml_collections.ConfigDict()  # under <workdir>/checkpoints/<stage>/<step>/
  c.checkpoint.every = 50  # steps between saves in a training stage (sft, rl), which also saves at its end
  c.checkpoint.keep = 3  # the last this-many checkpoints of a stage are kept
  c.checkpoint.async_save = True  # write in the background while training goes on
  c.checkpoint.resume = True  # a workdir that holds checkpoints resumes from the latest; False: refuse it

  c.logging = ml_collections.ConfigDict()  # metrics.jsonl and the console line are always written
  c.logging.tensorboard = False  # also TensorBoard event files under <workdir>/tensorboard/<stage>
  c.logging.wandb_mode = "offline"  # offline (sync later with `wandb sync`) | online | disabled
  c.logging.wandb_project = "rl_lm"

  c.model = ml_collections.ConfigDict()
  c.model.preset = "tiny"  # a name in rl_lm.models.presets
  c.model.hf_checkpoint = ""  # a Hugging Face directory; when set, its config and weights replace the preset
  c.model.dtype = "float32"  # compute dtype: float32 | bfloat16
  c.model.param_dtype = "float32"  # storage dtype of the parameters
  c.model.remat = False  # rematerialise layers in the backward pass (saves memory)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # data-parallel axis; -1 takes the devices the other axes leave
  c.mesh.fsdp = 1  # parameter-sharding axis
  c.mesh.tensor = 1  # tensor-parallel axis
  c.mesh.rules = ()  # ((logical, mesh axes), ...); empty: rl_lm.mesh.DEFAULT_RULES

  c.sampling = ml_collections.ConfigDict()
  c.sampling.max_new_tokens = 32  # completion budget N
  c.sampling.temperature = 1.0
  c.sampling.top_k = 0  # 0: off
  c.sampling.top_p = 1.0  # 1.0: off
  c.sampling.greedy = False
  c.sampling.cache_dtype = ""  # KV-cache dtype; "" follows model.dtype

  c.sample = ml_collections.ConfigDict()  # the "sample" stage: draw completions for fixed prompts
  c.sample.prompts = ("12+7=", "3*(4+5)=", "Once upon a time")
  c.sample.batch_size = 8  # rows per generate call; prompts are cycled to fill it
  c.sample.num_batches = 2  # generate calls (the first one compiles)

  c.task = ml_collections.ConfigDict()  # where prompts come from (rl_lm.tasks)
  c.task.name = "arithmetic"  # arithmetic | gsm8k | humaneval
  c.task.levels = (1, 2, 3)  # arithmetic difficulty levels in play
  c.task.worked = False  # arithmetic: SFT targets show one operation per line before the answer
  c.task.test_fraction = 0.1  # arithmetic: share of expressions (by hash) held out for evaluation
  c.task.decimal_demos = 0.0  # arithmetic: share of SFT targets written "33.0" (imperfect demonstrations)
  c.task.data_dir = ""  # gsm8k / humaneval: folder of the JSONL files ("" = ../shared/data/<task>)
  c.task.template = "plain"  # gsm8k prompt template: plain | chat | chat_cot | a string with {question}
  c.task.pool_size = 4000  # training prompts the curriculum draws from (procedural tasks)
  c.task.eval_size = 200  # held-out problems per evaluation

  c.reward = ml_collections.ConfigDict()
  c.reward.weights = ml_collections.ConfigDict({"correctness": 1.0})  # {reward name: weight}
  c.reward.learned = False  # RL trains on the reward model (reward_model stage or model_checkpoint); the rewards
  #                            in `weights` are then measured beside it as the gold reward, never trained on
  c.reward.model_checkpoint = ""  # a reward_model checkpoint folder; "": the reward_model stage of this run
  c.reward.success_threshold = 1.0  # an episode with score >= this counts as solved (pass rate, curriculum)

  c.sft = ml_collections.ConfigDict()  # the "sft" stage: next-token loss on reference completions
  c.sft.steps = 300
  c.sft.batch_size = 64
  c.sft.max_len = 48  # bos + prompt + target + eos, right-padded
  c.sft.learning_rate = 3e-3
  c.sft.warmup_steps = 30
  c.sft.weight_decay = 0.0
  c.sft.log_every = 50
  c.sft.init_from = ""  # a checkpoint folder (<workdir>/checkpoints/<stage> of a run, or one step in it) to start from

  c.preferences = ml_collections.ConfigDict()  # pairs for the "reward_model" and "dpo" stages
  c.preferences.source = "synthetic"  # synthetic (task.name="preferences") | a JSONL file of pairs
  c.preferences.train_pairs = 4000  # synthetic: pairs drawn on training prompts
  c.preferences.eval_pairs = 500  # held-out pairs (synthetic: held-out prompts; JSONL: the file's last lines)
  c.preferences.label_noise = 0.0  # synthetic: probability that a Bradley-Terry label is flipped
  c.preferences.beta = 100.0  # synthetic: Bradley-Terry temperature of the labeller on the gold score
  c.preferences.max_len = 24  # bos + prompt + completion + eos, right-padded

  c.reward_model = ml_collections.ConfigDict()  # the "reward_model" stage: Bradley-Terry on a scalar head
  c.reward_model.steps = 300
  c.reward_model.batch_size = 32  # pairs per step
  c.reward_model.learning_rate = 3e-4
  c.reward_model.warmup_steps = 20
  c.reward_model.weight_decay = 0.0
  c.reward_model.log_every = 50
  c.reward_model.init_from = ""  # backbone from a checkpoint folder; "": the policy the stage before left
  c.reward_model.normalize_samples = 256  # policy samples whose mean reward is subtracted (zero mean); 0: off

  c.dpo = ml_collections.ConfigDict()  # the "dpo" stage: DPO / IPO against the frozen starting policy
  c.dpo.loss_type = "dpo"  # dpo | ipo
  c.dpo.beta = 0.1  # KL strength (IPO: the tau of Azar et al.)
  c.dpo.label_smoothing = 0.0  # conservative DPO: assumed label-flip rate
  c.dpo.nll_coef = 0.0  # RPO: + coef x per-token NLL of the chosen responses (holds their likelihood up)
  c.dpo.steps = 300
  c.dpo.batch_size = 32  # pairs per step
  c.dpo.learning_rate = 1e-4
  c.dpo.warmup_steps = 20
  c.dpo.weight_decay = 0.0
  c.dpo.log_every = 50
  c.dpo.init_from = ""  # a checkpoint folder to start from; "": the policy the stage before left
  c.dpo.eval_prompts = 200  # held-out prompts sampled before and after DPO for the gold win rate

  c.rl = ml_collections.ConfigDict()  # the "rl" stage: one loop for PPO and the GRPO family
  c.rl.algorithm = "grpo"  # grpo | dr_grpo | rloo | reinforce_pp | ppo
  c.rl.steps = 100
  c.rl.prompts_per_step = 32
  c.rl.group_size = 8  # samples per prompt (G); rows per step = prompts_per_step * group_size
  c.rl.max_prompt_len = 16  # prompt slots of the sampler (bos included)
  c.rl.epochs = 1  # passes over each step's batch
  c.rl.minibatches = 1  # optimizer steps per epoch
  c.rl.grad_accum = 1  # micro-batches per optimizer step
  c.rl.learning_rate = 1e-3
  c.rl.warmup_steps = 0
  c.rl.weight_decay = 0.0
  c.rl.grad_clip = 1.0  # global-norm clip of the gradients; 0: off
  c.rl.clip_low = 0.2  # ratio clip below 1 - clip_low
  c.rl.clip_high = 0.2  # ratio clip above 1 + clip_high (clip-higher: > clip_low)
  c.rl.dual_clip = 0.0  # dual-clip constant for negative advantages (> 1), 0: off
  c.rl.loss_mode = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
  c.rl.norm_constant = 0  # seq-mean-token-sum-norm divisor; 0: sampling.max_new_tokens
  c.rl.scale_by_std = True  # grpo: divide by the group std (False is Dr. GRPO)
  c.rl.entropy_coef = 0.0
  c.rl.tis_cap = 2.0  # truncated importance sampling cap C on exp(trainer_old - sampler); 0: off
  c.rl.sampler_dtype = ""  # sampler compute dtype ("" = model.dtype); bfloat16 to sample cheaper than training
  c.rl.dynamic_sampling = False  # drop zero-variance groups and refill the batch (DAPO)
  c.rl.max_extra_rollouts = 2  # extra sampling rounds dynamic sampling may spend per step
  c.rl.overlong = "none"  # truncated completions: none | mask (out of the gradient) | penalty (DAPO soft)
  c.rl.overlong_buffer = 4  # penalty ramps over the last this-many tokens of the budget
  c.rl.overlong_penalty = 1.0  # penalty at the budget
  c.rl.kl = ml_collections.ConfigDict()
  c.rl.kl.placement = "loss"  # loss (GRPO) | reward (InstructGPT, PPO) | none
  c.rl.kl.estimator = "k3"  # k1 | k2 | k3
  c.rl.kl.coef = 0.01
  c.rl.kl.adaptive = False  # Ziegler et al. (2019) proportional controller towards target
  c.rl.kl.target = 0.05  # per-token KL (mean k1 over completion tokens) the adaptive controller aims at
  c.rl.kl.horizon = 10000  # in episodes: the adaptive coefficient moves by at most 20% per horizon
  c.rl.value = ml_collections.ConfigDict()  # ppo only
  c.rl.value.learning_rate = 1e-3
  c.rl.value.coef = 0.5
  c.rl.value.clip = 0.2  # value clip around the old values; 0: off
  c.rl.value.gamma = 1.0
  c.rl.value.lam = 0.95
  c.rl.value.whiten_advantages = True
  c.rl.curriculum = ml_collections.ConfigDict()
  c.rl.curriculum.enabled = True
  c.rl.curriculum.decay = 0.9
  c.rl.curriculum.floor = 0.02
  c.rl.curriculum.retire_above = 0.95
  c.rl.curriculum.min_attempts = 16
  c.rl.curriculum.initial_levels = 3
  c.rl.curriculum.promote_above = 0.6
  c.rl.curriculum.promote_min_seen = 0.5
  c.rl.alarms = ml_collections.ConfigDict()  # thresholds of the run-health alarms in the log
  c.rl.alarms.entropy_min = 0.02
  c.rl.alarms.kl_max = 1.0  # inf: off
  c.rl.alarms.logprob_gap_max = 0.1  # inf: off
  c.rl.alarms.zero_variance_max = 0.8
  c.rl.log_every = 1
  c.rl.init_from = ""  # a checkpoint folder whose policy starts RL (e.g. <run>/checkpoints/sft); "": the stage before

  c.eval = ml_collections.ConfigDict()  # held-out evaluation: before RL, every `every` steps, after
  c.eval.every = 0  # 0: only before and after
  c.eval.num_samples = 16  # n samples per problem for pass@k, k = 1, 2, 4, ... n
  c.eval.temperature = 1.0
  c.eval.greedy = True  # also greedy accuracy
  c.eval.rows = 512  # sampler batch rows for evaluation
  return c


# ------------------------------------------------------------------------------------------------
# Validation


def _require(cond: bool, key: str, message: str) -> None:
  if not cond:
    raise ConfigError(key, message)


def _positive_int(config: Any, key: str) -> None:
  value = _get(config, key)
  _require(isinstance(value, int) and not isinstance(value, bool) and value > 0, f"config.{key}",
           f"must be a positive integer, got {value!r}")


def _in_range(config: Any, key: str, low: float | None = None, high: float | None = None, *, low_open: bool = False,
              high_open: bool = False) -> None:
  """config.<key> within [low, high] (an open end excludes the bound; None: unbounded)."""
  value = _get(config, key)
  ok = ((low is None or (value > low if low_open else value >= low))
        and (high is None or (value < high if high_open else value <= high)))
  if high is None:
    text = f"must be {'>' if low_open else '>='} {low}"
  elif low is None:
    text = f"must be {'<' if high_open else '<='} {high}"
  else:
    text = f"must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
  _require(ok, f"config.{key}", f"{text}, got {value!r}")


def _numbers(node: Any, path: str) -> Iterator[tuple[str, float]]:
  """(dotted key, value) of every non-integer number under `node`, inside tuples and lists too."""
  if isinstance(node, ml_collections.ConfigDict):
    for k, v in node.items():
      yield from _numbers(v, f"{path}.{k}" if path else k)
  elif isinstance(node, (tuple, list)):
    for i, v in enumerate(node):
      yield from _numbers(v, f"{path}[{i}]")
  elif isinstance(node, numbers.Real) and not isinstance(node, numbers.Integral):
    yield path, float(node)


def _check_finite(config: Any, num_devices: int) -> None:
  """Every float is a number (NaN never is) and finite, except the fields in ALLOW_INF, which may be +inf."""
  for key, value in _numbers(config, ""):
    allowed = key in ALLOW_INF and value == math.inf
    _require(math.isfinite(value) or allowed, f"config.{key}", f"must be a finite number, got {value}")


def _get(config: Any, key: str) -> Any:
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def _check_model(config: Any, num_devices: int) -> None:
  m = config.model
  if not m.hf_checkpoint:
    _require(m.preset in presets.PRESETS, "config.model.preset",
             f"unknown preset {m.preset!r}; known: {', '.join(presets.names())}")
  else:
    _require(os.path.isfile(os.path.join(m.hf_checkpoint, "config.json")), "config.model.hf_checkpoint",
             f"no config.json in {m.hf_checkpoint!r}")
  for key in ("dtype", "param_dtype"):
    _require(m[key] in DTYPES, f"config.model.{key}", f"must be one of {DTYPES}, got {m[key]!r}")


def _check_mesh(config: Any, num_devices: int) -> None:
  sizes = {k: config.mesh[k] for k in ("data", "fsdp", "tensor")}
  for k, v in sizes.items():
    _require(isinstance(v, int) and (v > 0 or v == -1), f"config.mesh.{k}", f"must be positive or -1, got {v!r}")
  free = [k for k, v in sizes.items() if v == -1]
  _require(len(free) <= 1, f"config.mesh.{free[-1] if free else 'data'}", f"at most one axis may be -1, got {sizes}")
  fixed = math.prod(v for v in sizes.values() if v != -1)
  key = f"config.mesh.{free[0]}" if free else "config.mesh"
  if free:
    _require(num_devices % fixed == 0, key, f"{num_devices} devices cannot be split by the other axes {sizes}")
  else:
    _require(fixed == num_devices, key,
             f"data*fsdp*tensor = {fixed} does not match the {num_devices} devices; set one axis to -1 to fill "
             "the rest")
  for i, rule in enumerate(config.mesh.rules):
    _require(isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str),
             f"config.mesh.rules[{i}]", f"must be a (logical name, mesh axes) pair, got {rule!r}")
    axes = (rule[1],) if isinstance(rule[1], str) else tuple(rule[1] or ())
    for a in axes:
      _require(a in ("data", "fsdp", "tensor"), f"config.mesh.rules[{i}]", f"unknown mesh axis {a!r}")


def _check_sampling(config: Any, num_devices: int) -> None:
  s = config.sampling
  _positive_int(config, "sampling.max_new_tokens")
  if not s.greedy:
    _require(s.temperature > 0, "config.sampling.temperature", f"must be > 0 unless greedy, got {s.temperature}")
  _require(s.top_k >= 0, "config.sampling.top_k", f"must be >= 0 (0 is off), got {s.top_k}")
  _require(0.0 < s.top_p <= 1.0, "config.sampling.top_p", f"must be in (0, 1], got {s.top_p}")
  _require(s.cache_dtype in ("",) + DTYPES, "config.sampling.cache_dtype",
           f"must be '' or one of {DTYPES}, got {s.cache_dtype!r}")


def data_parallelism(config: Any, num_devices: int) -> int:
  """How many ways the batch axis is split: the product of the mesh axes that 'batch' maps to."""
  sizes = {k: config.mesh[k] for k in ("data", "fsdp", "tensor")}
  fixed = math.prod(v for v in sizes.values() if v != -1)
  sizes = {k: (num_devices // fixed if v == -1 else v) for k, v in sizes.items()}
  rules = dict(config.mesh.rules) if config.mesh.rules else {"batch": ("data", "fsdp")}
  axes = rules.get("batch", ())
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  return math.prod(sizes[a] for a in axes)


def _check_sample_stage(config: Any, num_devices: int) -> None:
  s = config.sample
  _positive_int(config, "sample.batch_size")
  _positive_int(config, "sample.num_batches")
  _require(len(s.prompts) > 0 and all(isinstance(p, str) and p for p in s.prompts), "config.sample.prompts",
           "must be a non-empty tuple of non-empty strings")
  dp = data_parallelism(config, num_devices)
  _require(s.batch_size % dp == 0, "config.sample.batch_size",
           f"{s.batch_size} is not divisible by the {dp}-way data-parallel mesh axes")
  if not config.model.hf_checkpoint and config.model.preset in presets.PRESETS:
    max_len = presets.get(config.model.preset).max_seq_len
    longest = max(len(p) for p in s.prompts) + (1 if config.tokenizer == "char" else 0)
    _require(longest + config.sampling.max_new_tokens <= max_len, "config.sampling.max_new_tokens",
             f"longest prompt ({longest}) + max_new_tokens ({config.sampling.max_new_tokens}) exceeds the model's "
             f"max_seq_len {max_len}")


def _check_top(config: Any, num_devices: int) -> None:
  _require(isinstance(config.seed, int) and config.seed >= 0, "config.seed", f"must be >= 0, got {config.seed!r}")
  _require(len(config.stages) > 0, "config.stages", "must name at least one stage")
  for i, st in enumerate(config.stages):
    _require(st in STAGES, f"config.stages[{i}]", f"unknown stage {st!r}; known: {', '.join(STAGES)}")
  _require(config.tokenizer in ("char", "hf"), "config.tokenizer", f"must be 'char' or 'hf', got {config.tokenizer!r}")
  if config.tokenizer == "hf":
    _require(bool(config.model.hf_checkpoint), "config.model.hf_checkpoint",
             "required by config.tokenizer='hf' (the tokenizer is read from the checkpoint)")


def _check_run(config: Any, num_devices: int) -> None:
  _positive_int(config, "stop_after_nonfinite")
  ck = config.checkpoint
  _require(isinstance(ck.every, int) and ck.every >= 0, "config.checkpoint.every",
           f"must be >= 0 (0: only at the end of a stage), got {ck.every!r}")
  _positive_int(config, "checkpoint.keep")
  lg = config.logging
  _require(lg.wandb_mode in WANDB_MODES, "config.logging.wandb_mode", f"must be one of {WANDB_MODES}, got "
           f"{lg.wandb_mode!r}")
  for stage in ("sft", "rl"):
    path = config[stage].init_from
    if path and stage in config.stages:
      _require(os.path.isdir(path), f"config.{stage}.init_from", f"no such checkpoint folder {path!r}")


def _model_max_len(config: Any) -> int | None:
  if config.model.hf_checkpoint or config.model.preset not in presets.PRESETS:
    return None
  return presets.get(config.model.preset).max_seq_len


def _check_task(config: Any, num_devices: int) -> None:
  from rl_lm.tasks import TASKS
  from rl_lm.tasks.arithmetic import LEVELS

  t = config.task
  _require(t.name in TASKS, "config.task.name", f"unknown task {t.name!r}; known: {', '.join(sorted(TASKS))}")
  if t.name == "arithmetic":
    bad = [lv for lv in t.levels if lv not in LEVELS]
    _require(bool(t.levels) and not bad, "config.task.levels",
             f"unknown arithmetic levels {bad or list(t.levels)}; known: {sorted(LEVELS)}")
  from rl_lm.tasks.gsm8k import TEMPLATES

  _require(0.0 < t.test_fraction < 1.0, "config.task.test_fraction", f"must be in (0, 1), got {t.test_fraction}")
  _require(0.0 <= t.decimal_demos <= 1.0, "config.task.decimal_demos", f"must be in [0, 1], got {t.decimal_demos}")
  _require(t.template in TEMPLATES or "{question}" in t.template, "config.task.template",
           f"must be one of {sorted(TEMPLATES)} or a string containing '{{question}}', got {t.template!r}")
  if t.data_dir:
    _require(os.path.isdir(t.data_dir), "config.task.data_dir", f"no such directory {t.data_dir!r}")
  _positive_int(config, "task.pool_size")
  _positive_int(config, "task.eval_size")


def _check_reward(config: Any, num_devices: int) -> None:
  from rl_lm.rewards import known_rewards

  known = known_rewards()
  _require(len(config.reward.weights) > 0, "config.reward.weights", "must name at least one reward")
  for name, weight in config.reward.weights.items():
    _require(name in known, f"config.reward.weights.{name}", f"unknown reward {name!r}; known: {', '.join(known)}")
    _require(isinstance(weight, (int, float)), f"config.reward.weights.{name}",
             f"weight must be a number, got {weight!r}")


def _check_sft(config: Any, num_devices: int) -> None:
  s = config.sft
  for key in ("steps", "batch_size", "max_len", "log_every"):
    _positive_int(config, f"sft.{key}")
  _require(s.learning_rate > 0, "config.sft.learning_rate", f"must be > 0, got {s.learning_rate}")
  _require(s.warmup_steps >= 0, "config.sft.warmup_steps", f"must be >= 0, got {s.warmup_steps}")
  _in_range(config, "sft.weight_decay", 0)
  dp = data_parallelism(config, num_devices)
  _require(s.batch_size % dp == 0, "config.sft.batch_size", f"{s.batch_size} is not divisible by the {dp}-way "
           "data-parallel mesh axes")
  max_len = _model_max_len(config)
  if max_len:
    _require(s.max_len <= max_len, "config.sft.max_len", f"{s.max_len} exceeds the model's max_seq_len {max_len}")


def _check_rl(config: Any, num_devices: int) -> None:
  r = config.rl
  _require(r.algorithm in ALGORITHMS, "config.rl.algorithm", f"unknown algorithm {r.algorithm!r}; known: "
           f"{', '.join(ALGORITHMS)}")
  for key in ("steps", "prompts_per_step", "group_size", "max_prompt_len", "epochs", "minibatches", "grad_accum",
              "log_every"):
    _positive_int(config, f"rl.{key}")
  if r.algorithm in ("grpo", "dr_grpo", "rloo"):
    _require(r.group_size >= 2, "config.rl.group_size", f"{r.algorithm} compares samples within a group: needs >= 2, "
             f"got {r.group_size}")
  rows = r.prompts_per_step * r.group_size
  dp = data_parallelism(config, num_devices)
  _require(rows % dp == 0, "config.rl.prompts_per_step",
           f"rows per step = prompts_per_step * group_size = {rows} is not divisible by the {dp}-way data axes")
  per_update = r.minibatches * r.grad_accum
  _require(rows % per_update == 0, "config.rl.minibatches",
           f"rows per step ({rows}) must split into minibatches * grad_accum = {per_update} equal parts")
  _require((rows // per_update) % dp == 0, "config.rl.grad_accum",
           f"a micro-batch of {rows // per_update} rows is not divisible by the {dp}-way data axes")
  for key in ("learning_rate",):
    _require(r[key] > 0, f"config.rl.{key}", f"must be > 0, got {r[key]}")
  _require(r.warmup_steps >= 0, "config.rl.warmup_steps", f"must be >= 0, got {r.warmup_steps}")
  for key in ("weight_decay", "grad_clip", "entropy_coef", "overlong_buffer", "overlong_penalty", "value.coef",
              "value.clip", "curriculum.floor", "curriculum.min_attempts", "alarms.entropy_min"):
    _in_range(config, f"rl.{key}", 0)
  for key in ("curriculum.retire_above", "curriculum.promote_above", "curriculum.promote_min_seen",
              "alarms.zero_variance_max"):
    _in_range(config, f"rl.{key}", 0, 1)
  for key in ("alarms.kl_max", "alarms.logprob_gap_max"):
    _in_range(config, f"rl.{key}", 0, low_open=True)
  _require(0 < r.clip_low < 1, "config.rl.clip_low", f"must be in (0, 1), got {r.clip_low}")
  _require(r.clip_high > 0, "config.rl.clip_high", f"must be > 0, got {r.clip_high}")
  _require(r.dual_clip == 0 or r.dual_clip > 1, "config.rl.dual_clip", f"must be 0 (off) or > 1, got {r.dual_clip}")
  _require(r.loss_mode in LOSS_MODES, "config.rl.loss_mode", f"unknown mode {r.loss_mode!r}; known: {LOSS_MODES}")
  _require(r.norm_constant >= 0, "config.rl.norm_constant", f"must be >= 0, got {r.norm_constant}")
  _require(r.tis_cap == 0 or r.tis_cap >= 1, "config.rl.tis_cap", f"must be 0 (off) or >= 1, got {r.tis_cap}")
  _require(r.sampler_dtype in ("",) + DTYPES, "config.rl.sampler_dtype", f"must be '' or one of {DTYPES}")
  _require(r.overlong in ("none", "mask", "penalty"), "config.rl.overlong", f"must be none, mask or penalty, got "
           f"{r.overlong!r}")
  _require(r.max_extra_rollouts >= 0, "config.rl.max_extra_rollouts", "must be >= 0")
  _require(r.kl.placement in ("loss", "reward", "none"), "config.rl.kl.placement",
           f"must be loss, reward or none, got {r.kl.placement!r}")
  _require(r.kl.estimator in ("k1", "k2", "k3"), "config.rl.kl.estimator", f"must be k1, k2 or k3, got "
           f"{r.kl.estimator!r}")
  _require(r.kl.coef >= 0, "config.rl.kl.coef", f"must be >= 0, got {r.kl.coef}")
  if r.algorithm in ("grpo", "dr_grpo", "rloo"):
    _require(r.kl.placement != "reward", "config.rl.kl.placement",
             f"{r.algorithm} scores whole sequences; put the KL in the loss ('loss') or turn it off ('none')")
  _require(not config.sampling.greedy, "config.sampling.greedy",
           "RL needs sampled completions (greedy ones have no log-prob ratio and every group zero variance)")
  _require(r.kl.target > 0, "config.rl.kl.target", f"must be > 0, got {r.kl.target}")
  _require(r.kl.horizon > 0, "config.rl.kl.horizon", f"must be > 0, got {r.kl.horizon}")
  if r.algorithm == "ppo":
    _require(r.value.learning_rate > 0, "config.rl.value.learning_rate", f"must be > 0, got {r.value.learning_rate}")
  for key in ("gamma", "lam"):
    _require(0 <= r.value[key] <= 1, f"config.rl.value.{key}", f"must be in [0, 1], got {r.value[key]}")
  cur = r.curriculum
  _require(0 < cur.decay <= 1, "config.rl.curriculum.decay", f"must be in (0, 1], got {cur.decay}")
  _require(cur.initial_levels >= 1, "config.rl.curriculum.initial_levels", "must be >= 1")
  max_len = _model_max_len(config)
  if max_len:
    total = r.max_prompt_len + config.sampling.max_new_tokens
    _require(total <= max_len, "config.rl.max_prompt_len",
             f"max_prompt_len ({r.max_prompt_len}) + sampling.max_new_tokens ({config.sampling.max_new_tokens}) = "
             f"{total} exceeds the model's max_seq_len {max_len}")
  e = config.eval
  _positive_int(config, "eval.num_samples")
  _positive_int(config, "eval.rows")
  _require(e.every >= 0, "config.eval.every", f"must be >= 0, got {e.every}")
  _require(e.temperature > 0, "config.eval.temperature", f"must be > 0, got {e.temperature}")
  _require(e.rows % dp == 0, "config.eval.rows", f"{e.rows} is not divisible by the {dp}-way data axes")


def _check_preferences(config: Any, num_devices: int) -> None:
  p = config.preferences
  if p.source == "synthetic":
    _require(config.task.name == "preferences", "config.preferences.source",
             f"synthetic pairs come from task 'preferences', but config.task.name is {config.task.name!r}")
  else:
    _require(os.path.isfile(p.source), "config.preferences.source", f"no such JSONL file {p.source!r}")
  for key in ("train_pairs", "eval_pairs", "max_len"):
    _positive_int(config, f"preferences.{key}")
  _require(0.0 <= p.label_noise <= 0.5, "config.preferences.label_noise", f"must be in [0, 0.5], got {p.label_noise}")
  _require(p.beta > 0, "config.preferences.beta", f"must be > 0, got {p.beta}")
  max_len = _model_max_len(config)
  if max_len:
    _require(p.max_len <= max_len, "config.preferences.max_len", f"{p.max_len} exceeds the model's max_seq_len "
             f"{max_len}")


def _check_pair_stage(name: str) -> Callable[[Any, int], None]:
  def check(config: Any, num_devices: int) -> None:
    s = config[name]
    for key in ("steps", "batch_size", "log_every"):
      _positive_int(config, f"{name}.{key}")
    _require(s.learning_rate > 0, f"config.{name}.learning_rate", f"must be > 0, got {s.learning_rate}")
    _require(s.warmup_steps >= 0, f"config.{name}.warmup_steps", f"must be >= 0, got {s.warmup_steps}")
    _in_range(config, f"{name}.weight_decay", 0)
    dp = data_parallelism(config, num_devices)
    _require(s.batch_size % dp == 0, f"config.{name}.batch_size", f"{s.batch_size} pairs are not divisible by the "
             f"{dp}-way data axes")
    if s.init_from:
      _require(os.path.isdir(s.init_from), f"config.{name}.init_from", f"no such checkpoint folder {s.init_from!r}")
    if name == "dpo":
      _require(s.loss_type in ("dpo", "ipo"), "config.dpo.loss_type", f"must be dpo or ipo, got {s.loss_type!r}")
      _require(s.beta > 0, "config.dpo.beta", f"must be > 0, got {s.beta}")
      _require(0 <= s.label_smoothing < 0.5, "config.dpo.label_smoothing", f"must be in [0, 0.5), got "
               f"{s.label_smoothing}")
      _require(s.loss_type == "dpo" or s.label_smoothing == 0, "config.dpo.label_smoothing",
               "applies to the dpo loss only")
      _require(s.nll_coef >= 0, "config.dpo.nll_coef", f"must be >= 0, got {s.nll_coef}")
    else:
      _require(s.normalize_samples >= 0, "config.reward_model.normalize_samples", "must be >= 0")

  return check


def _check_learned_reward(config: Any, num_devices: int) -> None:
  r = config.reward
  if r.learned:
    has_stage = "reward_model" in config.stages and config.stages.index("reward_model") < config.stages.index("rl")
    _require(has_stage or bool(r.model_checkpoint), "config.reward.learned",
             "needs a reward_model stage before rl, or config.reward.model_checkpoint")
    if r.model_checkpoint:
      _require(os.path.isdir(r.model_checkpoint), "config.reward.model_checkpoint",
               f"no such checkpoint folder {r.model_checkpoint!r}")


# Section checks in order; the stage checks run only for stages the run includes.
CHECKS: list[Callable[[Any, int], None]] = [_check_finite, _check_top, _check_run, _check_model, _check_mesh,
                                            _check_sampling]
STAGE_CHECKS: dict[str, list[Callable[[Any, int], None]]] = {
  "sample": [_check_sample_stage],
  "sft": [_check_task, _check_sft],
  "reward_model": [_check_task, _check_preferences, _check_pair_stage("reward_model")],
  "dpo": [_check_task, _check_preferences, _check_pair_stage("dpo")],
  "rl": [_check_task, _check_reward, _check_learned_reward, _check_rl],
}


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises ConfigError (naming the key) for any impossible value. Compiles nothing."""
  if num_devices is None:
    import jax

    num_devices = jax.device_count()
  for check in CHECKS:
    check(config, num_devices)
  done = set()
  for stage in config.stages:
    for check in STAGE_CHECKS[stage]:
      if check not in done:
        check(config, num_devices)
        done.add(check)


# ------------------------------------------------------------------------------------------------
# Command-line errors


def _load_config_file(spec: str) -> ml_collections.ConfigDict | None:
  """Loads `path[:arg]` the way config_flags does; None if that fails too."""
  import importlib.util

  path, _, arg = spec.partition(":")
  try:
    module_spec = importlib.util.spec_from_file_location("_rl_lm_config_probe", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception:  # noqa: BLE001 -- only used to explain another error
    return None


def explain_flag_error(argv: list[str], error: Exception) -> str:
  """One line saying which `--config.*` override was wrong, for an error raised while parsing flags."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  config = _load_config_file(spec) if spec else None
  if config is not None:
    for a in argv:
      if not a.startswith("--config."):
        continue
      path = a[len("--config."):].split("=", 1)[0]
      node, walked = config, "config"
      for part in path.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
          known = ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else "(not a section)"
          return f"config.{path}: unknown key {part!r} under {walked}; known keys: {known}"
        node, walked = node[part], f"{walked}.{part}"
  message = str(error).removeprefix("flag ")
  if "Traceback" in message:  # an exception inside the config file: keep its last line
    last = [ln for ln in message.splitlines() if ln.strip()][-1]
    return f"{spec}: {last}"
  return message if "--config" in message or not spec else f"{message} (while applying --config overrides)"
