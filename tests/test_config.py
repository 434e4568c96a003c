"""Bad configurations stop `rl_lm.main` before anything compiles, with one message naming the key."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rl_lm import config as config_lib

ROOT = Path(__file__).resolve().parents[1]

# (overrides, text the one-line message must contain). The subprocess sees 8 fake devices (conftest).
BAD = [
  (["--config.model.nope=1"], "config.model.nope"),  # unknown key
  (["--config.sampling.temperature=abc"], "config.sampling.temperature"),  # wrong type
  (["--config.sample.batch_size=2.5"], "config.sample.batch_size"),  # wrong type
  (["--config.model.preset=gpt-5"], "config.model.preset"),
  (["--config.model.dtype=float16"], "config.model.dtype"),
  (["--config.mesh.data=3"], "config.mesh"),  # 3 devices asked, 8 present
  (["--config.mesh.fsdp=0"], "config.mesh.fsdp"),
  (["--config.mesh.data=-1", "--config.mesh.fsdp=-1"], "config.mesh"),
  (["--config.sample.batch_size=6"], "config.sample.batch_size"),  # not divisible by the 8-way data axis
  (["--config.sampling.max_new_tokens=0"], "config.sampling.max_new_tokens"),  # non-positive length
  (["--config.sampling.max_new_tokens=100000"], "config.sampling.max_new_tokens"),  # beyond max_seq_len
  (["--config.sampling.top_p=1.5"], "config.sampling.top_p"),
  (["--config.sampling.temperature=0.0"], "config.sampling.temperature"),
  (["--config.stages=('sample','fly')"], "config.stages[1]"),
  (["--config.seed=-1"], "config.seed"),
  (["--config.model.hf_checkpoint=does/not/exist"], "config.model.hf_checkpoint"),
  (["--config.tokenizer=hf"], "config.tokenizer"),
  (["--config.mesh.rules=(('batch','pipeline'),)"], "config.mesh.rules[0]"),
]


def _main(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, "-m", "rl_lm.main", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("bad"))
  with ThreadPoolExecutor(2) as pool:
    runs = list(pool.map(lambda o: _main("--config=configs/default.py:smoke", f"--workdir={workdir}", *o[0]), BAD))
  return dict(zip(range(len(BAD)), runs, strict=True))


@pytest.mark.parametrize("i", range(len(BAD)), ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_exits_with_one_clear_message(bad_runs, i):
  run, (_, key) = bad_runs[i], BAD[i]
  assert run.returncode != 0
  lines = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
  assert len(lines) == 1, run.stderr  # no traceback
  assert key in lines[0], lines[0]
  assert "rl_lm: stage" not in run.stdout  # stopped before running anything


def test_unknown_variant_and_missing_workdir(tmp_path):
  run = _main("--config=configs/default.py:bogus", f"--workdir={tmp_path}")
  assert run.returncode != 0 and "bogus" in run.stderr and "Traceback" not in run.stderr
  run = _main("--config=configs/default.py:smoke")
  assert run.returncode != 0 and "--workdir" in run.stderr


def test_every_config_file_parses_and_validates():
  import importlib.util

  for path in sorted((ROOT / "configs").glob("*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config_lib.validate(module.get_config(), num_devices=1)


def test_validate_names_the_key_in_process():
  config = config_lib.base_config()
  config.sampling.top_k = -2
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(config, num_devices=1)
  assert e.value.key == "config.sampling.top_k"
