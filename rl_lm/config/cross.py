"""The rules that need more than one section (or the device count), for the stages the run includes."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from typing import Any

import ml_collections

from rl_lm.config.run import MESH_AXES
from rl_lm.config.section import ConfigError
from rl_lm.models import presets


def _require(ok: bool, key: str, message: str) -> None:
  if not ok:
    raise ConfigError(key, message)


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


def check_finite(config: Any, allow_inf: frozenset[str]) -> None:
  """Every float in the config, any section, is a number (NaN never is) and finite; those in `allow_inf` may be +inf."""
  for key, value in _numbers(config, ""):
    ok = math.isfinite(value) or (key in allow_inf and value == math.inf)
    _require(ok, f"config.{key}", f"must be a finite number, got {value}")


def data_parallelism(config: Any, num_devices: int) -> int:
  """How many ways the batch axis is split: the product of the mesh axes that 'batch' maps to."""
  sizes = {k: config.mesh[k] for k in MESH_AXES}
  fixed = math.prod(v for v in sizes.values() if v != -1)
  sizes = {k: (num_devices // fixed if v == -1 else v) for k, v in sizes.items()}
  rules = dict(config.mesh.rules) if config.mesh.rules else {"batch": ("data", "fsdp")}
  axes = rules.get("batch", ())
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  return math.prod(sizes[a] for a in axes)


def _check_mesh(config: Any, num_devices: int) -> None:
  sizes = {k: config.mesh[k] for k in MESH_AXES}
  free = [k for k, v in sizes.items() if v == -1]
  fixed = math.prod(v for v in sizes.values() if v != -1)
  if free:
    _require(num_devices % fixed == 0, f"config.mesh.{free[0]}",
             f"{num_devices} devices cannot be split by the other axes {sizes}")
  else:
    _require(fixed == num_devices, "config.mesh", f"data*fsdp*tensor = {fixed} does not match the {num_devices} "
             "devices; set one axis to -1 to fill the rest")


def check(config: Any, num_devices: int) -> None:
  """Raises ConfigError for a rule between sections that the run breaks."""
  stages, c = config.stages, config
  _check_mesh(c, num_devices)
  _require(c.tokenizer != "hf" or bool(c.model.hf_checkpoint), "config.model.hf_checkpoint",
           "required by config.tokenizer='hf' (the tokenizer is read from the checkpoint)")
  _require(c.task.template != "chat" or c.tokenizer == "hf", "config.task.template",
           "'chat' frames prompts with a checkpoint's chat template: needs config.tokenizer='hf'")
  dp = data_parallelism(c, num_devices)
  max_len = math.inf if c.model.hf_checkpoint else presets.get(c.model.preset).max_seq_len
  rows = {}  # key -> batch rows that the data-parallel axes split
  lengths = {}  # key -> (what, tokens) that must fit the model
  if "sample" in stages:
    longest = max(len(p) for p in c.sample.prompts) + (1 if c.tokenizer == "char" else 0)
    rows["config.sample.batch_size"] = c.sample.batch_size
    lengths["config.sampling.max_new_tokens"] = (f"longest prompt ({longest}) + max_new_tokens",
                                                 longest + c.sampling.max_new_tokens)
  if "sft" in stages or "teacher_sft" in stages:
    rows["config.sft.batch_size"] = c.sft.batch_size
    lengths["config.sft.max_len"] = ("sft.max_len", c.sft.max_len)
  for stage in ("reward_model", "dpo"):
    if stage in stages:
      p = c.preferences
      _require(p.source != "synthetic" or c.task.name == "preferences", "config.preferences.source",
               f"synthetic pairs come from task 'preferences', but config.task.name is {c.task.name!r}")
      rows[f"config.{stage}.batch_size"] = c[stage].batch_size
      _require(p.labeller != "judge" or bool(c.judge.init_from or c.judge.hf_checkpoint),
               "config.preferences.labeller", "'judge' labels the pairs with config.judge: set judge.init_from or "
               "judge.hf_checkpoint")
      lengths["config.preferences.max_len"] = ("preferences.max_len", p.max_len)
  if "rl" in stages:
    r = c.rl
    _require(not c.sampling.greedy, "config.sampling.greedy",
             "RL needs sampled completions (greedy ones have no log-prob ratio and every group zero variance)")
    earlier = stages[:stages.index("rl")]
    _require(not c.reward.learned or "reward_model" in earlier or bool(c.reward.model_checkpoint),
             "config.reward.learned", "needs a reward_model stage before rl, or config.reward.model_checkpoint")
    rows["config.rl.prompts_per_step"] = r.prompts_per_step * r.group_size  # rows per step
    rows["config.rl.grad_accum"] = r.prompts_per_step * r.group_size // (r.minibatches * r.grad_accum)  # micro-batch
    rows["config.rl.prepare_chunks"] = r.prompts_per_step * r.group_size // r.prepare_chunks  # rows per chunk
    rows["config.eval.rows"] = c.eval.rows
    lengths["config.rl.max_prompt_len"] = ("max_prompt_len + sampling.max_new_tokens",
                                           r.max_prompt_len + c.sampling.max_new_tokens)
    if c.env.name:
      lengths["config.env.max_tokens"] = ("env.max_tokens", c.env.max_tokens)
    _require(not r.distill.coef or bool(c.teacher.init_from or c.teacher.hf_checkpoint), "config.teacher.init_from",
             "rl.distill.coef > 0 distils towards a teacher: set teacher.init_from or teacher.hf_checkpoint")
    judged = [n for n in c.reward.weights if n in ("judge", "judge_pairwise")]
    _require(not judged or bool(c.judge.init_from or c.judge.hf_checkpoint), "config.judge.init_from",
             f"reward {judged[0] if judged else ''!r} needs a judge: set judge.init_from or judge.hf_checkpoint")
    if judged:
      rows["config.judge.rows"] = c.judge.rows
    _require(not judged or not c.env.name, f"config.reward.weights.{judged[0] if judged else ''}",
             "the judge scores single-turn completions; an environment scores its own episodes")
    _require(r.distill.on_policy == 1.0 or not c.env.name, "config.rl.distill.on_policy", "the teacher samples "
             "single-turn completions only: multi-turn episodes are the student's (set on_policy = 1)")
  if "teacher_sft" in stages:
    _require(bool(c.teacher.init_from or c.teacher.hf_checkpoint), "config.teacher.init_from",
             "the teacher_sft stage trains on a teacher's samples: set teacher.init_from or teacher.hf_checkpoint")
    rows["config.eval.rows"] = c.eval.rows  # the teacher samples in batches of eval.rows
  if c.sampling.slots:
    rows["config.sampling.slots"] = c.sampling.slots
  for key, n in rows.items():
    _require(n % dp == 0, key, f"{n} rows are not divisible by the {dp}-way data-parallel mesh axes")
  for key, (what, n) in lengths.items():
    _require(n <= max_len, key, f"{what} = {n} exceeds the model's max_seq_len {max_len}")
