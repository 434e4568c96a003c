"""Token scores without the whole [B, T, V] logits: chunked equals whole, in values and gradients, and the
compiled update's peak memory shrinks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm.models import presets, scoring, transformer
from rl_lm.rl import losses

pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")  # repeated programs load, not compile


def _batch(cfg, B=3, T=11, seed=0):
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T)), jnp.int32)
  mask = np.ones((B, T), bool)
  mask[1, :3] = False  # left padding
  mask[2, 8:] = False  # right padding
  return tokens, jnp.asarray(mask)


@pytest.fixture(scope="module")
def model():
  cfg = presets.get("test")
  return cfg, transformer.init(cfg, jax.random.key(0))


def test_whole_sequence_scores_are_the_formulas_on_the_forward_logits(model):
  cfg, params = model
  tokens, mask = _batch(cfg)
  s = scoring.score_tokens(cfg, params, tokens, mask, temperature=0.7)
  logits = transformer.forward(cfg, params, tokens, mask)  # [B, T, V]
  np.testing.assert_allclose(s.logp, losses.next_token_logprobs(logits, tokens, 0.7), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(s.entropy[:, 1:], losses.entropy_from_logits(logits[:, :-1] / 0.7), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(s.hit[:, 1:], jnp.argmax(logits[:, :-1], -1) == tokens[:, 1:])
  assert float(jnp.abs(s.logp[:, 0]).max()) == 0.0 and float(jnp.abs(s.entropy[:, 0]).max()) == 0.0


@pytest.mark.parametrize("chunk", [1, 3, 4, 9])  # T - 1 = 10 positions: padded (3, 4, 9) and exact (1) splits
def test_chunked_scores_and_gradients_equal_the_whole_sequence(model, chunk):
  cfg, params = model
  tokens, mask = _batch(cfg)
  comp = mask & (jnp.arange(tokens.shape[1]) >= 4)[None]  # a "completion" part

  def loss(p, c):
    s = scoring.score_tokens(cfg.replace(logit_chunk=c), p, tokens, mask, temperature=0.9)
    return losses.aggregate(-s.logp, comp, "token-mean") - 0.1 * losses.aggregate(s.entropy, comp, "token-mean")

  whole = scoring.score_tokens(cfg, params, tokens, mask, 0.9)
  parts = scoring.score_tokens(cfg.replace(logit_chunk=chunk), params, tokens, mask, 0.9)
  for a, b in zip(whole[:3], parts[:3], strict=True):  # logp, entropy, hit (no teacher: no divergence)
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6, atol=1e-6)
  g_whole = jax.grad(loss)(params, 0)
  g_parts = jax.grad(loss)(params, chunk)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g_whole, g_parts)


def test_chunking_cuts_the_compiled_peak_memory_of_a_large_vocabulary():
  cfg = presets.get("test").replace(vocab_size=32768, max_seq_len=512)
  params = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  tokens = jax.ShapeDtypeStruct((8, 256), jnp.int32)
  mask = jax.ShapeDtypeStruct((8, 256), jnp.bool_)

  def temp_bytes(chunk: int) -> int:
    c = cfg.replace(logit_chunk=chunk)
    grad = jax.grad(lambda p, t, m: jnp.sum(scoring.score_tokens(c, p, t, m).logp))
    return jax.jit(grad).lower(params, tokens, mask).compile().memory_analysis().temp_size_in_bytes

  naive, chunked = temp_bytes(0), temp_bytes(16)
  logits_bytes = 8 * 255 * 32768 * 4
  assert naive >= logits_bytes  # the whole float32 logits (at least) live at once
  assert chunked * 4 <= naive, (naive, chunked)
