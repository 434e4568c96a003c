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
GSM8K = [RL_ONLY, "--config.task.name=gsm8k"]

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
  # The config file itself (its traceback, when it ran, goes to error.log too).
  ("config file that exits 0 at import", "{tmp}/exits.py", [],
   "{tmp}/exits.py:3: the config file exited at import with status 0 (traceback in {tmp}/run/error.log)", 2),
  ("get_config returning a plain dict", "{tmp}/plain_dict.py", [],
   "{tmp}/plain_dict.py: get_config() must return an ml_collections.ConfigDict, got dict", 2),
  ("get_config raising", "{tmp}/raises.py:variant", [], "{tmp}/raises.py:3: KeyError: 'variant'", 2),
  ("syntax error in the config file", "{tmp}/syntax.py", [], "{tmp}/syntax.py:2: SyntaxError:", 2),
  # Data files: the file, the line, the field.
  ("GSM8K line that is not JSON", DEFAULT, [*GSM8K, "--config.task.data_dir={tmp}/gsm8k_bad_json"],
   "rl_lm: error: {tmp}/gsm8k_bad_json/train.jsonl:2: not valid JSON (Expecting value at column 29)", 1),
  ("empty GSM8K file", DEFAULT, [*GSM8K, "--config.task.data_dir={tmp}/gsm8k_empty"],
   "rl_lm: error: {tmp}/gsm8k_empty/train.jsonl holds no problems", 1),
  ("GSM8K line without an answer", DEFAULT, [*GSM8K, "--config.task.data_dir={tmp}/gsm8k_no_answer"],
   "{tmp}/gsm8k_no_answer/train.jsonl:2: missing field 'answer'", 1),
  ("HumanEval line without a solution", DEFAULT,
   [RL_ONLY, "--config.task.name=humaneval", "--config.task.data_dir={tmp}/humaneval"],
   "{tmp}/humaneval/HumanEval.jsonl:2: missing field 'canonical_solution'", 1),
  ("preference pair that is not JSON", DEFAULT,
   ["--config.stages=('dpo',)", "--config.preferences.source={tmp}/pairs.jsonl"],
   "{tmp}/pairs.jsonl:2: not valid JSON", 1),
  ("garbage tokenizer.json", SAMPLE, ["--config.model.hf_checkpoint={tmp}/hf", "--config.tokenizer=hf"],
   "rl_lm: error: {tmp}/hf/tokenizer.json: not a readable Hugging Face tokenizer file (stream did not contain valid "
   "UTF-8)", 1),
  ("garbage config.json of a Hugging Face checkpoint", SAMPLE, ["--config.model.hf_checkpoint={tmp}/hf_bad_config"],
   "rl_lm: error: {tmp}/hf_bad_config/config.json: not valid JSON", 1),
]


GOOD_GSM8K = json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}) + "\n"
GOOD_HUMANEVAL = json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "  return 1\n",
                             "test": "def check(f):\n  assert f() == 1\n", "entry_point": "f"}) + "\n"
FILES = {  # what _prepare writes in each case's tmp folder
  "exits.py": '"""Exits at import."""\nimport sys\nsys.exit(0)\n',
  "plain_dict.py": "def get_config():\n  return {'seed': 0, 'logging': {'wandb_mode': 'disabled'}}\n",
  "raises.py": "def get_config(arg):\n  variants = {}\n  return variants[arg]\n",
  "syntax.py": "def get_config():\n  return dict(seed=0\n",
  "gsm8k_bad_json/train.jsonl": GOOD_GSM8K + '{"question": "x", "answer": \n',
  "gsm8k_empty/train.jsonl": "",
  "gsm8k_no_answer/train.jsonl": GOOD_GSM8K + json.dumps({"question": "What is 3+3?"}) + "\n",
  "humaneval/HumanEval.jsonl": GOOD_HUMANEVAL + json.dumps({"task_id": "HumanEval/1", "prompt": "def g():\n"}) + "\n",
  "pairs.jsonl": json.dumps({"prompt": "a:", "chosen": "ab", "rejected": "xx"}) + "\n{oops\n",
  "hf_bad_config/config.json": b"\xff\xfe{not json",
  "gpt2/config.json": json.dumps(
    {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 128, "n_embd": 64, "n_layer": 2}),
}


def _prepare(tmp) -> None:
  (tmp / "empty").mkdir()
  (tmp / "tfds").mkdir()
  for name, content in FILES.items():
    (tmp / name).parent.mkdir(exist_ok=True)
    (tmp / name).write_bytes(content if isinstance(content, bytes) else content.encode())
  _write_hf_checkpoint(tmp / "hf")
  (tmp / "hf" / "tokenizer.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe not a tokenizer")


def _write_hf_checkpoint(folder) -> None:
  """A Llama checkpoint of the `test` preset (zero weights): it loads without compiling anything."""
  import numpy as np

  from rl_lm.models import hf, presets, transformer

  def zeros(tree):
    return {k: zeros(v) if isinstance(v, dict) else np.zeros(v, np.float32) for k, v in tree.items()}

  cfg = presets.PRESETS["test"]
  hf.save(str(folder), cfg, zeros(transformer.param_shapes(cfg)))


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
  def run(case):
    name, config, overrides, _, _ = case
    tmp = tmp_path_factory.mktemp(name.replace(" ", "_"))
    _prepare(tmp)
    args = [a.replace("{tmp}", str(tmp)) for a in overrides]
    return tmp, _main(f"--config={config.replace('{tmp}', str(tmp))}", f"--workdir={tmp}/run", *args, *QUIET)

  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("TFDS_DATA_DIR", str(tmp_path_factory.mktemp("no_tfds")))  # no prepared datasets to fall back on
    with ThreadPoolExecutor(2) as pool:
      return list(pool.map(run, BATTERY))


@pytest.mark.parametrize("i", range(len(BATTERY)), ids=[case[0] for case in BATTERY])
def test_bad_input_exits_with_one_line_naming_the_cause(battery, i):
  tmp, run = battery[i]
  _, config, _, cause, status = BATTERY[i]
  assert run.returncode != 0 and run.returncode == (status or run.returncode), run.stderr[-2000:]
  assert "Traceback" not in run.stderr + run.stdout, run.stderr[-2000:]
  lines = run.stderr.splitlines()
  assert len(lines) == 1, run.stderr[-2000:]
  assert lines[0].startswith("rl_lm: "), lines[0]
  assert cause.replace("{tmp}", str(tmp)) in lines[0], lines[0]
  if config.startswith("{tmp}"):  # the config file's own fault: nothing else ran, nothing else was said
    assert run.stdout == "", run.stdout[-2000:]
  if run.returncode == 1 or "(traceback in" in lines[0]:  # found while running, or the config file's code: kept
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
  """Ctrl-C during sampling. The signal is sent once the first batch is out: before, the process may be inside
  an XLA compilation, which no signal interrupts (its end, not the handling, would be timed). Where in Python
  the signal lands is left to chance: the test below pins the case that used to lose it."""
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.Popen(
    [sys.executable, "-m", "rl_lm.main", f"--config={SAMPLE}", f"--workdir={tmp_path}",
     "--config.sample.num_batches=100000", *QUIET], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    text=True)
  lines: queue.Queue[str] = queue.Queue()
  threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
  try:
    while not lines.get(timeout=120).startswith("rl_lm: batch 1/"):  # compiled and sampling
      pass
    proc.send_signal(signal.SIGINT)
    status = proc.wait(timeout=60)
  finally:
    proc.kill()
  err = proc.stderr.read()
  assert status == 130, err[-2000:]
  assert err.splitlines() == [f"rl_lm: interrupted (traceback in {tmp_path}/error.log)"], err[-2000:]
  assert "KeyboardInterrupt" in (tmp_path / "error.log").read_text()


# A KeyboardInterrupt raised where Python discards exceptions (a garbage-collector callback: JAX runs one at every
# collection) used to be lost, and the run went on. Each script prints what happened; run in a subprocess, since a
# stray KeyboardInterrupt would stop pytest itself.
_DISCARDED = """
import gc, signal, sys, time
from rl_lm.interrupts import Interrupts
if sys.argv[1] == "handled":
  Interrupts().install()
else:  # Python's own handler, even where SIGINT came in ignored (a job started with `&` by a script)
  signal.signal(signal.SIGINT, signal.default_int_handler)
fired = []
def callback(phase, info):
  if phase == "stop" and not fired:
    fired.append(True)
    signal.raise_signal(signal.SIGINT)  # handled right here, inside the callback
gc.callbacks.append(callback)
try:
  gc.collect()
  for _ in range(200):  # the run goes on (2 s at most)
    time.sleep(0.01)
except KeyboardInterrupt:
  print("raised")
else:
  print("lost")
"""
_TWICE = """
import signal, time
from rl_lm.interrupts import Interrupts
Interrupts().install()
try:
  signal.raise_signal(signal.SIGINT)
except KeyboardInterrupt:
  signal.raise_signal(signal.SIGINT)  # while the run winds down: leave at once
  time.sleep(60)
"""


def _python(script: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                        capture_output=True, text=True, timeout=60)


def test_an_interrupt_discarded_in_a_gc_callback_is_raised_again():
  plain, handled = _python(_DISCARDED, "plain"), _python(_DISCARDED, "handled")
  assert plain.stdout == "lost\n" and "Exception ignored" in plain.stderr  # Python's own behaviour: the cause
  assert handled.stdout == "raised\n" and handled.stderr == "", handled.stderr


def test_a_second_interrupt_leaves_at_once():
  run = _python(_TWICE)
  assert run.returncode == 130 and run.stderr == "rl_lm: interrupted again: stopped at once\n", run.stderr


# Loaders, in process: what the battery does not reach.


def test_humaneval_file_errors_name_the_file(tmp_path):
  from rl_lm.tasks.base import DataError
  from rl_lm.tasks.humaneval import HumanEvalTask, load_humaneval

  (tmp_path / "HumanEval.jsonl.gz").write_bytes(b"not gzip")
  with pytest.raises(DataError, match="HumanEval.jsonl.gz: not a readable gzip file"):
    HumanEvalTask(data_dir=tmp_path).test_problems()
  (tmp_path / "empty.jsonl").write_text("\n")
  with pytest.raises(DataError, match="empty.jsonl holds no problems"):
    load_humaneval(tmp_path / "empty.jsonl")
  with pytest.raises(FileNotFoundError, match="no HumanEval file in"):
    HumanEvalTask(data_dir=tmp_path / "none")


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
  from rl_lm import errors

  try:
    raise error
  except BaseException as e:  # noqa: BLE001
    got = errors.report(e, str(tmp_path / "w"))
  log = tmp_path / "w" / "error.log"
  assert got == status
  assert capsys.readouterr().err.splitlines() == [line.format(log=log)]
  assert type(error).__name__ in log.read_text() and "Traceback" in log.read_text()


def test_runtime_config_error_is_reported_as_a_configuration_error(tmp_path, capsys):
  from rl_lm import errors
  from rl_lm.config import ConfigError

  assert errors.report(ConfigError("config.rl.max_prompt_len", "no prompt fits"), str(tmp_path)) == 2
  assert capsys.readouterr().err == "rl_lm: invalid configuration: config.rl.max_prompt_len: no prompt fits\n"
