"""Untrusted checkpoints: hostile chat templates and hostile GGUF files each end within 30 s and 2 GiB with one
line, and a malformed GGUF file leaves no folder behind. Every hostile case runs in a subprocess, which reports
its wall time and peak memory (its own, and its render worker's).

The GGUF files are written here byte by byte (`gguf_file`): a tiny valid Llama (one layer, a 9-token
byte-level vocabulary) and variants of it that lie about counts, sizes and offsets."""

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rl_lm.models import convert

ROOT = Path(__file__).resolve().parents[1]
WALL_LIMIT_S, MEMORY_LIMIT_KIB = 30.0, 2 << 20

# --- a GGUF writer -------------------------------------------------------------------------------------------

U8, U32, I32, F32, BOOL, STRING, ARRAY = 0, 4, 5, 6, 7, 8, 9
F32_TENSOR, Q4_0_TENSOR = 0, 2


def s(text: str | bytes) -> bytes:
  data = text.encode() if isinstance(text, str) else text
  return struct.pack("<Q", len(data)) + data


def value(kind: int, v) -> bytes:
  if kind == STRING:
    return s(v)
  if kind == ARRAY:
    item, items = v
    return struct.pack("<IQ", item, len(items)) + b"".join(value(item, x) for x in items)
  return struct.pack({U8: "<B", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}[kind], v)


def gguf_file(kv: list[tuple[str, int, object]], tensors: list[tuple[str, tuple[int, ...], int, int]], data: bytes,
              magic: bytes = b"GGUF", version: int = 3, counts: tuple[int, int] | None = None) -> bytes:
  """A GGUF file: key/values (key, type, value), tensor infos (name, dims fastest first, ggml type, offset), data.
  `counts` overrides the declared (tensors, keys)."""
  n_tensors, n_kv = counts or (len(tensors), len(kv))
  out = magic + struct.pack("<IQQ", version, n_tensors, n_kv)
  out += b"".join(s(k) + struct.pack("<I", kind) + value(kind, v) for k, kind, v in kv)
  for name, dims, kind, offset in tensors:
    out += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind,
                                                                                                        offset)
  return out + b"\0" * (-len(out) % 32) + data


TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab", "Ġ", "Ġab", "c"]
MERGES = ["a b", "Ġ ab"]
D, H, K, DH, F = 8, 2, 1, 4, 16
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def tiny_metadata(**changes) -> list[tuple[str, int, object]]:
  kv = {
    "general.architecture": (STRING, "llama"), "llama.block_count": (U32, 1), "llama.context_length": (U32, 64),
    "llama.embedding_length": (U32, D), "llama.feed_forward_length": (U32, F), "llama.attention.head_count": (U32, H),
    "llama.attention.head_count_kv": (U32, K), "llama.rope.freq_base": (F32, 10000.0),
    "llama.attention.layer_norm_rms_epsilon": (F32, 1e-5), "tokenizer.ggml.model": (STRING, "gpt2"),
    "tokenizer.ggml.tokens": (ARRAY, (STRING, TOKENS)),
    "tokenizer.ggml.token_type": (ARRAY, (I32, [3, 3, 3] + [1] * (len(TOKENS) - 3))),
    "tokenizer.ggml.merges": (ARRAY, (STRING, MERGES)), "tokenizer.ggml.bos_token_id": (U32, 1),
    "tokenizer.ggml.eos_token_id": (U32, 2), "tokenizer.ggml.add_bos_token": (BOOL, False),
    "tokenizer.chat_template": (STRING, TEMPLATE),
  }
  for key, v in changes.items():
    key = key.replace("__", ".")
    if v is None:
      kv.pop(key)
    else:
      kv[key] = v
  return [(k, kind, v) for k, (kind, v) in kv.items()]


def tiny_tensors() -> list[tuple[str, tuple[int, ...]]]:
  """(name, GGUF dims) of the tiny Llama: dims are [in, out] for a projection (numpy [out, in] reversed)."""
  layer = [("attn_norm", (D,)), ("attn_q", (D, H * DH)), ("attn_k", (D, K * DH)), ("attn_v", (D, K * DH)),
           ("attn_output", (H * DH, D)), ("ffn_norm", (D,)), ("ffn_gate", (D, F)), ("ffn_up", (D, F)),
           ("ffn_down", (F, D))]
  return [("token_embd.weight", (D, len(TOKENS))), ("output_norm.weight", (D,))] + [
    (f"blk.0.{n}.weight", dims) for n, dims in layer]


def tiny_weights() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  return {name: rng.normal(size=dims[::-1]).astype(np.float32) for name, dims in tiny_tensors()}


def tiny_gguf(kv=None, tensors=None, **kw) -> bytes:
  """The tiny Llama in float32 (`tiny_weights`), each tensor 32-byte aligned; `tensors` edits the table."""
  table, data = [], b""
  for (name, dims), w in zip(tiny_tensors(), tiny_weights().values(), strict=True):
    table.append((name, dims, F32_TENSOR, len(data)))
    data += w.tobytes() + b"\0" * (-w.nbytes % 32)
  return gguf_file(tiny_metadata() if kv is None else kv, table if tensors is None else tensors(table), data, **kw)


def replace_tensor(name: str, **fields):
  def edit(table):
    return [(n, fields.get("dims", d), fields.get("kind", k), fields.get("offset", o)) if n == name else (n, d, k, o)
            for n, d, k, o in table]
  return edit


def hostile_gguf_files() -> dict[str, bytes]:
  """Malformed GGUF files, by what is wrong with them."""
  tiny = tiny_gguf()
  header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)  # no tensors, one key
  many = [(f"t{i}", (1 << 20,), F32_TENSOR, 0) for i in range(200)]  # 200 x 4 MiB on one 4 MiB block
  return {
    "2^62-element array (49 bytes)": header + s("a") + struct.pack("<IIQ", ARRAY, U8, 1 << 62),
    "2^60-byte string": header + s("k") + struct.pack("<IQ", STRING, 1 << 60),
    "2^40 keys declared": gguf_file([], [], b"", counts=(0, 1 << 40)),
    "200 tensors on one 4 MiB block": gguf_file([], many, b"\0" * (4 << 20)),
    "overlapping tensors": tiny_gguf(tensors=replace_tensor("blk.0.attn_k.weight", offset=32 * 3)),
    "tensor past the end": tiny_gguf(tensors=replace_tensor("blk.0.ffn_down.weight", offset=1 << 20)),
    "misaligned offset": tiny_gguf(tensors=replace_tensor("output_norm.weight", offset=len(TOKENS) * D * 4 + 4)),
    "absurd dimensions": tiny_gguf(tensors=replace_tensor("blk.0.ffn_up.weight", dims=(1 << 40, 1 << 40))),
    "rows not whole Q4_0 blocks": tiny_gguf(tensors=replace_tensor("blk.0.ffn_up.weight", kind=Q4_0_TENSOR)),
    "unknown ggml type": tiny_gguf(tensors=replace_tensor("blk.0.ffn_up.weight", kind=99)),
    "wrong tensor shape": tiny_gguf(tensors=replace_tensor("blk.0.attn_q.weight", dims=(D, D // 2))),
    "truncated data": tiny[:-100],
    "truncated key table": tiny[:300],
    "truncated metadata": tiny[:700],
    "short token_type": tiny_gguf(tiny_metadata(tokenizer__ggml__token_type=(ARRAY, (I32, [3, 3, 3, 1])))),
    "long token_type": tiny_gguf(tiny_metadata(tokenizer__ggml__token_type=(ARRAY, (I32, [1] * 20)))),
    "bos id out of range": tiny_gguf(tiny_metadata(tokenizer__ggml__bos_token_id=(U32, 4000))),
    "merge without a space": tiny_gguf(tiny_metadata(tokenizer__ggml__merges=(ARRAY, (STRING, ["ab"])))),
    "merge of an unknown token": tiny_gguf(tiny_metadata(tokenizer__ggml__merges=(ARRAY, (STRING, ["a z"])))),
    "block_count a string": tiny_gguf(tiny_metadata(llama__block_count=(STRING, "1"))),
    "duplicate key": tiny_gguf(tiny_metadata() + [("llama.block_count", U32, 1)]),
    "key not UTF-8": gguf_file([(b"\xff\xfe", U32, 1)], [], b""),
    "bad magic": tiny_gguf(magic=b"GGML"),
    "version 1": tiny_gguf(version=1),
    "big-endian": tiny_gguf(version=3 << 24),
    "empty file": b"",
  }


def test_a_tiny_valid_gguf_converts_and_loads(tmp_path, capsys):
  from rl_lm.models import hf
  from rl_lm.tokenizer import HFTokenizer

  (tmp_path / "tiny.gguf").write_bytes(tiny_gguf())
  out = convert.convert(tmp_path / "tiny.gguf", tmp_path / "out")
  assert sorted(os.listdir(tmp_path)) == ["out", "tiny.gguf"]  # no temporary folder left beside it
  cfg, params = hf.load(str(out))
  assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (9, D, 1, H, K, DH)
  w = tiny_weights()
  np.testing.assert_array_equal(np.asarray(params["embed"]), w["token_embd.weight"])
  np.testing.assert_array_equal(np.asarray(params["layers"]["w_down"][0]), w["blk.0.ffn_down.weight"].T)
  q = convert.unpermute_rows(w["blk.0.attn_q.weight"], H)  # [H * DH, D], rotary halves restored
  np.testing.assert_array_equal(np.asarray(params["layers"]["wq"][0]), q.T.reshape(D, H, DH))
  tok = HFTokenizer(str(out), chat=True)
  assert tok.encode("ab ab") == [5, 7] and tok.eos_id == 2 and tok.stop_ids == (2,)
  assert tok.chat.prompt("ab") == "<|im_start|>user\nab<|im_end|>\n"
  # Converting again replaces the folder; a folder holding anything else is refused, untouched.
  convert.convert(tmp_path / "tiny.gguf", out)
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("keep")
  with pytest.raises(convert.ConversionError, match="holds other files than a converted checkpoint"):
    convert.convert(tmp_path / "tiny.gguf", tmp_path / "mine")
  assert os.listdir(tmp_path / "mine") == ["notes.txt"]
  # The command line says what is wrong with a malformed file in one line, and writes nothing.
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(tiny_gguf(tiny_metadata(tokenizer__ggml__token_type=(ARRAY, (I32, [3, 3, 3, 1])))))
  assert convert.main([f"--gguf={bad}", f"--out={tmp_path / 'bad'}"]) == 2
  want = f"rl_lm.models.convert: {bad}: tokenizer.ggml.token_type has 4 entries for 9 tokens\n"
  assert capsys.readouterr().err == want
  assert sorted(os.listdir(tmp_path)) == ["bad.gguf", "mine", "out", "tiny.gguf"]


_CONVERT_ALL = textwrap.dedent("""
  import json, os, sys, time
  from rl_lm.models import convert

  def peak_kib():
    for line in open("/proc/self/status"):
      if line.startswith("VmHWM:"):
        return int(line.split()[1])

  folder = sys.argv[1]
  for name in sorted(os.listdir(folder)):
    if not name.endswith(".gguf"):
      continue
    try:
      with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM: the peak below is this file's
    except OSError:
      pass
    out = os.path.join(folder, name + ".out")
    start = time.monotonic()
    try:
      convert.convert(os.path.join(folder, name), out)
      line = None
    except convert.ConversionError as e:
      line = str(e)
    print(json.dumps({"file": name, "s": time.monotonic() - start, "peak_kib": peak_kib(), "line": line}), flush=True)
""")


def test_hostile_gguf_files_each_end_in_one_line_and_leave_no_folder(tmp_path):
  files = hostile_gguf_files()
  assert len(files["2^62-element array (49 bytes)"]) == 49
  names = {}
  for i, (what, data) in enumerate(files.items()):
    names[f"{i:02d}.gguf"] = what
    (tmp_path / f"{i:02d}.gguf").write_bytes(data)
  run = subprocess.run([sys.executable, "-c", _CONVERT_ALL, str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  results = [json.loads(line) for line in run.stdout.splitlines()]
  assert [r["file"] for r in results] == sorted(names)
  for r in results:
    what, path = names[r["file"]], str(tmp_path / r["file"])
    assert r["line"] is not None, f"{what}: converted"
    assert r["line"].startswith(f"{path}: ") and "\n" not in r["line"], (what, r["line"])
    assert r["s"] < WALL_LIMIT_S and r["peak_kib"] < MEMORY_LIMIT_KIB, (what, r)
  assert sorted(os.listdir(tmp_path)) == sorted(names)  # no output folder, no temporary one
  print("\n".join(f"{names[r['file']]}: {r['s']:.3f} s, {r['peak_kib'] / 1024:.0f} MiB: {r['line']}" for r in results))


# --- hostile chat templates ----------------------------------------------------------------------------------

HOSTILE_TEMPLATES = {  # what it does: (source, the words its line must hold)
  "nested range loops": ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                         "{% endfor %}{% endfor %}{% endfor %}", "took more than"),
  "'x' * 400000000": ("{{ 'x' * 400000000 }}", "memory"),
  "'x' * 4e8": ("{{ 'x' * 4e8 }}", "failed to render: TypeError"),
  "join chain": ("{% set ns = namespace(s='ab' * 1000) %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s] | "
                 "join(ns.s) %}{% endfor %}{{ ns.s }}", "memory"),
  "replace chain": ("{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s | replace('x', "
                    "ns.s) %}{% endfor %}{{ ns.s }}", "memory"),
  "format chain": ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = '%s%s' | format(ns.s, "
                   "ns.s) %}{% endfor %}{{ ns.s }}", "memory"),
  "center and indent": ("{{ ('x' | center(100000000)) | indent(1000, true) }}", "output exceeds"),
  "many small pieces": ("{% for i in range(100000) %}{% for j in range(1000) %}0123456789{% endfor %}{% endfor %}",
                        "output exceeds"),
  "tojson of a doubling list": ("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}"
                                "{% endfor %}{{ ns.l | tojson }}", "took more than"),
  "macro recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
  "busy arithmetic": ("{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100000) %}"
                      "{% set ns.n = ns.n + i * j %}{% endfor %}{% endfor %}{{ ns.n }}", "took more than"),
}

_RENDER_ONE = textwrap.dedent("""
  import gc, json, resource, sys, time
  from rl_lm.chat import ChatTemplate, ChatTemplateError
  from rl_lm.chat_worker import RenderLimits

  start, line = time.monotonic(), None
  try:
    template = ChatTemplate(sys.argv[1], origin="hostile.jinja", limits=RenderLimits(timeout_s=float(sys.argv[2])))
    template.render([{"role": "user", "content": "hi"}])
  except ChatTemplateError as e:
    line = str(e)
  seconds = time.monotonic() - start
  template = None
  gc.collect()  # stops and reaps a worker still alive, so that its peak is counted below
  self_kib = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))  # since exec
  print(json.dumps({"s": seconds, "line": line, "self_kib": self_kib,
                    "worker_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""")


def render_in_subprocess(source: str, timeout_s: float) -> dict:
  run = subprocess.run([sys.executable, "-c", _RENDER_ONE, source, str(timeout_s)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert run.returncode == 0 and not run.stderr, run.stderr[-3000:]
  return json.loads(run.stdout)


@pytest.mark.parametrize("what", list(HOSTILE_TEMPLATES))
def test_hostile_templates_end_in_one_line_within_time_and_memory(what):
  source, words = HOSTILE_TEMPLATES[what]
  # The default deadline is 10 s: 2 s for the templates that spin keeps the suite's CPU small; the others end
  # sooner by their limit (memory, output, recursion), which a deadline of 20 s leaves them time to meet on a busy host.
  r = render_in_subprocess(source, timeout_s=2.0 if words == "took more than" else 20.0)
  assert r["line"] is not None and r["line"].startswith("hostile.jinja: chat template "), r
  assert words in r["line"] and "\n" not in r["line"], r
  assert r["s"] < WALL_LIMIT_S and r["self_kib"] + r["worker_kib"] < MEMORY_LIMIT_KIB, r
  print(f"{what}: {r['s']:.2f} s, {r['self_kib'] >> 10} + {r['worker_kib'] >> 10} MiB: {r['line']}")
