"""The model: padding invariance, the KV-cache path against the full forward, heads, presets."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm.models import heads, presets, transformer

pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")  # repeated programs load, not compile

CFG = presets.get("test")


@pytest.fixture(scope="module")
def params():
  return transformer.init(CFG, jax.random.key(0))


def _tokens(B, T, seed=1):
  return jax.random.randint(jax.random.key(seed), (B, T), 3, CFG.vocab_size, jnp.int32)


def test_param_axes_match_params(params):
  jax.tree.map(lambda x, axes: chex.assert_rank(x, len(axes)), params, transformer.param_axes(CFG))
  n = sum(x.size for x in jax.tree.leaves(params))
  assert n == CFG.num_params()


def test_padding_does_not_change_real_tokens(params):
  toks = _tokens(1, 7)
  ref = transformer.forward(CFG, params, toks, jnp.ones((1, 7), bool))
  # The same row left-padded by 3 and right-padded by 3, in one batch.
  left = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), toks], axis=1)
  right = jnp.concatenate([toks, jnp.full((1, 3), 5, jnp.int32)], axis=1)
  mask_left = jnp.arange(10)[None] >= 3
  mask_right = jnp.arange(10)[None] < 7
  out = transformer.forward(CFG, params, jnp.concatenate([left, right]), jnp.concatenate([mask_left, mask_right]))
  np.testing.assert_allclose(out[0, 3:], ref[0], atol=1e-5)
  np.testing.assert_allclose(out[1, :7], ref[0], atol=1e-5)
  assert np.isfinite(np.asarray(out)).all()


def test_causality(params):
  toks = _tokens(2, 9)
  mask = jnp.ones((2, 9), bool)
  a = transformer.forward(CFG, params, toks, mask)
  b = transformer.forward(CFG, params, toks.at[:, 6:].set(7), mask)
  np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-6)
  assert np.abs(np.asarray(a[:, 6:] - b[:, 6:])).max() > 1e-3


@pytest.mark.parametrize("by_slot", [False, True], ids=["keys-transposed", "keys-by-slot"])
def test_cached_prefill_and_decode_match_forward(params, by_slot):
  B, T, S = 3, 10, 16
  toks = _tokens(B, T)
  mask = jnp.ones((B, T), bool).at[1, :4].set(False)  # row 1 left-padded
  full = transformer.forward(CFG, params, toks, mask)
  pos = transformer.positions_from_mask(mask)
  kv = jnp.zeros((B, S), bool).at[:, :T].set(mask)
  cache = transformer.init_cache(CFG, B, S, by_slot=by_slot)
  assert cache.k.shape == ((CFG.n_layers, B, CFG.n_kv_heads) + ((S, CFG.head_dim) if by_slot else (CFG.head_dim, S)))
  logits, cache = transformer.forward_cached(CFG, params, toks[:, :6], pos[:, :6], cache, 0, kv.at[:, 6:].set(False))
  np.testing.assert_allclose(np.asarray(logits)[np.asarray(mask[:, :6])], np.asarray(full[:, :6])[np.asarray(
    mask[:, :6])], atol=1e-5)
  for t in range(6, T):
    step, cache = transformer.forward_cached(CFG, params, toks[:, t:t + 1], pos[:, t:t + 1], cache, t,
                                             kv.at[:, t + 1:].set(False))
    np.testing.assert_allclose(step[:, 0], full[:, t], atol=1e-5)
  assert cache.by_slot == by_slot


def test_the_key_layouts_hold_the_same_keys_and_decode_alike(params):
  """A by-slot key cache is the transposed one, transposed: the first layer's keys and values written at the same
  slots (per-row writes included), exactly; the later layers' (which attended through either layout) and the logits
  to float32 rounding."""
  B, S = 2, 12
  toks = _tokens(B, 8)
  out = {}
  for by_slot in (False, True):
    cache = transformer.init_cache(CFG, B, S, by_slot=by_slot)
    kv = jnp.zeros((B, S), bool).at[:, :5].set(True)
    _, cache = transformer.forward_cached(CFG, params, toks[:, :5], jnp.arange(5)[None].repeat(B, 0), cache, 0, kv)
    index = jnp.asarray([5, 7])  # per row: row 1 skips two slots
    kv = kv.at[0, 5].set(True).at[1, 7].set(True)
    logits, cache = transformer.forward_cached(CFG, params, toks[:, 5:6], jnp.asarray([[5], [5]]), cache, index, kv)
    out[by_slot] = (logits, cache.k if by_slot else jnp.swapaxes(cache.k, -1, -2), cache.v)
  for i in (1, 2):
    np.testing.assert_array_equal(np.asarray(out[False][i][0]), np.asarray(out[True][i][0]))
    np.testing.assert_allclose(np.asarray(out[False][i]), np.asarray(out[True][i]), atol=1e-6)
  assert np.count_nonzero(np.asarray(out[True][1][0, 1, :, 5:7])) == 0  # row 1's skipped slots stay empty
  np.testing.assert_allclose(np.asarray(out[False][0]), np.asarray(out[True][0]), atol=1e-5)


def test_key_layout_auto_is_by_slot_on_accelerators_only():
  assert transformer.keys_by_slot("auto", "cpu") is False
  assert transformer.keys_by_slot("auto", "tpu") is True and transformer.keys_by_slot("auto", "gpu") is True
  assert transformer.keys_by_slot("by_slot", "cpu") is True and transformer.keys_by_slot("transposed", "tpu") is False
  assert transformer.keys_by_slot("auto") is (jax.default_backend() != "cpu")
  with pytest.raises(ValueError, match="key layout 'rows'"):
    transformer.keys_by_slot("rows")


def test_bfloat16_compute_is_close_to_float32(params):
  toks = _tokens(2, 8)
  mask = jnp.ones((2, 8), bool)
  f32 = jax.nn.log_softmax(transformer.forward(CFG, params, toks, mask))
  bf16 = jax.nn.log_softmax(transformer.forward(CFG.replace(dtype="bfloat16"), params, toks, mask))
  assert bf16.dtype == jnp.float32
  diff = np.abs(np.asarray(f32 - bf16)).max()
  assert 0 < diff < 0.1


def test_qkv_bias_and_untied_head_change_outputs():
  cfg = CFG.replace(qkv_bias=True, tie_embeddings=False)
  p = transformer.init(cfg, jax.random.key(3))
  assert "lm_head" in p and "bq" in p["layers"]
  toks, mask = _tokens(1, 5), jnp.ones((1, 5), bool)
  base = transformer.forward(cfg, p, toks, mask)
  p["layers"]["bk"] = p["layers"]["bk"] + 0.5
  assert np.abs(np.asarray(transformer.forward(cfg, p, toks, mask) - base)).max() > 1e-4


def test_rope_positions_rotate_and_preserve_norm():
  cfg = CFG
  x = jax.random.normal(jax.random.key(0), (1, 4, 2, cfg.head_dim))
  cos, sin = transformer.rope_tables(cfg, jnp.arange(4)[None])
  y = transformer.apply_rope(x, cos, sin)
  np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
  np.testing.assert_allclose(y[:, 0], x[:, 0], atol=1e-6)  # position 0 is the identity
  # Dot products depend only on the relative position.
  q, k = x[:, :1], x[:, 1:2]
  def dot(pq, pk):
    cq, sq = transformer.rope_tables(cfg, jnp.array([[pq]]))
    ck, sk = transformer.rope_tables(cfg, jnp.array([[pk]]))
    return jnp.sum(transformer.apply_rope(q, cq, sq) * transformer.apply_rope(k, ck, sk))
  np.testing.assert_allclose(dot(3, 1), dot(7, 5), rtol=1e-4)


def test_llama3_rope_scaling_bands():
  cfg = CFG.replace(head_dim=32, rope_theta=500000.0, rope_scaling=(8.0, 1.0, 4.0, 64))
  base = transformer.rope_frequencies(CFG.replace(head_dim=32, rope_theta=500000.0))
  scaled = transformer.rope_frequencies(cfg)
  wavelen = 2 * np.pi / base
  high = wavelen < 64 / 4  # short wavelengths untouched
  low = wavelen > 64 / 1  # long wavelengths divided by the factor
  np.testing.assert_allclose(scaled[high], base[high])
  np.testing.assert_allclose(scaled[low], base[low] / 8.0, rtol=1e-6)
  mid = ~high & ~low
  assert mid.any() and np.all(scaled[mid] <= base[mid]) and np.all(scaled[mid] >= base[mid] / 8.0)


def test_scalar_head_reads_last_real_token(params):
  hp = heads.init(CFG, jax.random.key(1), backbone=params)
  hp["head"]["w"] = jax.random.normal(jax.random.key(2), (CFG.d_model,))
  toks = _tokens(2, 6)
  mask = jnp.array([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]], bool)
  values = heads.forward(CFG, hp, toks, mask)
  assert values.shape == (2, 6) and values.dtype == jnp.float32
  score = heads.last_token_score(CFG, hp, toks, mask)
  np.testing.assert_allclose(score, jnp.stack([values[0, 3], values[1, 5]]), rtol=1e-6)


@pytest.mark.parametrize("name,expected", [("qwen2.5-0.5b", 494.0e6), ("qwen2.5-1.5b", 1543.7e6),
                                           ("llama-3.2-1b", 1235.8e6), ("llama-3.1-8b", 8030.3e6)])
def test_presets_have_the_released_parameter_counts(name, expected):
  assert abs(presets.get(name).num_params() - expected) / expected < 0.002


def test_preset_errors():
  with pytest.raises(KeyError, match="known"):
    presets.get("gpt-5")
  with pytest.raises(ValueError, match="n_kv_heads"):
    CFG.replace(n_kv_heads=3)
