"""The sections every run reads: the top level, checkpoints, logging, model, mesh and sampling; and `sample`."""

from __future__ import annotations

import dataclasses
import os

from rl_lm.config.section import Section, knob, registered
from rl_lm.models import presets, transformer

DTYPES = ("float32", "bfloat16")
WANDB_MODES = ("offline", "online", "disabled")
MESH_AXES = ("data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class Run(Section):
  """The top-level fields."""

  seed: int = knob(0, "[0, inf)")  # every random stream is fold_in(key(seed), ...)
  stages: tuple[str, ...] = ("sample",)  # run in order; registered in rl_lm.train.stages.STAGES
  tokenizer: str = knob("char", ("char", "hf"))  # "char" (built-in tasks) or "hf" (from model.hf_checkpoint)
  stop_after_nonfinite: int = knob(5, "(0, inf)")  # skipped updates in a row (NaN/inf loss or gradients) that stop it
  export_dir: str = ""  # after the last stage, the policy (LoRA merged) as a Hugging Face folder here; "": none

  def check(self) -> None:
    self.require(len(self.stages) > 0, "stages", "must name at least one stage")
    unknown = registered("rl_lm.train.stages", "STAGES")
    for i, stage in enumerate(self.stages):
      problem = unknown(stage)
      self.require(problem is None, f"stages[{i}]", problem)


@dataclasses.dataclass(frozen=True)
class Checkpoint(Section):
  """Checkpoints, under <workdir>/checkpoints/<stage>/<step>/."""

  KEY = "checkpoint"
  every: int = knob(50, "[0, inf)")  # steps between saves in a training stage (sft, rl), which also saves at its end
  keep: int = knob(3, "(0, inf)")  # the last this-many checkpoints of a stage are kept
  async_save: bool = True  # write in the background while training goes on
  resume: bool = True  # a workdir that holds checkpoints resumes from the latest; False: refuse it


@dataclasses.dataclass(frozen=True)
class Logging(Section):
  """Where metrics go besides metrics.jsonl and the console line, which are always written."""

  KEY = "logging"
  tensorboard: bool = False  # also TensorBoard event files under <workdir>/tensorboard/<stage>
  wandb_mode: str = knob("offline", WANDB_MODES)  # offline (sync later with `wandb sync`) | online | disabled
  wandb_project: str = "rl_lm"


@dataclasses.dataclass(frozen=True)
class Lora(Section):
  """Low-rank adapters on the policy (rl_lm/models/lora.py): the rl stage trains them, the base stays frozen."""

  KEY = "model.lora"
  rank: int = knob(0, "[0, inf)")  # 0: off (every weight trains)
  alpha: float = knob(16.0, "(0, inf)")  # the update is (alpha / rank) A B
  targets: tuple[str, ...] = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # projections with an adapter

  def check(self) -> None:
    from rl_lm.models.lora import INPUT_AXES

    bad = [t for t in self.targets if t not in INPUT_AXES]
    self.require(bool(self.targets) and not bad, "targets",
                 f"unknown projections {bad or list(self.targets)}; known: {', '.join(INPUT_AXES)}")


@dataclasses.dataclass(frozen=True)
class Model(Section):
  """The policy network: a preset, or a Hugging Face checkpoint."""

  KEY = "model"
  preset: str = "tiny"  # a name in rl_lm.models.presets
  hf_checkpoint: str = ""  # a Hugging Face directory; when set, its config and weights replace the preset
  dtype: str = knob("float32", DTYPES)  # compute dtype
  param_dtype: str = knob("float32", DTYPES)  # storage dtype of the parameters
  remat: bool = False  # rematerialise layers in the backward pass (saves memory)
  logit_chunk: int = knob(0, "[0, inf)")  # positions scored at a time, so [B, T, V] logits never exist whole
  #                                         (large vocabularies: 49k-152k); 0: the whole sequence at once
  lora: Lora = dataclasses.field(default_factory=Lora)

  def check(self) -> None:
    if self.hf_checkpoint:
      self.require(os.path.isfile(os.path.join(self.hf_checkpoint, "config.json")), "hf_checkpoint",
                   f"no config.json in {self.hf_checkpoint!r}")
    else:
      self.require(self.preset in presets.PRESETS, "preset",
                   f"unknown preset {self.preset!r}; known: {', '.join(presets.names())}")


@dataclasses.dataclass(frozen=True)
class Mesh(Section):
  """Device mesh axes (their product must be the device count: see rl_lm.config.cross)."""

  KEY = "mesh"
  data: int = -1  # data-parallel axis; -1 takes the devices the other axes leave
  fsdp: int = 1  # parameter-sharding axis
  tensor: int = 1  # tensor-parallel axis
  rules: tuple = ()  # ((logical, mesh axes), ...); empty: rl_lm.mesh.DEFAULT_RULES

  def check(self) -> None:
    sizes = {k: getattr(self, k) for k in MESH_AXES}
    for k, v in sizes.items():
      self.require(isinstance(v, int) and (v > 0 or v == -1), k, f"must be positive or -1, got {v!r}")
    free = [k for k, v in sizes.items() if v == -1]
    self.require(len(free) <= 1, free[-1] if free else "data", f"at most one axis may be -1, got {sizes}")
    for i, rule in enumerate(self.rules):
      self.require(isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str), f"rules[{i}]",
                   f"must be a (logical name, mesh axes) pair, got {rule!r}")
      axes = (rule[1],) if isinstance(rule[1], str) else tuple(rule[1] or ())
      for a in axes:
        self.require(a in MESH_AXES, f"rules[{i}]", f"unknown mesh axis {a!r}")


@dataclasses.dataclass(frozen=True)
class Sampling(Section):
  """How completions are drawn; rl_lm.sampling.SamplingConfig adds the tokenizer's stop and pad tokens."""

  KEY = "sampling"
  max_new_tokens: int = knob(32, "(0, inf)")  # completion budget N
  temperature: float = 1.0  # > 0 unless greedy
  top_k: int = knob(0, "[0, inf)")  # 0: off
  top_p: float = knob(1.0, "(0, 1]")  # 1.0: off
  greedy: bool = False
  cache_dtype: str = knob("", ("",) + DTYPES)  # KV-cache dtype; "" follows model.dtype
  # Keys [.., Dh, S] ("transposed": XLA:CPU's fast decode matmul) or [.., S, Dh] ("by_slot": a decode step writes a
  # row, not a column of tiles; TPU, GPU); "auto": by slot unless on a CPU (rl_lm/models/transformer.py, KVCache)
  key_layout: str = knob("auto", transformer.KEY_LAYOUTS)
  window: int = knob(64, "(0, inf)")  # decode attends over P + w, P + 2w, P + 4w, ... slots in turn (w >= N: all)
  slots: int = knob(0, "[0, inf)")  # > 0: continuous batching, this many cache rows refilled from the queue; 0: off

  def check(self) -> None:
    self.require(self.greedy or self.temperature > 0, "temperature",
                 f"must be > 0 unless greedy, got {self.temperature}")


@dataclasses.dataclass(frozen=True)
class Sample(Section):
  """The "sample" stage: draw completions for fixed prompts."""

  KEY, STAGES = "sample", ("sample",)
  prompts: tuple[str, ...] = ("12+7=", "3*(4+5)=", "Once upon a time")
  batch_size: int = knob(8, "(0, inf)")  # rows per generate call; prompts are cycled to fill it
  num_batches: int = knob(2, "(0, inf)")  # generate calls (the first one compiles)

  def check(self) -> None:
    self.require(len(self.prompts) > 0 and all(isinstance(p, str) and p for p in self.prompts), "prompts",
                 "must be a non-empty tuple of non-empty strings")
