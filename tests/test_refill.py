"""Continuous batching against the static batch: the same tokens greedily, the trainer's log-probs when sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import sampling
from rl_lm.models import presets, transformer

CFG = presets.get("test")


@pytest.fixture(scope="module")
def params():
  return transformer.init(CFG, jax.random.key(0), std=0.1)


def _prompts(lengths, P, seed=1):
  toks = np.array(jax.random.randint(jax.random.key(seed), (len(lengths), P), 3, 100, jnp.int32))
  for i, n in enumerate(lengths):
    toks[i, n:] = 0
  return jnp.asarray(toks), jnp.asarray(lengths, jnp.int32)


@pytest.mark.parametrize("slots, key_layout", [(3, "auto"), (10, "auto"), (3, "by_slot")])
def test_greedy_equals_the_static_batch(params, slots, key_layout):
  # 10 prompts of different lengths and budgets through 3 slots (refilled as rows stop) or 10 (no refill); keys
  # by slot: the per-row writes of the refill step in the other layout.
  prompts, lengths = _prompts([8, 3, 5, 1, 7, 2, 8, 4, 6, 1], 8)
  budgets = jnp.asarray([12, 3, 7, 12, 1, 9, 5, 12, 2, 10], jnp.int32)
  cfg = sampling.SamplingConfig(max_new_tokens=12, greedy=True, pad_id=0, key_layout=key_layout)
  # A stop token the greedy rows actually emit, so that some rows stop early on it.
  probe = sampling.generate(CFG, params, prompts, lengths, jax.random.key(0), cfg)
  stop = int(np.asarray(probe.tokens)[0, 8 + 2])
  static = sampling.generate(CFG, params, prompts, lengths, jax.random.key(0), cfg, stop_tokens=[stop],
                             max_new_tokens=budgets)
  ours = sampling.make_generate_fn(CFG, cfg, slots=slots)(params, prompts, lengths, jax.random.key(0),
                                                          stop_tokens=[stop], max_new_tokens=budgets)
  for field in ("tokens", "prompt_mask", "completion_mask", "lengths", "finished"):
    np.testing.assert_array_equal(np.asarray(getattr(ours, field)), np.asarray(getattr(static, field)), err_msg=field)
  np.testing.assert_allclose(np.asarray(ours.logprobs), np.asarray(static.logprobs), atol=1e-5)
  assert np.asarray(static.finished).any() and not np.asarray(static.finished).all()  # both kinds of ending
  assert len(set(np.asarray(static.lengths).tolist())) > 3


def test_sampled_logprobs_are_the_trainers_and_a_prompt_sample_ignores_its_batch(params):
  prompts, lengths = _prompts([6, 2, 4, 6, 3, 5], 6)
  cfg = sampling.SamplingConfig(max_new_tokens=10, temperature=0.8, top_p=0.95)
  out = sampling.make_generate_fn(CFG, cfg, slots=2)(params, prompts, lengths, jax.random.key(3))
  trainer = sampling.completion_logprobs(CFG, params, out, temperature=0.8)
  assert np.abs(np.asarray(trainer - out.logprobs)).max() < 1e-4
  # The same prompts through 4 slots (a different schedule) draw the same samples.
  again = sampling.make_generate_fn(CFG, cfg, slots=4)(params, prompts, lengths, jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(out.tokens))
  assert len({tuple(r) for r in np.asarray(out.tokens)[:, 6:].tolist()}) == 6


def test_sampled_tokens_equal_the_static_batch():
  # One decode engine, one key per prompt: continuous batching draws the static batch's tokens when sampling too,
  # whatever the slots and windows (top-k and top-p on, budgets differing by row).
  params = transformer.init(CFG, jax.random.key(4), std=0.1)
  prompts, lengths = _prompts([5, 2, 8, 3, 1, 6, 4], 8, seed=2)
  budgets = jnp.asarray([10, 3, 7, 10, 1, 9, 5], jnp.int32)
  cfg = sampling.SamplingConfig(max_new_tokens=10, temperature=0.9, top_k=40, top_p=0.95, window=3)
  static = sampling.generate(CFG, params, prompts, lengths, jax.random.key(8), cfg, max_new_tokens=budgets)
  ours = sampling.make_generate_fn(CFG, cfg, slots=3)(params, prompts, lengths, jax.random.key(8),
                                                      max_new_tokens=budgets)
  for field in ("tokens", "completion_mask", "lengths", "finished"):
    np.testing.assert_array_equal(np.asarray(getattr(ours, field)), np.asarray(getattr(static, field)), err_msg=field)
  np.testing.assert_allclose(np.asarray(ours.logprobs), np.asarray(static.logprobs), atol=1e-5)
  assert np.asarray(static.lengths).tolist() == np.asarray(budgets).tolist()  # no stop tokens: every budget ran


def test_bad_slots_raise():
  with pytest.raises(ValueError, match="slots"):
    sampling.make_generate_fn(CFG, sampling.SamplingConfig(max_new_tokens=4), slots=-1)
