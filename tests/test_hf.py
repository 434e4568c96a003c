"""Hugging Face checkpoints: logit parity with transformers, round trips, shards, meshes, bf16, errors, tokenizer."""

import json
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from rl_lm import mesh as mesh_lib
from rl_lm.models import hf, presets, transformer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
TOL = 1e-4


def _batch(T: int = 24) -> tuple[np.ndarray, np.ndarray]:
  """Three rows: full, right-padded, left-padded (pad token ids are random too)."""
  tokens = np.random.RandomState(0).randint(0, SMALL["vocab_size"], (3, T)).astype(np.int32)
  mask = np.ones((3, T), bool)
  mask[1, T - 7:] = False
  mask[2, :9] = False
  return tokens, mask


def _hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.float().numpy()


_forward = jax.jit(transformer.forward, static_argnums=0)


def _our_logits(cfg, params, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  return np.asarray(_forward(cfg, params, jnp.asarray(tokens), jnp.asarray(mask)))


def _diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
  return float(np.abs(a - b)[mask].max())


def _hf_model(cls_name: str, seed: int = 0, **overrides):
  """A transformers model with every weight random (biases and norms included), float32, eager attention."""
  config = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))(**{**SMALL, **overrides})
  torch.manual_seed(seed)
  model = getattr(transformers, cls_name)._from_config(config, attn_implementation="eager", dtype=torch.float32)
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
  return model.eval()


def _random_params(cfg, seed: int = 0):
  """Our parameters with every leaf random (unlike transformer.init, whose biases are zero and norms one)."""
  shapes = transformer.param_shapes(cfg)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [
    0.05 * jax.random.normal(key, shape) + (1.0 if "norm" in jax.tree_util.keystr(path) else 0.0)
    for key, (path, shape) in zip(keys, leaves, strict=True)
  ])


def _expected_params(cfg, state_dict) -> dict:
  """Our tree, built straight from a transformers state dict (independently of hf.py's mapping)."""
  def sd(name):
    return state_dict[name].float().numpy()

  L, D, H, K, Dh = cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  layer = lambda name, f: np.stack([f(sd(f"model.layers.{i}.{name}")) for i in range(L)])
  layers = {
    "attn_norm": layer("input_layernorm.weight", lambda w: w),
    "mlp_norm": layer("post_attention_layernorm.weight", lambda w: w),
    "wq": layer("self_attn.q_proj.weight", lambda w: w.T.reshape(D, H, Dh)),
    "wk": layer("self_attn.k_proj.weight", lambda w: w.T.reshape(D, K, Dh)),
    "wv": layer("self_attn.v_proj.weight", lambda w: w.T.reshape(D, K, Dh)),
    "wo": layer("self_attn.o_proj.weight", lambda w: w.T.reshape(H, Dh, D)),
    "w_gate": layer("mlp.gate_proj.weight", lambda w: w.T),
    "w_up": layer("mlp.up_proj.weight", lambda w: w.T),
    "w_down": layer("mlp.down_proj.weight", lambda w: w.T),
  }
  if cfg.qkv_bias:
    layers["bq"] = layer("self_attn.q_proj.bias", lambda w: w.reshape(H, Dh))
    layers["bk"] = layer("self_attn.k_proj.bias", lambda w: w.reshape(K, Dh))
    layers["bv"] = layer("self_attn.v_proj.bias", lambda w: w.reshape(K, Dh))
  out = {"embed": sd("model.embed_tokens.weight"), "layers": layers, "final_norm": sd("model.norm.weight")}
  if not cfg.tie_embeddings:
    out["lm_head"] = sd("lm_head.weight").T
  return out


def _assert_same(a, b) -> None:
  chex.assert_trees_all_equal_shapes_and_dtypes(a, b)
  chex.assert_trees_all_equal(a, b)


# ------------------------------------------------------------------------------------------------
# Parity with transformers


def test_parity_qwen2(tmp_path):
  model = _hf_model("Qwen2ForCausalLM", tie_word_embeddings=True, rope_theta=1e6)
  model.save_pretrained(tmp_path)
  cfg, params = hf.load(str(tmp_path))
  assert cfg.architecture == "qwen2" and cfg.qkv_bias and cfg.tie_embeddings and cfg.rope_theta == 1e6
  _assert_same(params, _expected_params(cfg, model.state_dict()))
  tokens, mask = _batch()
  diff = _diff(_our_logits(cfg, params, tokens, mask), _hf_logits(model, tokens, mask), mask)
  print(f"qwen2 parity: max |logit diff| = {diff:.3g}")
  assert diff < TOL


def test_parity_llama_untied_llama3_rope(tmp_path):
  model = _hf_model("LlamaForCausalLM", tie_word_embeddings=False, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                    max_position_embeddings=256, rms_norm_eps=1e-5)
  model.save_pretrained(tmp_path)
  cfg, params = hf.load(str(tmp_path))
  assert cfg.architecture == "llama" and not cfg.qkv_bias and not cfg.tie_embeddings and "lm_head" in params
  assert cfg.rope_scaling == (32.0, 1.0, 4.0, 64) and cfg.rope_theta == 500000.0 and cfg.max_seq_len == 256
  # Head dim 16 at theta 5e5 has wavelengths 6.3, 33, 168, ...: one in each Llama-3 band (<16, 16..64, >64).
  wavelen = 2 * np.pi / transformer.rope_frequencies(cfg.replace(rope_scaling=None))
  assert (wavelen < 16).any() and ((wavelen > 16) & (wavelen < 64)).any() and (wavelen > 64).any()
  tokens, mask = _batch()
  theirs = _hf_logits(model, tokens, mask)
  diff = _diff(_our_logits(cfg, params, tokens, mask), theirs, mask)
  print(f"llama3 parity: max |logit diff| = {diff:.3g}")
  assert diff < TOL
  assert _diff(_our_logits(cfg.replace(rope_scaling=None), params, tokens, mask), theirs, mask) > 100 * TOL


# ------------------------------------------------------------------------------------------------
# Save -> transformers, save -> load


ROUND_TRIP = {
  "qwen2_tied": presets.get("test", architecture="qwen2", qkv_bias=True, rope_theta=1e6),
  "llama_untied_llama3": presets.get("test", tie_embeddings=False, rope_theta=500000.0,
                                     rope_scaling=(32.0, 1.0, 4.0, 64), max_seq_len=256, rms_eps=1e-5),
  "llama_attention_bias": presets.get("test", qkv_bias=True),
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIP))
def test_save_loads_in_transformers(tmp_path, name):
  cfg = ROUND_TRIP[name]
  params = _random_params(cfg)
  hf.save(str(tmp_path), cfg, params)
  model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager",
                                                            dtype=torch.float32).eval()
  assert type(model).__name__ == hf.config_to_hf(cfg)["architectures"][0]
  tokens, mask = _batch()
  diff = _diff(_our_logits(cfg, params, tokens, mask), _hf_logits(model, tokens, mask), mask)
  print(f"round trip {name}: max |logit diff| = {diff:.3g}")
  assert diff < TOL
  loaded_cfg, loaded = hf.load(str(tmp_path))
  assert loaded_cfg == cfg
  _assert_same(loaded, params)


def test_sharded_checkpoint(tmp_path):
  cfg = ROUND_TRIP["llama_untied_llama3"]
  params = _random_params(cfg, seed=1)
  hf.save(str(tmp_path), cfg, params, max_shard_bytes=40_000)
  files = sorted(os.listdir(tmp_path))
  shards = [f for f in files if f.startswith("model-")]
  assert len(shards) > 2 and hf.INDEX_FILE in files and hf.WEIGHTS_FILE not in files
  with open(tmp_path / hf.INDEX_FILE) as f:
    index = json.load(f)
  assert sorted(set(index["weight_map"].values())) == shards
  assert index["metadata"]["total_size"] == 4 * cfg.num_params()
  _, loaded = hf.load(str(tmp_path))
  _assert_same(loaded, params)
  # Saving again unsharded replaces the shards and the index.
  hf.save(str(tmp_path), cfg, params)
  assert not any(f.startswith("model-") or f == hf.INDEX_FILE for f in os.listdir(tmp_path))
  _, loaded = hf.load(str(tmp_path))
  _assert_same(loaded, params)


def _check_mesh_load(checkpoint_dir: str) -> None:
  """Loads onto a (2, 2, 2) mesh: partitioned weights, logits equal to the unsharded model's."""
  cfg, ref = hf.load(checkpoint_dir)
  mesh = mesh_lib.make_mesh(2, 2, 2, devices=jax.devices()[:8])
  cfg_m, sharded = hf.load(checkpoint_dir, mesh=mesh)
  assert cfg_m == cfg
  w_gate = sharded["layers"]["w_gate"]
  assert w_gate.sharding.spec == PartitionSpec(None, "fsdp", "tensor") and not w_gate.sharding.is_fully_replicated
  L, D, F = w_gate.shape
  assert {s.data.shape for s in w_gate.addressable_shards} == {(L, D // 2, F // 2)}
  assert len({s.device for s in w_gate.addressable_shards}) == 8
  assert sharded["embed"].sharding.spec == PartitionSpec("tensor", "fsdp")
  _assert_same(sharded, ref)
  tokens, mask = _batch()
  tokens, mask = np.concatenate([tokens, tokens[:1]]), np.concatenate([mask, mask[:1]])  # batch 4 = data * fsdp
  fwd = jax.jit(mesh_lib.bind(transformer.forward, mesh), static_argnums=0)
  batch = mesh_lib.batch_sharding(mesh, mesh_lib.DEFAULT_RULES, tokens.shape)
  out = fwd(cfg, sharded, jax.device_put(tokens, batch), jax.device_put(mask, batch))
  diff = _diff(np.asarray(out), _our_logits(cfg, ref, tokens, mask), mask)
  print(f"mesh load: max |logit diff| sharded vs unsharded = {diff:.3g}")
  assert diff < 1e-5


def test_load_onto_mesh(tmp_path):
  cfg = ROUND_TRIP["qwen2_tied"]
  hf.save(str(tmp_path), cfg, _random_params(cfg, seed=2))
  if len(jax.devices()) >= 8:
    _check_mesh_load(str(tmp_path))
    return
  # JAX's device count is fixed once it starts: check in a fresh process with 8 host devices.
  here = os.path.dirname(os.path.abspath(__file__))
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  code = (f"import sys; sys.path[:0] = [{os.path.dirname(here)!r}, {here!r}]; import test_hf; "
          f"test_hf._check_mesh_load({str(tmp_path)!r})")
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------
# bfloat16 checkpoints


def test_bf16_checkpoint(tmp_path):
  model = _hf_model("Qwen2ForCausalLM", seed=3, tie_word_embeddings=False).to(torch.bfloat16)
  model.save_pretrained(tmp_path)
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["dtype"] == "bfloat16"
  cfg, params = hf.load(str(tmp_path))
  assert cfg.param_dtype == "float32" and all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  _assert_same(params, _expected_params(cfg, model.state_dict()))  # bf16 -> f32 is exact
  cfg16, params16 = hf.load(str(tmp_path), dtype="bfloat16", param_dtype="bfloat16")
  assert cfg16.dtype == cfg16.param_dtype == "bfloat16"
  _assert_same(params16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))
  tokens, mask = _batch()
  # transformers' own bf16 -> float32 load (model.float() would keep rotary inv_freq rounded to bf16).
  model32 = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager",
                                                              dtype=torch.float32).eval()
  diff = _diff(_our_logits(cfg, params, tokens, mask), _hf_logits(model32, tokens, mask), mask)
  print(f"bf16 checkpoint parity (float32 compute): max |logit diff| = {diff:.3g}")
  assert diff < TOL
  # Saved in bfloat16 and read back: the same bits.
  hf.save(str(tmp_path / "again"), cfg16, params16)
  _assert_same(hf.load(str(tmp_path / "again"), param_dtype="bfloat16")[1], params16)


# ------------------------------------------------------------------------------------------------
# config.json


LLAMA_3_2_1B = {
  "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
  "vocab_size": 128256,
}
QWEN2_5_0_5B = {
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
  "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
  "use_mrope": False, "use_sliding_window": False, "vocab_size": 151936,
}


def test_config_of_released_checkpoints():
  assert hf.config_from_hf(LLAMA_3_2_1B) == presets.get("llama-3.2-1b")
  assert hf.config_from_hf(QWEN2_5_0_5B) == presets.get("qwen2.5-0.5b")
  # The transformers 5 form: rope_theta and scaling inside rope_parameters.
  new = {k: v for k, v in LLAMA_3_2_1B.items() if k not in ("rope_scaling", "rope_theta")}
  new["rope_parameters"] = {**LLAMA_3_2_1B["rope_scaling"], "rope_theta": 500000.0}
  assert hf.config_from_hf(new) == presets.get("llama-3.2-1b")
  # Sliding window switched on but reaching no layer (max_window_layers >= layers) is full attention.
  assert hf.config_from_hf({**QWEN2_5_0_5B, "use_sliding_window": True}) == presets.get("qwen2.5-0.5b")
  with pytest.raises(ValueError, match="use_sliding_window"):
    hf.config_from_hf({**QWEN2_5_0_5B, "use_sliding_window": True, "max_window_layers": 21})
  for name in presets.names():
    cfg = presets.get(name)
    assert hf.config_from_hf(json.loads(json.dumps(hf.config_to_hf(cfg)))) == cfg, name


@pytest.mark.parametrize("change, match", [
  ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "GPT2LMHeadModel"),
  ({"architectures": None, "model_type": "mistral"}, "mistral"),
  ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
  ({"rope_scaling": None, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "linear"),
  ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
  ({"mlp_bias": True}, "mlp_bias"),
  ({"hidden_act": "gelu"}, "gelu"),
  ({"hidden_size": None}, "hidden_size"),
])
def test_unsupported_configs(change, match):
  with pytest.raises(ValueError, match=match):
    hf.config_from_hf({**LLAMA_3_2_1B, **change})


def test_unsupported_architecture_checkpoint(tmp_path):
  with open(tmp_path / "config.json", "w") as f:
    json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 128, "n_embd": 64}, f)
  with pytest.raises(ValueError, match="GPT2LMHeadModel"):
    hf.load(str(tmp_path))


# ------------------------------------------------------------------------------------------------
# Tensor errors


def _rewrite(directory, fn) -> None:
  from safetensors.numpy import load_file, save_file

  path = os.path.join(directory, hf.WEIGHTS_FILE)
  save_file(fn(load_file(path)), path, metadata={"format": "pt"})


def test_tensor_errors(tmp_path):
  cfg = ROUND_TRIP["qwen2_tied"]
  params = _random_params(cfg, seed=4)
  d = str(tmp_path)
  name = "model.layers.1.mlp.up_proj.weight"

  hf.save(d, cfg, params)
  _rewrite(d, lambda t: {k: v for k, v in t.items() if k != name})
  with pytest.raises(hf.MissingTensorError, match=rf"{name}.*{hf.WEIGHTS_FILE}"):
    hf.load(d)

  hf.save(d, cfg, params, max_shard_bytes=40_000)
  with open(tmp_path / hf.INDEX_FILE) as f:
    index = json.load(f)
  del index["weight_map"][name]
  with open(tmp_path / hf.INDEX_FILE, "w") as f:
    json.dump(index, f)
  with pytest.raises(hf.MissingTensorError, match=rf"{name}.*{hf.INDEX_FILE}"):
    hf.load(d)

  hf.save(d, cfg, params)
  _rewrite(d, lambda t: {**t, "model.layers.0.self_attn.o_proj.bias": np.zeros(64, np.float32)})
  with pytest.raises(ValueError, match="model.layers.0.self_attn.o_proj.bias"):
    hf.load(d)

  # Tolerated: rotary inv_freq buffers, and lm_head.weight in a tied checkpoint.
  hf.save(d, cfg, params)
  _rewrite(d, lambda t: {**t, "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32),
                         "lm_head.weight": t["model.embed_tokens.weight"]})
  _assert_same(hf.load(d)[1], params)

  # A shape that disagrees with config.json.
  with open(tmp_path / "config.json") as f:
    config = json.load(f)
  with open(tmp_path / "config.json", "w") as f:
    json.dump({**config, "intermediate_size": 96}, f)
  with pytest.raises(ValueError, match=r"gate_proj.weight.*shape"):
    hf.load(d)

  os.remove(tmp_path / hf.WEIGHTS_FILE)
  with pytest.raises(FileNotFoundError, match=hf.WEIGHTS_FILE):
    hf.load(d)

  # A Llama o_proj bias loads only when it is zero.
  cfg = ROUND_TRIP["llama_attention_bias"]
  hf.save(d, cfg, _random_params(cfg))
  _rewrite(d, lambda t: {**t, "model.layers.1.self_attn.o_proj.bias": np.ones(64, np.float32)})
  with pytest.raises(ValueError, match="model.layers.1.self_attn.o_proj.bias"):
    hf.load(d)


# ------------------------------------------------------------------------------------------------
# Tokenizer


def test_load_tokenizer(tmp_path):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|pad|>", "<|endoftext|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["the cat sat on the mat", "12 + 30 = 42", "hello world"] * 20, trainer)
  tok.save(str(tmp_path / "tokenizer.json"))
  with open(tmp_path / "tokenizer_config.json", "w") as f:
    json.dump({"eos_token": "<|endoftext|>", "pad_token": {"content": "<|pad|>"}}, f)

  t = hf.load_tokenizer(str(tmp_path))
  assert (t.pad_id, t.eos_id, t.bos_id) == (0, 1, None) and t.vocab_size == tok.get_vocab_size()
  for text in ["the cat sat on the mat", "12 + 30 = 42", "Unseen: ünïcode & tabs\t!"]:
    ids = t.encode(text)
    assert ids and all(0 <= i < t.vocab_size for i in ids)
    assert t.decode(ids) == text
    assert t.decode(ids + [t.eos_id, ids[0]]) == text
