"""The configuration schema shared by every `configs/*.py`, and its validation.

`base_config()` returns every field with its default and a comment; a config file starts from it
and changes what its experiment needs. `validate(config)` runs before anything is compiled and
raises `ConfigError` naming the offending key.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import ml_collections

from rl_lm.models import presets

STAGES = ("sample",)  # grows with the trainers: sft, reward_model, dpo, rl
DTYPES = ("float32", "bfloat16")


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
    _require(bool(config.model.hf_checkpoint), "config.tokenizer", "'hf' needs config.model.hf_checkpoint")


# Section checks in order; the stage checks run only for stages the run includes.
CHECKS: list[Callable[[Any, int], None]] = [_check_top, _check_model, _check_mesh, _check_sampling]
STAGE_CHECKS: dict[str, Callable[[Any, int], None]] = {"sample": _check_sample_stage}


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises ConfigError (naming the key) for any impossible value. Compiles nothing."""
  if num_devices is None:
    import jax

    num_devices = jax.device_count()
  for check in CHECKS:
    check(config, num_devices)
  for stage in dict.fromkeys(config.stages):
    STAGE_CHECKS[stage](config, num_devices)


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
