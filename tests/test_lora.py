"""LoRA: zero-initialised adapters change nothing, merged equals unmerged, only adapters train (the base, which is
the reference, stays bitwise), adapters are sharded like their base weights, and RL with LoRA learns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import mesh as mesh_lib
from rl_lm.models import lora, presets, transformer


@pytest.fixture(scope="module")
def model():
  cfg = presets.get("test")
  return cfg, transformer.init(cfg, jax.random.key(0))


def _batch(cfg):
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 9)), jnp.int32)
  mask = jnp.asarray(np.array([[True] * 9, [False] * 2 + [True] * 7]))
  return tokens, mask


def _random_b(adapters, seed=2):
  keys = iter(jax.random.split(jax.random.key(seed), 100))
  return jax.tree.map(lambda x: 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), adapters)


def test_zero_b_leaves_the_logits_exactly_as_they_were(model):
  cfg, params = model
  lcfg = lora.LoraConfig(rank=4, alpha=8.0)
  adapters = lora.init(cfg, lcfg, jax.random.key(1))
  assert all(float(jnp.abs(ab["b"]).max()) == 0 for ab in adapters["layers"].values())
  assert all(float(jnp.abs(ab["a"]).max()) > 0 for ab in adapters["layers"].values())
  tokens, mask = _batch(cfg)
  base = transformer.forward(cfg, params, tokens, mask)
  np.testing.assert_array_equal(transformer.forward(cfg, lora.combine(params, adapters, lcfg), tokens, mask), base)


@pytest.mark.parametrize("targets", [("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"), ("wq", "wv")])
def test_merged_weight_gives_the_unmerged_forward(model, targets):
  cfg, params = model
  lcfg = lora.LoraConfig(rank=3, alpha=6.0, targets=targets)
  adapters = _random_b(lora.init(cfg, lcfg, jax.random.key(1)))
  tokens, mask = _batch(cfg)
  unmerged = transformer.forward(cfg, lora.combine(params, adapters, lcfg), tokens, mask)
  merged = lora.merge(params, adapters, lcfg)
  np.testing.assert_allclose(transformer.forward(cfg, merged, tokens, mask), unmerged, rtol=1e-5, atol=1e-5)
  assert not np.allclose(unmerged, transformer.forward(cfg, params, tokens, mask), atol=1e-3)  # they do something
  # W + (alpha / r) A B, by hand for one weight of one layer
  a = np.asarray(adapters["layers"]["wq"]["a"][0])  # [D, r]
  b = np.asarray(adapters["layers"]["wq"]["b"][0])  # [r, H, Dh]
  want = np.asarray(params["layers"]["wq"][0]) + 2.0 * np.einsum("dr,rhk->dhk", a, b)
  np.testing.assert_allclose(merged["layers"]["wq"][0], want, rtol=1e-5, atol=1e-6)
  untouched = [k for k in params["layers"] if k not in targets]
  for k in untouched:
    np.testing.assert_array_equal(merged["layers"][k], params["layers"][k])


def test_adapters_are_sharded_like_their_base_weights():
  cfg = presets.get("test")
  lcfg = lora.LoraConfig(rank=4, alpha=8.0)
  mesh = mesh_lib.make_mesh(2, 2, 2)
  rules = mesh_lib.DEFAULT_RULES
  base_axes, ad_axes = transformer.param_axes(cfg)["layers"], lora.param_axes(cfg, lcfg)["layers"]
  shapes = transformer.param_shapes(cfg)["layers"]
  ad = jax.eval_shape(lambda: lora.init(cfg, lcfg, jax.random.key(0)))["layers"]
  for name in lcfg.targets:
    n = lora.INPUT_AXES[name]
    base = mesh_lib.named_sharding(mesh, base_axes[name], rules, shapes[name]).spec
    a = mesh_lib.named_sharding(mesh, ad_axes[name]["a"], rules, ad[name]["a"].shape).spec
    b = mesh_lib.named_sharding(mesh, ad_axes[name]["b"], rules, ad[name]["b"].shape).spec
    pad = lambda spec, k: tuple(spec) + (None,) * (k - len(spec))
    base, a, b = pad(base, len(shapes[name])), pad(a, n + 2), pad(b, len(shapes[name]) - n + 1)
    assert a[: 1 + n] == base[: 1 + n] and a[1 + n] is None, (name, a, base)  # inputs as the weight, rank whole
    assert b[0] == base[0] and b[1] is None and b[2:] == base[1 + n:], (name, b, base)


@pytest.mark.slow
def test_rl_with_lora_trains_only_the_adapters_and_learns(tmp_path):
  from rl_lm.train.context import make_context
  from rl_lm.train.rl import RLTrainer
  from tests.test_rl_loop import smoke_config

  config = smoke_config("test_rl_starts_with_digit", prompts_per_step=16, group_size=8, minibatches=4,
                        learning_rate=3e-3, steps=30)
  config.sampling.max_new_tokens = 4
  config.model.lora.rank = 8
  config.model.lora.alpha = 16.0
  lines = []
  ctx = make_context(config, str(tmp_path))
  # A random model's tied embeddings (std 0.02) bound its logits to about +-1.3, which adapters on the layers cannot
  # widen (the final norm fixes the hidden scale); scaled by 5 they span what a pretrained model's logits span.
  ctx.policy = {**ctx.policy, "embed": ctx.policy["embed"] * 5.0}
  base_before = jax.tree.map(np.asarray, ctx.policy)
  trainer = RLTrainer(ctx, log=lines.append)
  assert trainer.reference is ctx.policy  # the reference is the base: no second copy of the weights
  n_adapters = lora.num_params(trainer.state.policy.params)
  opt_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainer.state.policy.opt_state) if x.ndim)
  assert opt_params == 2 * n_adapters  # Adam's two moments, of the adapters only
  assert any(line.startswith("rl: LoRA rank 8 on wq, wk, wv, wo, w_gate, w_up, w_down") and "optimizer state" in line
             for line in lines), lines
  history = [trainer.train_step(step) for step in range(1, 31)]
  rewards = np.array([m["rollout/reward_mean"] for m in history])
  assert rewards[-5:].mean() > rewards[:5].mean() + 0.4 and rewards[-5:].mean() > 0.6, np.round(rewards, 2).tolist()
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, trainer.reference), base_before)  # frozen
  merged = trainer.merged(trainer.state.policy.params)
  tokens, mask = _batch(ctx.model_cfg)
  np.testing.assert_allclose(transformer.forward(ctx.model_cfg, merged, tokens, mask),
                             transformer.forward(ctx.model_cfg, trainer.policy(), tokens, mask), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_export_of_a_merged_smollm2_policy_loads_in_transformers_and_decodes_the_same(smollm2_folder, tmp_path,
                                                                                      request):
  """A LoRA-trained SmolLM2 (random adapters), merged and exported: transformers' greedy decoding equals ours,
  token for token, on 8 chat prompts."""
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from rl_lm import sampling
  from rl_lm.models import hf
  from rl_lm.tokenizer import HFTokenizer

  cfg, base = hf.load(str(smollm2_folder))
  lcfg = lora.LoraConfig(rank=4, alpha=8.0, targets=("wq", "wv", "w_down"))
  adapters = _random_b(lora.init(cfg, lcfg, jax.random.key(3)))
  merged = lora.merge(base, adapters, lcfg)
  files = hf.export(str(tmp_path / "out"), cfg, merged, str(smollm2_folder))
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)
  tok = HFTokenizer(str(tmp_path / "out"), chat=True)
  questions = [f"What is {a}+{b}?" for a, b in ((12, 34), (58, 10), (7, 9), (99, 1))] + [
    "Name a colour.", "Write a haiku about rain.", "What is the capital of France?", "Count to five."]
  ids = [tok.encode_prompt(q) for q in questions]
  new = 12
  prompts, lengths = sampling.pad_prompts(ids, tok.pad_id, multiple=8)
  scfg = sampling.SamplingConfig(max_new_tokens=new, greedy=True, stop_tokens=(-5,), pad_id=tok.pad_id)  # no stop
  out = sampling.generate(cfg, merged, prompts, lengths, jax.random.key(0), scfg)
  ours = np.asarray(out.tokens[:, prompts.shape[1]:])
  model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
  theirs_tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
  # One torch thread: beside another busy process (pytest -n 2 on 2 cores) torch's OpenMP threads wait on
  # each other at every op, and the 96 decode steps below took 150 s instead of 6 s.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  request.addfinalizer(lambda: torch.set_num_threads(threads))
  for i, q in enumerate(questions):
    want = theirs_tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert list(want) == ids[i]  # the same prompt tokens
    with torch.no_grad():
      # The mask is explicit: the prompt holds <|im_end|>, which is also the pad id transformers would mask out.
      x = torch.tensor([ids[i]])
      gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, eos_token_id=None, pad_token_id=tok.pad_id)
    np.testing.assert_array_equal(gen[0, len(ids[i]):].numpy(), ours[i], err_msg=q)
  base_out = sampling.generate(cfg, base, prompts, lengths, jax.random.key(0), scfg)
  assert not np.array_equal(np.asarray(base_out.tokens), np.asarray(out.tokens))  # the adapters changed the policy
