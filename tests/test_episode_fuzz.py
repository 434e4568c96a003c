"""Nothing the policy writes can crash the trainer (issue 33): hostile text through the tools, the framing and the
episode runner (rl_lm/envs/tools.py, rl_lm/envs/episodes.py, the rule in rl_lm/envs/failures.py).

The bulk is a seeded fuzz: random bytes (decoded as the sandbox and `surrogateescape` would), lone surrogates,
control characters, characters outside the character tokenizer's alphabet and huge strings, as the policy's
calculator expressions and Python programs and as the sandbox's output (a fake sandbox returns them as
`SandboxResult` stdout, stderr and detail: a real run costs 0.1-0.5 s), each step taken through `LocalEnvs`
(the environment boundary) and the runner's host side (`EpisodeRunner._observe`: the step's account, the
framing, the transcript) with the character tokenizer and a byte-level BPE tokenizer with a chat template.
A handful of real sandbox programs and one end-to-end batch of episodes (the tiny model, an environment of
hostile observations, in process and in a worker process) check the same on the real paths.
"""

from __future__ import annotations

import json
import pickle
import random
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from rl_lm import sampling, tokenizer
from rl_lm.envs import base, calculator, episodes, failures, python_tool, tools, workers
from rl_lm.envs import text as text_lib
from rl_lm.models import presets, transformer
from rl_lm.rewards import code as code_lib
from rl_lm.tasks.base import Problem
from rl_lm.train import agent

SEED = 33
ROUNDS = 5_000  # each round: a calculator and a Python tool observation, and a raw one: 15,000 observations
SLOTS = 4096  # the fuzz runners' episode buffer: a tool's bounded output always fits it under the BPE tokenizer
CHAR = tokenizer.CharTokenizer()
CFG = presets.get("test")
PALETTE = ("\udcff", "\ud800", "\udfff", "\x00", "\x1b[31m", "\r", "\t", "\x07", "\x7f", "\x85", "\u2028", "\ufeff",
           "\ufffd", "\uffff", "\u202e", "é", "\U0001f600", "\U0010ffff", ")]", "[calc(", "[python(", "\\")
TEMPLATE = (Path(__file__).parent / "data" / "chat_templates" / "llama-3-instruct.jinja").read_text()
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="module")
def bpe_chat(tmp_path_factory) -> tokenizer.HFTokenizer:
  """A byte-level BPE tokenizer (every byte encodes) with Llama 3's chat template: the template path at the cost
  of a few milliseconds, where SmolLM2's would convert a checkpoint."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["error: division by zero", "12 + 30 = 42", "print(6 * 7)", "the answer is"] * 20, trainer)
  folder = tmp_path_factory.mktemp("bpe_chat")
  tok.save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps(
    {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "chat_template": TEMPLATE}))
  out = tokenizer.HFTokenizer(str(folder), chat=True)
  assert out.stop_ids == (tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>"))
  return out


def hostile(rng: random.Random) -> str:
  """A random text of one of the kinds a policy or its program can produce."""
  kind = rng.randrange(8)
  n = rng.choice((0, 1, 2, 5, 20, 60, 300))
  if kind == 0:  # bytes that are mostly not UTF-8, as surrogateescape decodes them
    return bytes(rng.getrandbits(8) for _ in range(n)).decode("utf-8", "surrogateescape")
  if kind == 1:  # bytes as Latin-1: C0 and C1 controls, NULs
    return bytes(rng.getrandbits(8) for _ in range(n)).decode("latin-1")
  if kind == 2:  # any code point, surrogates included
    return "".join(chr(rng.randrange(0x110000)) for _ in range(n))
  if kind == 3:  # arithmetic with hostile characters spliced in
    parts = [rng.choice(("1", "+", "2", "*", "(", ")", "7.5", "/", "0", " ", "**")) for _ in range(n)]
    for _ in range(rng.randrange(1, 4)):
      parts.insert(rng.randrange(len(parts) + 1), rng.choice(PALETTE))
    return "".join(parts)
  if kind == 4:  # a program's output: a string literal of hostile characters
    return f"print({''.join(rng.choice(PALETTE) for _ in range(n))!r})"
  if kind == 5 and rng.random() < 0.05:  # huge: 10^5 to 10^6 characters
    return rng.choice(PALETTE) * rng.randrange(10**5, 10**6) + "".join(rng.choice(PALETTE) for _ in range(n))
  if kind == 6:  # only the palette
    return "".join(rng.choice(PALETTE) for _ in range(n))
  return "".join(chr(rng.randrange(32, 127)) for _ in range(n))


class FakeSandbox:
  """Stands in for the code sandbox: a random status, and hostile stdout, stderr and detail."""

  def __init__(self, rng: random.Random):
    self.rng = rng

  def run(self, job: code_lib.CodeJob) -> code_lib.SandboxResult:
    r = self.rng
    return code_lib.SandboxResult(r.choice(code_lib.STATUSES), r.random(), hostile(r), hostile(r), hostile(r))


def check_observed(runner: episodes.EpisodeRunner, out: workers.Outcome, call: bool, tool: str) -> failures.Verdict:
  """One environment answer through the runner's host side; the invariants every answer keeps."""
  tracker = failures.Tracker()
  step, ids, shown = runner._observe(tracker, out)
  verdict = tracker.verdict()
  json.dumps(shown, ensure_ascii=False).encode("utf-8")  # the transcript and the reason can be stored and printed
  json.dumps(verdict.reason, ensure_ascii=False).encode("utf-8")
  assert text_lib.visible(shown) == shown and text_lib.visible(verdict.reason) == verdict.reason
  if not out.ok:  # the tool's infrastructure raised (a masked sandbox status): the environment's failure
    assert tool == "python" and step is None and ids is None and verdict.outcome == "environment"
    return verdict
  observation = out.value.observation
  if ids is not None:
    assert all(0 <= i < runner.tok.vocab_size for i in ids) and len(ids) < SLOTS
  elif not out.value.done:  # an observation that could not be framed ends the episode, charged by the rule
    assert verdict.reason.startswith(failures.UNFRAMED), verdict
    assert verdict.outcome == ("model" if call else "environment"), verdict
  if call:  # a tool's output: visible text, bounded; the calculator's ASCII
    assert text_lib.visible(observation) == observation and len(observation) <= 700
    if tool == "calc":
      assert observation.isascii() and ids is not None  # even the character tokenizer frames it
    elif runner.tok is not CHAR:
      assert ids is not None  # a byte-level tokenizer frames every tool output
  return verdict


def test_fuzz_tools_framing_and_the_runner_host_side_never_raise(bpe_chat, monkeypatch):
  rng = random.Random(SEED)
  monkeypatch.setattr(python_tool, "_TOOL", tools.PythonTool(sandbox=FakeSandbox(rng)))
  scfg = sampling.SamplingConfig(max_new_tokens=8, stop_tokens=(2,))
  limits = episodes.EpisodeLimits(max_turns=4, turn_tokens=8, max_tokens=SLOTS)
  envs = {"calc": episodes.LocalEnvs(calculator.CalculatorEnv), "python": episodes.LocalEnvs(python_tool.PythonToolEnv)}
  runners = [episodes.EpisodeRunner(CFG, scfg, tok, None, limits, 1) for tok in (CHAR, bpe_chat)]
  problem = Problem(id="p", prompt="What is 6 times 7?", answer="42")
  for name, pool in envs.items():
    assert all(o.ok for o in pool.reset([(0, problem, 0)])), name
  # tool: observations the tools produced (each framed by both tokenizers); raw: random texts framed directly;
  # framings: every framing of either; ok (no failure), model, environment: the verdicts of the tools' steps.
  counts = {"tool": 0, "raw": 0, "framings": 0, "ok": 0, "model": 0, "environment": 0, "huge": 0}
  start = time.perf_counter()
  for _ in range(ROUNDS):
    for name in ("calc", "python"):
      s = hostile(rng)
      counts["huge"] += len(s) >= 10**5
      # The Python environment's answers would start the maths verifier: it is sent calls only.
      action = f"[{name}({s})]" if name == "python" or rng.random() < 0.8 else s
      (out,) = envs[name].step([(0, action, "")])
      call = tools.parse(action, (name,)).kind == "call"
      assert pickle.loads(pickle.dumps(out)) == out  # as a worker's pipe carries it
      counts["tool"] += 1
      for runner in runners:
        verdict = check_observed(runner, out, call, name)
        counts["framings"] += 1
        counts[{"success": "ok", "task": "ok"}.get(verdict.outcome, verdict.outcome)] += 1
    # The environment's own text (a reset, a step without a tool call), and the policy's turn decoded.
    s, source = hostile(rng), rng.choice(("model", "environment"))
    counts["raw"] += 1
    for runner in runners:
      framed = runner.framing.frame(s, source, first=rng.random() < 0.5)
      if isinstance(framed, failures.Verdict):
        assert framed.outcome == source and framed.reason.startswith(failures.UNFRAMED), framed
      counts["framings"] += 1
      ids = np.asarray([rng.randrange(runner.tok.vocab_size + 64) for _ in range(rng.randrange(12))], np.int64)
      text, why = episodes._decode(runner.tok, ids)
      assert not why and text_lib.first_surrogate(text) == -1
  seconds = time.perf_counter() - start
  print(f"\nfuzz: {counts} in {seconds:.1f} s")  # the figures the issue asks for (pytest -s shows them)
  assert counts["tool"] + counts["raw"] >= 10_000 and counts["huge"] > 0
  assert counts["model"] > 0 and counts["environment"] > 0 and counts["ok"] > counts["tool"]


@pytest.fixture(scope="module")
def real_tool_env():
  saved = python_tool._TOOL
  python_tool._TOOL = tools.PythonTool(timeout_s=5.0)
  yield episodes.LocalEnvs(python_tool.PythonToolEnv)
  python_tool._TOOL = saved


@pytest.mark.parametrize("program, shown, char_ok", [
  ('raise ValueError("\\udcff")', "error: ValueError: \ufffd", False),  # the issue's first attack
  ('import sys\nsys.stdout.buffer.write(b"\\xff\\xfe ok \\xed\\xb3\\xbf")', "\ufffd\ufffd ok \ufffd\ufffd\ufffd",
   False),  # bytes that are not UTF-8 (an encoded surrogate among them)
  ('print("a\\x00b\\x1b[2Jc\\rd\\x07")', "a\\x00b\\x1b[2Jc\\x0dd\\x07", True),  # controls, escaped
  ('print("x" * 10**6)', "x" * 399, True),  # a huge print: its last 400 characters (the newline one of them)
  ('print("caf\\u00e9")', "café", False),
])
def test_real_python_tool_programs(real_tool_env, bpe_chat, program, shown, char_ok):
  """Real sandbox runs: the observation is visible text; the BPE tokenizer frames it, the character tokenizer
  frames it or ends the episode as the model's failure, and the run goes on."""
  real_tool_env.reset([(1, Problem(id="q", prompt="6*7?", answer="42"), 0)])
  (out,) = real_tool_env.step([(1, f"[python({program})]", "")])
  if not out.ok:  # a starved host: the sandbox's overload, masked by design (tests/test_tools.py)
    assert "overloaded" in out.detail
    pytest.skip("the host starved the sandbox")
  assert out.value.observation.rstrip("\n") == shown.rstrip("\n")
  for tok in (CHAR, bpe_chat):
    runner = episodes.EpisodeRunner(CFG, sampling.SamplingConfig(), tok, None,
                                    episodes.EpisodeLimits(4, 8, 2048), 1)
    tracker = failures.Tracker()
    _, ids, _ = runner._observe(tracker, out)
    if tok is CHAR and not char_ok:
      assert ids is None and tracker.verdict().outcome == "model", tracker.verdict()
      assert tracker.verdict().reason.startswith(f"{failures.UNFRAMED}: cannot be encoded")
    else:
      assert ids is not None and tracker.verdict().outcome == "task"  # no failure: the episode goes on


def test_the_issue_attacks_reaching_the_framing_are_the_model_s_failures(bpe_chat):
  """Before the tools escaped them, these observations reached `Framing.next` and raised out of the runner:
  a lone surrogate (TypeError in the Rust tokenizer) and the calculator's echo of a character outside the
  character tokenizer's alphabet (ValueError). As a tool's output they are the model's failure; as the
  environment's own text, the environment's. A chat template that fails is the environment's whatever the text."""
  surrogate, accent = "error: ValueError: \udcff\n", "error: not arithmetic: 'é'\n"
  assert tools.calculator("é+1").output == "error: not arithmetic: '\\xe9'"  # the tool escapes it now
  char, bpe = episodes.Framing(CHAR, 256), episodes.Framing(bpe_chat, 256)
  with pytest.raises(TypeError):
    bpe.next(surrogate)
  with pytest.raises(ValueError):
    char.next(accent)
  unicode = f"{failures.UNFRAMED}: not valid Unicode (a lone surrogate at character 19)"
  assert bpe.frame(surrogate, "model") == failures.Verdict("model", unicode)
  assert char.frame(surrogate, "environment", first=True) == failures.Verdict("environment", unicode)
  verdict = char.frame(accent, "model")
  assert verdict.outcome == "model" and verdict.reason.startswith(f"{failures.UNFRAMED}: cannot be encoded (ValueError")
  assert bpe.frame(accent, "model") == bpe_chat.encode_reply(accent)
  assert char.frame(["not", "text"], "model") == failures.Verdict("environment", f"{failures.UNFRAMED}: list, not str")
  assert char.frame("x" * (32 * 256 + 1), "model").reason == f"{failures.UNFRAMED}: oversized (8193 characters)"
  assert char.frame("x" * 300, "environment").reason == f"{failures.UNFRAMED}: oversized (300 tokens, the " \
                                                         "episode holds 256)"

  class Broken:  # a renderer that fails (chat.py raises ChatTemplateError for an error, a timeout, a size limit)
    def encode_reply(self, text):
      from rl_lm.chat import ChatTemplateError

      raise ChatTemplateError("chat template: rendering ran out of time")

  assert episodes.Framing(Broken()).frame("fine", "model") == failures.Verdict(
    "environment", f"{failures.UNFRAMED}: chat template: rendering ran out of time")
  assert failures.observation_source({"tool_calls": 1}) == "model"
  assert failures.observation_source({}) == failures.observation_source({"tool_calls": "x"}) == "environment"


# --- one batch of episodes end to end -------------------------------------------------------------------------


class HostileEnv(base.Environment):
  """The problem's id says what it does. "calm": replies "ok;" once, then ends solved. "calc_attack": the
  calculator's answer to the issue's call `[calc(é+1)]` (whatever the policy said), then ends unsolved.
  "reset_*": a first observation that cannot be framed. Otherwise its first step answers with a hostile
  observation."""

  STEPS = {
    "tool_surrogate": base.Step("error: ValueError: \udcff\n", 0.0, False, {"tool_calls": 1}),
    "tool_accent": base.Step("error: not arithmetic: 'é'\n", 0.0, False, {"tool_calls": 1}),
    "tool_huge": base.Step("x" * 10**6, 0.0, False, {"tool_calls": 1}),
    "env_accent": base.Step("café", 0.0, False, {}),
    "env_nan": base.Step("ok;", float("nan"), False, {}),
    "env_none": base.Step(None, 0.0, False, {}),  # type: ignore[arg-type]
  }

  def reset(self, problem, rng):
    self.problem, self.turns = problem, 0
    return {"reset_surrogate": "7*8=\udcff", "reset_accent": "7×8="}.get(problem.id, problem.prompt)

  def step(self, action):
    self.turns += 1
    if self.problem.id == "calm":
      return base.Step("ok;", 0.0, False, {}) if self.turns == 1 else base.Step("", 1.0, True, {"success": True})
    if self.problem.id == "calc_attack":
      tool = calculator.CalculatorEnv()
      tool.problem = self.problem
      return tool.step("[calc(é+1)]") if self.turns == 1 else base.Step("", 0.0, True, {"success": False})
    return self.STEPS[self.problem.id]


EXPECTED = {  # id -> (outcome, reason, policy turns)
  "calm": ("success", "", 2),
  "calc_attack": ("task", "wrong answer", 2),
  "reset_surrogate": ("environment", "unframed observation: not valid Unicode (a lone surrogate at character 4)", 0),
  "reset_accent": ("environment", "unframed observation: cannot be encoded (ValueError: CharTokenizer cannot encode "
                   "character '×' in '7×8=')", 0),
  "tool_surrogate": ("model", "unframed observation: not valid Unicode (a lone surrogate at character 19)", 1),
  "tool_accent": ("model", "unframed observation: cannot be encoded (ValueError: CharTokenizer cannot encode "
                  "character 'é' in \"error: not arithmetic: 'é'\\n\")", 1),
  "tool_huge": ("model", "unframed observation: oversized (1000000 characters)", 1),
  "env_accent": ("environment", "unframed observation: cannot be encoded (ValueError: CharTokenizer cannot encode "
                 "character 'é' in 'café')", 1),
  "env_nan": ("environment", "step reward is nan", 1),
  "env_none": ("environment", "unframed observation: NoneType, not str", 1),
}


def test_a_batch_of_hostile_episodes_completes_classified_counted_and_masked():
  """Ten episodes, one of each kind, through the real runner in process and in a worker process (surrogates
  across its pipe): the batch completes; each episode has its verdict; the metrics count them; an unframed
  observation leaves no token behind; the policy's tokens alone carry the completion mask."""
  # A prompt of 20 characters: every turn's observation chunk is 32 wide, one compiled shape.
  problems = [Problem(id=k, prompt="What is 7 times 8? =", answer="56") for k in EXPECTED]
  B = len(problems)
  # Every id a stop token: each turn is one sampled token that stops, so nothing but the environment decides.
  scfg = sampling.SamplingConfig(max_new_tokens=4, stop_tokens=tuple(range(CFG.vocab_size)), pad_id=CHAR.pad_id)
  limits = episodes.EpisodeLimits(max_turns=3, turn_tokens=4, max_tokens=64)
  runner = episodes.EpisodeRunner(CFG, scfg, CHAR, episodes.LocalEnvs(HostileEnv), limits, B)
  params = transformer.init(CFG, jax.random.key(0))
  local = runner.run(params, problems, jax.random.key(1), seeds=list(range(B)))
  with workers.EnvPool((HostileEnv.__module__, "HostileEnv"), 1, 30.0, 30.0) as pool:
    runner.envs = pool
    pooled = runner.run(params, problems, jax.random.key(1), seeds=list(range(B)))
  for batch in (local, pooled):
    host = batch.host
    got = {p.id: (v.outcome, v.reason, int(t)) for p, v, t in zip(problems, host.verdicts, host.turns, strict=True)}
    assert got == EXPECTED
    assert [v.trains for v in batch.host.verdicts] == [v[0] != "environment" for v in EXPECTED.values()]
    metrics = agent.Agent.metrics(SimpleNamespace(faults=SimpleNamespace(active=False), envs=None), [batch])
    assert metrics["episodes/failure_env"] == pytest.approx(5 / B)
    assert metrics["episodes/failure_model"] == pytest.approx(3 / B)
    assert metrics["episodes/success_rate"] == metrics["episodes/failure_task"] == pytest.approx(1 / B)
    assert metrics["episodes/unframed_observations"] == pytest.approx(7 / B)
    for text in batch.host.texts:
      json.dumps(text, ensure_ascii=False).encode("utf-8")
    tokens, fill = batch.host.tokens, batch.host.fill
    sampled = np.asarray(batch.device.completion_mask)
    prompt_mask = np.asarray(batch.device.prompt_mask)
    for b, p in enumerate(problems):
      turns = EXPECTED[p.id][2]
      prompt = [] if turns == 0 else CHAR.encode_prompt(p.prompt)
      marks = [False] * len(prompt)
      if turns == 2:  # prompt, turn, the observation, turn
        obs = CHAR.encode("ok;" if p.id == "calm" else "error: not arithmetic: '\\xe9'\n")
        marks += [True] + [False] * len(obs) + [True]
        assert tokens[b, len(prompt) + 1: len(prompt) + 1 + len(obs)].tolist() == obs
      elif turns:  # prompt, one turn, then nothing: the observation never became tokens
        marks += [True]
      assert fill[b] == len(marks) and tokens[b, : len(prompt)].tolist() == prompt, p.id
      assert sampled[b].tolist() == marks + [False] * (64 - len(marks)), p.id
      assert prompt_mask[b].tolist() == [not m for m in marks] + [False] * (64 - len(marks)), p.id
    assert batch.host.lengths.tolist() == [EXPECTED[p.id][2] for p in problems]
  assert text_lib.first_surrogate("".join(local.host.texts)) == -1 and local.host.texts[2] == "7*8=\ufffd"
