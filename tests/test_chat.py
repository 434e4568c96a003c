"""Chat templates: rl_lm.chat renders the checkpoint's own template token for token as transformers'
`apply_chat_template` does (SmolLM2, Qwen2.5, Llama 3), stops on its end of turn, and is sandboxed; its render
worker is replaced after a kill, serves threads, and is its own in a pickled copy, a fork (hostile templates:
tests/test_untrusted_checkpoints.py)."""

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rl_lm.chat import ChatTemplate, ChatTemplateError
from rl_lm.chat_worker import RenderLimits
from rl_lm.tokenizer import HFTokenizer, TokenizerError

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CONVERSATIONS = [
  [{"role": "user", "content": "What is 12 + 34?"}],
  [{"role": "system", "content": "You answer with a number."}, {"role": "user", "content": "What is 12 + 34?"}],
  [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
   {"role": "assistant", "content": "Hello! How can I help?"},
   {"role": "user", "content": "  Ünïcødé 😀 中文\n\ttabs  "}],
  [{"role": "user", "content": "Write code."}, {"role": "assistant", "content": "```python\nprint(1)\n```"}],
]


def folder_with(smollm2_folder: Path, tmp: Path, template: str | None, specials: list[str] = (),
                bos: str | None = None, eos: str = "<|im_end|>") -> Path:
  """A tokenizer folder: SmolLM2's vocabulary (plus `specials`) under another chat template."""
  from tokenizers import AddedToken, Tokenizer

  tok = Tokenizer.from_file(str(smollm2_folder / "tokenizer.json"))
  tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
  tmp.mkdir(parents=True, exist_ok=True)
  tok.save(str(tmp / "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": eos,
            "add_bos_token": False, "clean_up_tokenization_spaces": False}
  if template is not None:
    config["chat_template"] = template
  (tmp / "tokenizer_config.json").write_text(json.dumps(config))
  return tmp


def _ids(result) -> list[int]:
  return list(result["input_ids"] if hasattr(result, "keys") else result)


def cases(smollm2_folder, tmp_path):
  yield "smollm2", smollm2_folder
  yield "qwen2.5", folder_with(smollm2_folder, tmp_path / "qwen", (TEMPLATES / "qwen2.5-instruct.jinja").read_text())
  yield "llama-3", folder_with(smollm2_folder, tmp_path / "llama", (TEMPLATES / "llama-3-instruct.jinja").read_text(),
                               LLAMA3_SPECIALS, bos="<|begin_of_text|>", eos="<|eot_id|>")


def test_rendering_and_tokens_equal_transformers_apply_chat_template(smollm2_folder, tmp_path):
  from transformers import AutoTokenizer

  for name, folder in cases(smollm2_folder, tmp_path):
    theirs = AutoTokenizer.from_pretrained(str(folder))
    ours = HFTokenizer(str(folder), chat=True)
    for messages in CONVERSATIONS:
      for gen in (True, False):
        want_text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        assert ours.chat.render(messages, add_generation_prompt=gen) == want_text, (name, messages, gen)
        want = _ids(theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen))
        assert ours.encode(ours.chat.render(messages, add_generation_prompt=gen)) == want, (name, messages, gen)
    # A task's prompt is one user turn and the generation prompt, tokenized as transformers does.
    user = [{"role": "user", "content": "What is 3+4?"}]
    assert ours.encode_prompt("What is 3+4?") == _ids(theirs.apply_chat_template(user, add_generation_prompt=True))


def test_system_messages_and_the_generation_prompt(smollm2_folder):
  chat = HFTokenizer(str(smollm2_folder), chat=True).chat
  default = chat.prompt("Hi")
  assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # the template's own
  assert default.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  assert chat.prompt("Hi", system="Answer in French.") == (
    "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  assert not chat.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith("assistant\n")


def test_stop_ids_are_the_end_of_turn_tokens(smollm2_folder, tmp_path):
  smol = HFTokenizer(str(smollm2_folder), chat=True)
  assert smol.stop_ids == (2,) and smol._tok.id_to_token(2) == "<|im_end|>"
  llama = HFTokenizer(str(folder_with(smollm2_folder, tmp_path, (TEMPLATES / "llama-3-instruct.jinja").read_text(),
                                      LLAMA3_SPECIALS, bos="<|begin_of_text|>", eos="<|end_of_text|>")), chat=True)
  eot = llama._tok.token_to_id("<|eot_id|>")
  assert llama.stop_ids == (llama.eos_id, eot) and eot != llama.eos_id  # eos, and the template's end of turn
  ids = llama.encode("The answer is 7") + [eot] + llama.encode(" junk")
  assert llama.decode(ids) == "The answer is 7"  # decoding stops at the end of turn
  plain = HFTokenizer(str(smollm2_folder))
  assert plain.chat is None and plain.stop_ids == (2,)
  assert plain.encode_prompt("3+4=") == plain.encode("3+4=")  # add_bos_token is false: no <|im_start|> in front


def test_a_missing_template_is_one_line_naming_the_file(smollm2_folder, tmp_path):
  folder = folder_with(smollm2_folder, tmp_path, None)
  with pytest.raises(TokenizerError, match=r"tokenizer_config.json: no chat_template"):
    HFTokenizer(str(folder), chat=True)
  (folder / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
  assert HFTokenizer(str(folder), chat=True).chat.prompt("x") == "[x]"  # the separate file, as transformers saves it


def test_templates_are_sandboxed_and_their_errors_are_clear():
  with pytest.raises(ChatTemplateError, match="does not compile"):
    ChatTemplate("{% for m in messages %}")
  escape = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
  with pytest.raises(ChatTemplateError, match="failed to render"):
    escape.render([])
  mutate = ChatTemplate("{% set _ = messages.append({'role': 'x'}) %}{{ messages | length }}")
  messages = [{"role": "user", "content": "hi"}]
  with pytest.raises(ChatTemplateError):
    mutate.render(messages)
  assert messages == [{"role": "user", "content": "hi"}]
  refuse = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
  with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
    refuse.render(messages)
  assert ChatTemplate("{{ messages[0] | tojson }}").render([{"role": "user", "content": "é"}]) == (
    '{"role": "user", "content": "é"}')  # non-ASCII kept, as transformers' tojson does


def test_tasks_take_the_chat_template(smollm2_folder):
  from rl_lm.tasks import make_task

  tok = HFTokenizer(str(smollm2_folder), chat=True)
  arith = make_task("arithmetic", levels=(1,), template="chat")
  p = next(arith.train_problems(1))
  assert p.prompt.startswith("What is ") and "<|" not in p.prompt  # the user turn's text; the tokenizer frames it
  ids = tok.encode_prompt(p.prompt)
  framed = tok._tok.decode(ids, skip_special_tokens=False)
  assert framed.endswith(f"user\n{p.prompt}<|im_end|>\n<|im_start|>assistant\n")
  gsm = make_task("gsm8k", template="chat").test_problems(1)[0]
  assert gsm.prompt.startswith(gsm.metadata["question"]) and "####" in gsm.prompt
  from rl_lm.rewards.code import build_program

  humaneval = make_task("humaneval", template="chat").test_problems(1)[0]
  assert "```python\n" in humaneval.prompt and humaneval.metadata["prompt"] in humaneval.prompt
  # The reply's fenced function runs after the prompt's imports, not after the chat request.
  reply = "Here it is:\n```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
  program = build_program(humaneval, reply)
  assert program.startswith("from typing import List") and "Complete the following" not in program


# --- the render worker: limits, restarts, pickling, forks, threads -------------------------------------------

SPIN = ("{% if messages[0]['content'] == 'spin' %}{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}"
        "{% endfor %}{% endif %}[{{ messages[0]['content'] }}]")


def _user(text: str) -> list[dict]:
  return [{"role": "user", "content": text}]


def _state(pid: int) -> str:
  """The process state letter of `pid` ('Z' a zombie), '' when it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0]
  except FileNotFoundError:
    return ""


def test_errors_name_the_file_the_template_came_from(smollm2_folder, tmp_path):
  folder = folder_with(smollm2_folder, tmp_path / "a", "{{ 'x' | center(20000000) }}")
  with pytest.raises(ChatTemplateError, match=rf"^{re.escape(str(folder / 'tokenizer_config.json'))}: chat template "
                     r"output exceeds 8388608 bytes; stopped$"):
    HFTokenizer(str(folder), chat=True)
  folder = folder_with(smollm2_folder, tmp_path / "b", None)
  (folder / "chat_template.jinja").write_text("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
  with pytest.raises(ChatTemplateError, match=rf"^{re.escape(str(folder / 'chat_template.jinja'))}: chat template "
                     r"recursed too deeply to render$"):
    HFTokenizer(str(folder), chat=True)
  with pytest.raises(ChatTemplateError, match=r"^x.jinja: chat template does not compile: .*'endfor'"):
    ChatTemplate("{% for m in messages %}", origin="x.jinja")
  with pytest.raises(ValueError, match="RenderLimits.timeout_s must be positive"):
    RenderLimits(timeout_s=0)


def test_a_worker_killed_for_time_or_from_outside_is_replaced():
  template = ChatTemplate(SPIN, limits=RenderLimits(timeout_s=2.0))
  assert template.render(_user("ok")) == "[ok]"
  first = template._worker._proc.pid
  with pytest.raises(ChatTemplateError, match=r"^chat template took more than 2 s to render; stopped$"):
    template.render(_user("spin"))
  assert _state(first) == "" and template._worker._proc is None  # killed and reaped
  assert template.render(_user("again")) == "[again]"  # a fresh worker
  second = template._worker._proc.pid
  os.kill(second, signal.SIGKILL)  # the OOM killer, say, between two calls
  deadline = time.monotonic() + 30
  while _state(second) != "Z" and time.monotonic() < deadline:
    time.sleep(0.01)
  assert template.render(_user("after")) == "[after]" and template._worker._proc.pid not in (first, second)
  assert _state(second) == ""  # reaped when replaced
  template.close()


def test_concurrent_renders_from_threads_get_their_own_answers():
  template = ChatTemplate("{% for m in messages %}<{{ m['content'] }}>{% endfor %}")
  texts = [f"thread {t} call {i} " + "é" * (i * 997 % 50000) for t in range(4) for i in range(25)]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    got = list(pool.map(lambda text: template.render(_user(text)), texts))
  assert got == [f"<{text}>" for text in texts]
  with pytest.raises(ChatTemplateError, match="does not pickle"):
    template.render(_user("x"), tools=[lambda: 1])
  assert template.render(_user("still")) == "<still>"


_COPIES = textwrap.dedent("""
  import os, pickle, sys, threading, time
  from rl_lm.chat import ChatTemplate

  template = ChatTemplate(sys.argv[1])
  hi = [{"role": "user", "content": "hi"}]
  mine = (template.render(hi), template._worker._proc.pid)
  clone = pickle.loads(pickle.dumps(template))
  print("clone", clone.render(hi) == mine[0], clone._worker._proc.pid != mine[1])
  read, write = os.pipe()
  child = os.fork()
  if child == 0:  # the fork renders with a worker of its own, and leaves the parent's alone
    os.write(write, f"{template.render(hi) == mine[0]} {template._worker._proc.pid != mine[1]}".encode())
    os._exit(0)
  os.waitpid(child, 0)
  print("fork", os.read(read, 100).decode(), (template.render(hi), template._worker._proc.pid) == mine)
  spin = ChatTemplate(sys.argv[2])
  pid = spin._worker._proc.pid
  cpu = lambda: sum(map(int, open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[11:13]))  # clock ticks
  idle = cpu()
  threading.Thread(target=spin.render, args=([{"role": "user", "content": "spin"}],), daemon=True).start()
  deadline = time.monotonic() + 30
  while cpu() < idle + 20 and time.monotonic() < deadline:  # rendering, not reading its pipe
    time.sleep(0.01)
  print("busy", pid, flush=True)
  os._exit(0)  # no clean-up: the busy worker must notice its parent is gone
""")


def test_pickled_and_forked_copies_use_their_own_workers_and_orphans_exit():
  run = subprocess.run([sys.executable, "-c", _COPIES, "[{{ messages[0]['content'] }}]", SPIN],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-3000:]
  lines = run.stdout.splitlines()
  assert lines[:2] == ["clone True True", "fork True True True"], run.stdout
  busy = int(lines[2].split()[1])
  deadline = time.monotonic() + 60
  try:
    while _state(busy) not in ("", "Z") and time.monotonic() < deadline:
      time.sleep(0.05)
    assert _state(busy) in ("", "Z"), "an orphaned worker went on rendering"
  finally:
    if _state(busy) not in ("", "Z"):
      os.kill(busy, signal.SIGKILL)
