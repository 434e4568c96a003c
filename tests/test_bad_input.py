"""Bad input stops `python -m rl_lm.main` with a non-zero status and one line naming the cause, never a traceback.

The battery lists every case in one place: configuration errors (caught before anything compiles,
exit 2; tests/test_config.py covers many more keys) and errors found while running (exit 1, the
traceback kept in <workdir>/error.log). Each case runs `rl_lm.main` in a subprocess that sees 8 fake
CPU devices (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.test_config import DEFAULT, ROOT, SAMPLE, _main

QUIET = ["--config.logging.wandb_mode=disabled"]
RL_ONLY = "--config.stages=('rl',)"

# (case, config, overrides, text the one line must contain, exit status). {tmp} is the case's own tmp folder.
BATTERY = [
  ("unknown key", SAMPLE, ["--config.model.nope=1"], "config.model.nope", 2),
  ("ill-typed key", DEFAULT, ["--config.rl.steps=abc"], "config.rl.steps", 2),
  ("negative learning rate", DEFAULT, [RL_ONLY, "--config.rl.learning_rate=-1"], "config.rl.learning_rate", 2),
  ("group size 0", DEFAULT, ["--config.rl.group_size=0"], "config.rl.group_size", 2),
  ("batch not divisible by the data axis", SAMPLE, ["--config.sample.batch_size=6"], "config.sample.batch_size", 2),
  ("completion budget beyond the model", SAMPLE, ["--config.sampling.max_new_tokens=100000"],
   "config.sampling.max_new_tokens", 2),
  ("unknown reward", DEFAULT, ["--config.reward.weights.helpfulness=1.0"], "helpfulness", 2),
  ("max prompt length below every prompt", DEFAULT, [RL_ONLY, "--config.rl.max_prompt_len=2"],
   "config.rl.max_prompt_len", 2),  # found when the trainer reads the task: still a configuration error
  ("missing data file", DEFAULT, [RL_ONLY, "--config.task.name=gsm8k", "--config.task.data_dir={tmp}/empty"],
   "{tmp}/empty/train.jsonl", 1),
  ("unsupported Hugging Face architecture", SAMPLE, ["--config.model.hf_checkpoint={tmp}/gpt2"], "GPT2LMHeadModel", 1),
  ("multi-process run without a coordinator", SAMPLE, ["--num_processes=2", "--process_id=0"],
   "--coordinator_address", 1),
]


def _prepare(tmp) -> None:
  (tmp / "empty").mkdir()
  (tmp / "tfds").mkdir()
  (tmp / "gpt2").mkdir()
  (tmp / "gpt2" / "config.json").write_text(json.dumps(
    {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 128, "n_embd": 64, "n_layer": 2}))


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
  def run(case):
    name, config, overrides, _, _ = case
    tmp = tmp_path_factory.mktemp(name.replace(" ", "_"))
    _prepare(tmp)
    args = [a.replace("{tmp}", str(tmp)) for a in overrides]
    return tmp, _main(f"--config={config}", f"--workdir={tmp}/run", *args, *QUIET)

  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("TFDS_DATA_DIR", str(tmp_path_factory.mktemp("no_tfds")))  # no prepared datasets to fall back on
    with ThreadPoolExecutor(2) as pool:
      return list(pool.map(run, BATTERY))


@pytest.mark.parametrize("i", range(len(BATTERY)), ids=[case[0] for case in BATTERY])
def test_bad_input_exits_with_one_line_naming_the_cause(battery, i):
  tmp, run = battery[i]
  _, _, _, cause, status = BATTERY[i]
  assert run.returncode != 0 and run.returncode == (status or run.returncode), run.stderr[-2000:]
  assert "Traceback" not in run.stderr, run.stderr[-2000:]
  lines = run.stderr.splitlines()
  assert len(lines) == 1, run.stderr[-2000:]
  assert lines[0].startswith("rl_lm: "), lines[0]
  assert cause.replace("{tmp}", str(tmp)) in lines[0], lines[0]
  if run.returncode == 1:  # found while running: the traceback is kept
    assert "Traceback" in (tmp / "run" / "error.log").read_text()


def test_corrupt_or_refused_checkpoint_folder_is_one_line(tmp_path):
  """A workdir whose checkpoint lost its files, and one holding checkpoints when resuming is turned off."""
  sft_only = [f"--config={DEFAULT}", f"--workdir={tmp_path}", "--config.stages=('sft',)", "--config.sft.steps=2",
              *QUIET]
  first = _main(*sft_only)
  assert first.returncode == 0, first.stderr[-2000:]
  folder = tmp_path / "checkpoints" / "sft"
  refused = _main(*sft_only, "--config.checkpoint.resume=False")
  assert refused.returncode == 1 and refused.stderr.splitlines() == [
    f"rl_lm: error: {folder} holds checkpoints (latest step 2) and config.checkpoint.resume is False: use a new "
    "--workdir or allow resuming"], refused.stderr[-2000:]
  for f in (folder / "2" / "params").rglob("*"):
    if f.is_file():
      f.write_bytes(b"not a checkpoint")
  corrupt = _main(*sft_only)
  assert corrupt.returncode == 1 and "Traceback" not in corrupt.stderr, corrupt.stderr[-2000:]
  [line] = corrupt.stderr.splitlines()
  assert line.startswith(f"rl_lm: error: cannot restore step 2 from {folder}"), line


def test_interrupt_exits_130_with_one_line(tmp_path):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.Popen(
    [sys.executable, "-m", "rl_lm.main", f"--config={SAMPLE}", f"--workdir={tmp_path}",
     "--config.sample.num_batches=100000", *QUIET], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    text=True)
  lines: queue.Queue[str] = queue.Queue()
  threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
  try:
    while "rl_lm: stage sample" not in lines.get(timeout=120):  # running (the interrupt lands after compiling)
      pass
    proc.send_signal(signal.SIGINT)
    status = proc.wait(timeout=60)
  finally:
    proc.kill()
  err = proc.stderr.read()
  assert status == 130, err[-2000:]
  assert err.splitlines() == [f"rl_lm: interrupted (traceback in {tmp_path}/error.log)"], err[-2000:]
  assert "KeyboardInterrupt" in (tmp_path / "error.log").read_text()


# How main reports what it does not expect: in process, without running anything.


class _NonFinite(RuntimeError):
  user_facing = True


@pytest.mark.parametrize(("error", "status", "line"), [
  (RuntimeError("boom\nsecond line"), 1, "rl_lm: error: RuntimeError: boom ... (traceback in {log})"),
  (_NonFinite("training stopped after 5 non-finite steps"), 1,
   "rl_lm: error: training stopped after 5 non-finite steps"),
  (FileNotFoundError(2, "No such file or directory", "data/x.jsonl"), 1,
   "rl_lm: error: [Errno 2] No such file or directory: 'data/x.jsonl'"),
  (KeyboardInterrupt(), 130, "rl_lm: interrupted (traceback in {log})"),
])
def test_report(tmp_path, capsys, error, status, line):
  from rl_lm import main

  try:
    raise error
  except BaseException as e:  # noqa: BLE001
    got = main._report(e, str(tmp_path / "w"))
  log = tmp_path / "w" / "error.log"
  assert got == status
  assert capsys.readouterr().err.splitlines() == [line.format(log=log)]
  assert type(error).__name__ in log.read_text() and "Traceback" in log.read_text()


def test_runtime_config_error_is_reported_as_a_configuration_error(tmp_path, capsys):
  from rl_lm import main
  from rl_lm.config import ConfigError

  assert main._report(ConfigError("config.rl.max_prompt_len", "no prompt fits"), str(tmp_path)) == 2
  assert capsys.readouterr().err == "rl_lm: invalid configuration: config.rl.max_prompt_len: no prompt fits\n"
