"""The KV-cache sampler against the full forward, and the sampling distributions against the softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rl_lm import sampling
from rl_lm.models import presets, transformer
from rl_lm.rollout import draw, engine

CFG = presets.get("test")


@pytest.fixture(scope="module")
def params():
  return transformer.init(CFG, jax.random.key(0), std=0.1)  # larger weights: peakier, more varied outputs


def _prompts(lengths, P, seed=1):
  toks = np.array(jax.random.randint(jax.random.key(seed), (len(lengths), P), 3, 100, jnp.int32))
  for i, n in enumerate(lengths):
    toks[i, n:] = 0
  return jnp.asarray(toks), jnp.asarray(lengths, jnp.int32)


@pytest.mark.parametrize("window", [64, 3])  # 3: decode in segments attending over 11, 14, 18 slots
def test_greedy_matches_full_forward(params, window):
  prompts, lengths = _prompts([8, 3, 5, 1], 8)
  cfg = sampling.SamplingConfig(max_new_tokens=10, greedy=True, window=window)
  out = sampling.generate(CFG, params, prompts, lengths, jax.random.key(0), cfg)
  P = prompts.shape[1]
  mask = out.prompt_mask | out.completion_mask
  logits = transformer.forward(CFG, params, out.tokens, mask)
  # Every completion token is the argmax of the full forward at the slot before it.
  argmax = np.asarray(jnp.argmax(logits, axis=-1))
  toks, cm = np.asarray(out.tokens), np.asarray(out.completion_mask)
  for b in range(4):
    for t in range(P, P + 10):
      if cm[b, t]:
        assert toks[b, t] == argmax[b, t - 1], (b, t)
  trainer = sampling.completion_logprobs(CFG, params, out)
  assert np.abs(np.asarray(trainer - out.logprobs)).max() < 1e-4
  assert np.all(np.asarray(out.lengths) == 10) and not np.any(np.asarray(out.finished))


@pytest.mark.parametrize("window, key_layout", [(64, "auto"), (2, "auto"), (2, "by_slot")])
def test_sampled_logprobs_match_trainer_at_temperature(params, window, key_layout):
  prompts, lengths = _prompts([6, 2, 4, 6], 6)
  cfg = sampling.SamplingConfig(max_new_tokens=12, temperature=0.7, top_k=30, top_p=0.9, window=window,
                                key_layout=key_layout)
  out = sampling.generate(CFG, params, prompts, lengths, jax.random.key(3), cfg)
  trainer = sampling.completion_logprobs(CFG, params, out, temperature=0.7)
  assert np.abs(np.asarray(trainer - out.logprobs)).max() < 1e-4
  assert np.all(np.asarray(out.logprobs)[np.asarray(out.completion_mask)] < 0)


def test_decode_windows_grow_to_the_whole_cache_and_change_no_token(params):
  assert engine.windows(16, 80, 64) == (80,)
  assert engine.windows(16, 2064, 64) == (80, 144, 272, 528, 1040, 2064)
  assert engine.windows(8, 18, 3) == (11, 14, 18)
  prompts, lengths = _prompts([6, 2, 4, 6], 6)
  outs = [sampling.generate(CFG, params, prompts, lengths, jax.random.key(5),
                            sampling.SamplingConfig(max_new_tokens=12, temperature=1.0, window=w)) for w in (12, 2)]
  np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))
  np.testing.assert_allclose(np.asarray(outs[0].logprobs), np.asarray(outs[1].logprobs), atol=1e-5)


def test_prompt_alone_and_in_padded_batch_agree(params):
  prompts, lengths = _prompts([7, 2, 5], 9)
  cfg = sampling.SamplingConfig(max_new_tokens=8, greedy=True)
  batch = sampling.generate(CFG, params, prompts, lengths, jax.random.key(0), cfg)
  for b in range(3):
    n = int(lengths[b])
    alone = sampling.generate(CFG, params, prompts[b:b + 1, :n], lengths[b:b + 1], jax.random.key(0), cfg)
    np.testing.assert_array_equal(np.asarray(alone.tokens)[0, n:], np.asarray(batch.tokens)[b, 9:])
    np.testing.assert_allclose(np.asarray(alone.logprobs)[0, n:], np.asarray(batch.logprobs)[b, 9:], atol=1e-5)


def test_top_k_1_equals_greedy(params):
  prompts, lengths = _prompts([5, 3], 5)
  greedy = sampling.generate(CFG, params, prompts, lengths, jax.random.key(0),
                             sampling.SamplingConfig(max_new_tokens=8, greedy=True))
  topk = sampling.generate(CFG, params, prompts, lengths, jax.random.key(9),
                           sampling.SamplingConfig(max_new_tokens=8, temperature=1.3, top_k=1))
  np.testing.assert_array_equal(greedy.tokens, topk.tokens)


def test_stop_tokens_and_budgets_per_row(params):
  prompts, lengths = _prompts([4, 4, 4], 4)
  free = sampling.generate(CFG, params, prompts, lengths, jax.random.key(0),
                           sampling.SamplingConfig(max_new_tokens=10, greedy=True))
  toks = np.asarray(free.tokens)[:, 4:]
  # Row 0 stops at its 3rd token, row 1 never (stop set empty), row 2 is cut by its budget of 5.
  stop = np.full((3, 2), -1, np.int32)
  stop[0, 0] = toks[0, 2]
  first = int(np.argmax(toks[0] == toks[0, 2]))
  out = sampling.generate(CFG, params, prompts, lengths, jax.random.key(0),
                          sampling.SamplingConfig(max_new_tokens=10, greedy=True, pad_id=0),
                          stop_tokens=jnp.asarray(stop), max_new_tokens=jnp.asarray([10, 10, 5]))
  lengths_out = np.asarray(out.lengths)
  assert lengths_out.tolist() == [first + 1, 10, 5]
  assert np.asarray(out.finished).tolist() == [True, False, False]
  cm = np.asarray(out.completion_mask)[:, 4:]
  for b in range(3):
    assert cm[b].sum() == lengths_out[b] and cm[b, : lengths_out[b]].all()
    assert np.all(np.asarray(out.tokens)[b, 4 + lengths_out[b]:] == 0)
    assert np.all(np.asarray(out.logprobs)[b, 4 + lengths_out[b]:] == 0)
    np.testing.assert_array_equal(np.asarray(out.tokens)[b, 4: 4 + lengths_out[b]], toks[b, : lengths_out[b]])


def _chi_square_pvalue(samples, probs):
  counts = np.bincount(samples, minlength=len(probs))
  probs = np.asarray(probs, np.float64)
  keep = probs > 0
  assert counts[~keep].sum() == 0, "drew a token of probability 0"
  expected = probs[keep] / probs[keep].sum() * len(samples)
  return stats.chisquare(counts[keep], expected).pvalue


def test_sample_token_frequencies_match_softmax():
  logits = jnp.asarray([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
  n = 40000
  cfg = sampling.SamplingConfig(max_new_tokens=1, temperature=0.8)
  toks, logp = sampling.sample_token(jnp.tile(logits, (n, 1)), jax.random.key(0), cfg)
  probs = np.asarray(jax.nn.softmax(logits / 0.8))
  assert _chi_square_pvalue(np.asarray(toks), probs) > 1e-3
  np.testing.assert_allclose(np.asarray(logp), np.log(probs)[np.asarray(toks)], rtol=1e-5)
  # The same test rejects a sampler whose distribution is off by a small bias on one token.
  biased, _ = sampling.sample_token(jnp.tile(logits.at[2].add(0.1), (n, 1)), jax.random.key(0), cfg)
  assert _chi_square_pvalue(np.asarray(biased), probs) < 1e-6


def test_inverse_cdf_picks_the_token_whose_cumulative_weight_crosses_u():
  # Two-level inverse CDF (blocks of ~sqrt(V) tokens) against a float64 cumulative sum: empty blocks, zero
  # weights, a vocabulary that is not a multiple of the block, and u at 0 and just below 1.
  rng = np.random.default_rng(0)
  for V in (1, 6, 37, 4096, 5000):
    w = rng.exponential(size=(64, V)).astype(np.float32)
    w[rng.random((64, V)) < 0.5] = 0.0
    w[:8, : V // 2] = 0.0  # whole leading blocks empty
    w[8:16, V // 2:] = 0.0  # trailing ones empty
    w[:, 0] = np.where(w.sum(axis=1) == 0, 1.0, w[:, 0])
    u = rng.random(64).astype(np.float32)
    u[:4], u[4:8] = 0.0, np.float32(1 - 2**-24)
    tok = np.asarray(draw._inverse_cdf(jnp.asarray(w), jnp.asarray(u)))
    assert np.all(w[np.arange(64), tok] > 0), "drew a token of weight 0"
    cdf = np.cumsum(w.astype(np.float64), axis=1)
    target = u * cdf[:, -1]
    below = np.where(tok > 0, cdf[np.arange(64), np.maximum(tok - 1, 0)], 0.0)
    slack = 1e-5 * cdf[:, -1]
    assert np.all(below <= target + slack) and np.all(target <= cdf[np.arange(64), tok] + slack)


def test_bisection_thresholds_equal_sorting():
  # Top-k by bisection on the values' bits keeps exactly what a sort keeps, ties and -inf included; top-p keeps
  # the smallest most-probable set reaching p (ties at its edge included), as the sorted cumulative sum says.
  rng = np.random.default_rng(0)
  for trial in range(6):
    x = rng.normal(size=(8, 500)).astype(np.float32) * (1 + trial)
    if trial % 2:
      x = np.round(x * 2) / 2  # many ties
    x[:, :20] = -np.inf
    for k in (1, 7, 50, 480):
      kth = -np.sort(-x, axis=1)[:, k - 1:k]
      np.testing.assert_array_equal(np.isfinite(np.asarray(sampling.filter_logits(jnp.asarray(x), k, 1.0))),
                                    x >= kth)
    for p in (0.3, 0.9):
      probs = np.asarray(jax.nn.softmax(jnp.asarray(x), axis=-1), np.float64)
      order = -np.sort(-probs, axis=1)
      edge = order[np.arange(8), np.argmax(np.cumsum(order, axis=1) >= p, axis=1)][:, None]
      kept = np.isfinite(np.asarray(sampling.filter_logits(jnp.asarray(x), 0, p)))
      # Exact up to float32 summation order: a token within 1e-5 (relative) of the edge may go either way.
      assert np.all(kept[probs > edge * (1 + 1e-5)]) and not np.any(kept[probs < edge * (1 - 1e-5)])
      assert np.all((probs * kept).sum(axis=1) >= p - 1e-5)


def test_top_k_and_top_p_truncate_and_renormalise():
  probs = np.array([0.5, 0.3, 0.15, 0.05])
  logits = jnp.asarray(np.log(probs), jnp.float32)
  n = 30000
  for cfg, allowed in [(sampling.SamplingConfig(max_new_tokens=1, top_p=0.8), 2),
                       (sampling.SamplingConfig(max_new_tokens=1, top_p=0.81), 3),
                       (sampling.SamplingConfig(max_new_tokens=1, top_k=2), 2),
                       (sampling.SamplingConfig(max_new_tokens=1, top_k=3, top_p=0.7), 2)]:
    toks, logp = sampling.sample_token(jnp.tile(logits, (n, 1)), jax.random.key(1), cfg)
    expected = np.where(np.arange(4) < allowed, probs, 0.0)
    assert _chi_square_pvalue(np.asarray(toks), expected / expected.sum()) > 1e-3, cfg
    # Reported log-probs stay those of the untruncated distribution.
    np.testing.assert_allclose(np.asarray(logp), np.log(probs)[np.asarray(toks)], rtol=1e-5)


def test_generate_frequencies_match_model_softmax():
  cfg = presets.get("test", vocab_size=8)
  p = transformer.init(cfg, jax.random.key(5), std=0.3)
  n = 8192
  prompts = jnp.tile(jnp.asarray([[1, 4, 6]], jnp.int32), (n, 1))
  lengths = jnp.full((n,), 3, jnp.int32)
  out = sampling.generate(cfg, p, prompts, lengths, jax.random.key(7),
                          sampling.SamplingConfig(max_new_tokens=1, temperature=1.5))
  probs = np.asarray(jax.nn.softmax(transformer.forward(cfg, p, prompts[:1], jnp.ones((1, 3), bool))[0, -1] / 1.5))
  assert probs.max() < 0.9  # a non-degenerate distribution
  assert _chi_square_pvalue(np.asarray(out.tokens)[:, 3], probs) > 1e-3


def test_sampling_config_rejects_bad_values():
  with pytest.raises(ValueError, match="temperature"):
    sampling.SamplingConfig(max_new_tokens=4, temperature=0.0)
  with pytest.raises(ValueError, match="top_p"):
    sampling.SamplingConfig(max_new_tokens=4, top_p=0.0)
  with pytest.raises(ValueError, match="max_new_tokens"):
    sampling.SamplingConfig(max_new_tokens=0)


def test_a_draw_over_a_sharded_vocabulary_stays_sharded_and_draws_the_same():
  """Logits split over 8 devices along the vocabulary (the tensor axis): the draw runs on each device's shard (no
  all-gather of the [B, V] logits, which Llama-3's 128,256 tokens in 251 blocks forced), and draws the same tokens
  as one device, with the same log-probs to float32 rounding (the normaliser sums the shards in another order)."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from rl_lm.aot import hlo

  B, V = 4, 4000  # 63 blocks of 64 before the padding to a multiple of 8: not whole blocks on 8 shards
  mesh = Mesh(np.array(jax.devices()[:8]), ("tensor",))
  logits = jax.random.normal(jax.random.key(0), (B, V)) * 3
  keys = jax.vmap(jax.random.key)(jnp.arange(B))
  cfg = sampling.SamplingConfig(max_new_tokens=1, temperature=0.9, top_p=0.95)
  fn = jax.jit(lambda x, k: draw.sample_token(x, None, cfg, row_keys=k))
  sharded = jax.device_put(logits, NamedSharding(mesh, PartitionSpec(None, "tensor")))
  text = fn.lower(sharded, keys).compile().as_text()
  gathered = hlo.collectives(text)["all-gather"][1]
  assert gathered < B * V * 4 / 8, gathered  # at most block totals and one block per row, never the logits
  one, eight = fn(logits, keys), fn(sharded, keys)
  np.testing.assert_array_equal(np.asarray(one[0]), np.asarray(eight[0]))
  np.testing.assert_allclose(np.asarray(one[1]), np.asarray(eight[1]), rtol=1e-6)
