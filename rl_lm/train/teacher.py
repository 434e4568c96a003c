"""The teacher: one more frozen model on the policy's mesh (`config.teacher`), beside the reference.

Its parameters are placed by the same logical-axis rules as the policy's and scored by the same chunked forward
(`rl_update.make_teacher_fn`, a jitted call of its own before `prepare`, so that its failure masks the step's rows
rather than stopping the run): no second server, no weight sync. It keeps no optimizer state
and is stored in `teacher.param_dtype` (bfloat16 by default), so it costs its weights alone: 2 bytes a parameter.

Distillation compares the two models' log-probs of the same token ids, so the teacher must share the policy's
vocabulary: the same number of ids and, for Hugging Face checkpoints, the same tokenizer file. A teacher that does
not is refused when it loads, naming the key (no silent re-tokenisation: the log-probs of another tokenisation
are of other events).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from rl_lm.config.section import ConfigError
from rl_lm.models import build, presets
from rl_lm.models.presets import ModelConfig
from rl_lm.train import stage_run
from rl_lm.train.context import Context


@dataclasses.dataclass
class Frozen:
  """A frozen model on the mesh: its config, its parameters, where they came from and what they hold."""

  model_cfg: ModelConfig
  params: Any
  source: str
  num_params: int
  nbytes: int  # resident bytes over the whole mesh (each shard once)
  per_device: int  # bytes on the first device (a replicated weight counts whole there)

  def describe(self) -> str:
    return (f"{self.source} ({self.num_params:,} parameters, {self.model_cfg.param_dtype}): "
            f"{self.nbytes / 2**20:.1f} MiB resident, {self.per_device / 2**20:.1f} MiB on a device")


def _tokenizer_file(folder: str) -> bytes | None:
  path = os.path.join(folder, "tokenizer.json")
  if not os.path.isfile(path):
    return None
  with open(path, "rb") as f:
    return f.read()


def check_vocabulary(config: Any, policy_cfg: ModelConfig, teacher_cfg: ModelConfig) -> None:
  """Refuses a teacher whose token ids do not mean what the policy's do (see the module docstring)."""
  t = config.teacher
  if teacher_cfg.vocab_size != policy_cfg.vocab_size:
    raise ConfigError("config.teacher", f"a vocabulary of {teacher_cfg.vocab_size} ids, the policy's has "
                      f"{policy_cfg.vocab_size}: distillation compares the log-probs of the same token ids, so the "
                      "teacher must share the policy's tokenizer")
  if t.hf_checkpoint and config.tokenizer != "hf":
    raise ConfigError("config.teacher.hf_checkpoint", f"a Hugging Face teacher with config.tokenizer = "
                      f"{config.tokenizer!r}: its ids are not the policy's")
  if t.hf_checkpoint and _tokenizer_file(t.hf_checkpoint) != _tokenizer_file(config.model.hf_checkpoint):
    raise ConfigError("config.teacher.hf_checkpoint", f"its tokenizer.json differs from the policy's "
                      f"({config.model.hf_checkpoint}): the same ids would be other strings")


def check_samples(policy_cfg: ModelConfig, teacher_cfg: ModelConfig, lora_cfg: Any = None) -> None:
  """Refuses a teacher the policy's sampler cannot run (`rl.distill.on_policy` < 1 samples with it): another
  architecture than the policy's (storage and compute dtypes may differ), or a LoRA policy (the sampler is built
  for the base carrying adapters)."""
  same = teacher_cfg.replace(param_dtype=policy_cfg.param_dtype, dtype=policy_cfg.dtype) == policy_cfg
  if not same or lora_cfg is not None:
    why = "a LoRA policy" if same else "a teacher of another architecture than the policy's"
    raise ConfigError("config.rl.distill.on_policy", f"< 1 samples the teacher with the policy's sampler, which "
                      f"does not run {why}: set on_policy = 1 (the student's samples only)")


def model_config(config: Any, section: str = "teacher") -> ModelConfig:
  """The ModelConfig `load` builds for `config.<section>`, without reading weights (a Hugging Face folder's
  config.json, or the preset's): what `rl_lm.aot` compiles the frozen model's programs for."""
  t = config[section]
  if t.hf_checkpoint:
    return build.config_of(ml_collections.ConfigDict(
      {"hf_checkpoint": t.hf_checkpoint, "dtype": t.dtype, "param_dtype": t.param_dtype, "remat": False,
       "logit_chunk": config.model.logit_chunk}))
  return presets.get(t.preset or config.model.preset, dtype=t.dtype, param_dtype=t.param_dtype,
                     logit_chunk=config.model.logit_chunk)


def load(config: Any, ctx: Context, log: Callable[[str], Any] = print, section: str = "teacher") -> Frozen:
  """`config.<section>` on `ctx.mesh`: a Hugging Face folder, or the "params" of an rl_lm checkpoint of a preset.
  The teacher (section "teacher") must share the policy's vocabulary; a judge ("judge") reads re-tokenised text."""
  t = config[section]
  if t.hf_checkpoint:
    from rl_lm.models import hf

    cfg, params = hf.load(t.hf_checkpoint, mesh=ctx.mesh, rules=ctx.rules, dtype=t.dtype, param_dtype=t.param_dtype)
    cfg, source = cfg.replace(logit_chunk=config.model.logit_chunk), t.hf_checkpoint
  else:
    cfg = model_config(config, section)
    params = stage_run.load_params(t.init_from, build.abstract_params(cfg, ctx.mesh, ctx.rules))
    source = f"{t.init_from} (preset {t.preset or config.model.preset})"
  if section == "teacher":
    check_vocabulary(config, ctx.model_cfg, cfg)
  leaves = jax.tree.leaves(params)
  frozen = Frozen(cfg, params, source, sum(x.size for x in leaves), sum(x.nbytes for x in leaves),
                  sum(x.addressable_shards[0].data.nbytes for x in leaves))
  stage_run.speaker(log)(f"{section}: {frozen.describe()}")
  return frozen


def load_judge(config: Any, ctx: Context, log: Callable[[str], Any] = print) -> Any:
  """`config.judge` on the mesh with its own tokenizer (a Hugging Face folder's, with its chat template when it has
  one; else the run's): a `rl_lm.rewards.judge.JudgeModel`."""
  from rl_lm import tokenizer as tokenizer_lib
  from rl_lm.rewards.judge import JudgeModel

  j = config.judge
  frozen = load(config, ctx, log, "judge")
  tok = ctx.tokenizer
  if j.hf_checkpoint:
    try:
      tok = tokenizer_lib.HFTokenizer(j.hf_checkpoint, chat=True)
    except tokenizer_lib.TokenizerError:  # no chat template: the rubric as plain text
      tok = tokenizer_lib.HFTokenizer(j.hf_checkpoint)
  if tok.vocab_size > frozen.model_cfg.vocab_size:
    raise ConfigError("config.judge", f"its tokenizer has {tok.vocab_size} ids, its model only "
                      f"{frozen.model_cfg.vocab_size}")
  return JudgeModel(frozen.model_cfg, frozen.params, tok, j.rows, j.max_len, ctx.mesh, ctx.rules)
