"""Random keys at the library's edge (rl_lm/keys.py): every sampler takes a typed key or a legacy uint32[2] key and
draws the same tokens from both; per-row keys are their own argument, never guessed from a shape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import keys, sampling
from rl_lm.envs import episodes
from rl_lm.models import presets, transformer
from rl_lm.tasks.base import Problem
from tests.test_multiturn import _runner

CFG = presets.get("test")
CONFIG = sampling.SamplingConfig(max_new_tokens=6, temperature=1.0, pad_id=0)


@pytest.fixture(scope="module")
def params():
  return transformer.init(CFG, jax.random.PRNGKey(0), std=0.1)  # a legacy key initialises too


def _prompts():
  return jnp.asarray([[5, 6, 7, 0], [8, 9, 0, 0], [10, 11, 12, 13]], jnp.int32), jnp.asarray([3, 2, 4], jnp.int32)


def test_a_legacy_key_is_the_typed_key_of_the_same_seed():
  typed = keys.as_key(jax.random.PRNGKey(7))
  assert keys.is_typed(typed) and typed.shape == ()
  assert np.array_equal(jax.random.key_data(typed), jax.random.key_data(jax.random.key(7)))
  assert keys.as_key(jax.random.key(7)) is not None
  rows = keys.as_row_keys(jax.random.split(jax.random.PRNGKey(1), 3), 3)  # legacy split: uint32[3, 2]
  assert rows.shape == (3,) and keys.is_typed(rows)


@pytest.mark.parametrize("bad, match", [
  (jnp.zeros((3, 2), jnp.uint32), r"one random key .* got uint32\[3, 2\]"),
  (jnp.zeros((2,), jnp.int32), r"got int32\[2\]"),
  (jax.random.split(jax.random.key(0), 3), "per-row keys are the separate row_keys argument"),
])
def test_anything_else_is_refused_in_one_line(bad, match):
  with pytest.raises(ValueError, match=match):
    keys.as_key(bad)


def test_sample_token_takes_one_key_or_row_keys_never_both():
  logits = jnp.zeros((3, 10))
  with pytest.raises(ValueError, match="one of rng"):
    sampling.sample_token(logits, jax.random.key(0), CONFIG, row_keys=jax.random.split(jax.random.key(0), 3))
  with pytest.raises(ValueError, match="one of rng"):
    sampling.sample_token(logits, None, CONFIG)
  # Per-row keys: row b's draw is its key's, whatever the other rows are (legacy [B, 2] or typed [B]).
  row_keys = jax.random.split(jax.random.key(4), 3)
  a, _ = sampling.sample_token(logits, None, CONFIG, row_keys=row_keys)
  b, _ = sampling.sample_token(logits, None, CONFIG, row_keys=jax.random.key_data(row_keys))
  c, _ = sampling.sample_token(logits[:1], None, CONFIG, row_keys=row_keys[:1])
  assert np.array_equal(a, b) and a[0] == c[0]


def test_every_sampler_draws_the_same_tokens_from_either_key(params):
  prompts, lengths = _prompts()
  for make in (lambda: sampling.make_generate_fn(CFG, CONFIG), lambda: sampling.make_generate_fn(CFG, CONFIG, slots=2)):
    fn = make()
    typed = fn(params, prompts, lengths, jax.random.key(3))
    legacy = fn(params, prompts, lengths, jax.random.PRNGKey(3))
    other = fn(params, prompts, lengths, jax.random.key(4))
    assert np.array_equal(typed.tokens, legacy.tokens) and np.array_equal(typed.logprobs, legacy.logprobs)
    assert not np.array_equal(typed.tokens, other.tokens)  # the key matters: the sample is not greedy
  typed = sampling.generate(CFG, params, prompts, lengths, jax.random.key(3), CONFIG)
  legacy = sampling.generate(CFG, params, prompts, lengths, jax.random.PRNGKey(3), CONFIG)
  assert np.array_equal(typed.tokens, legacy.tokens)


def test_multi_turn_episodes_take_either_key(params):
  runner = _runner(2, episodes.EpisodeLimits(max_turns=2, turn_tokens=6, max_tokens=48))
  problems = [Problem(id=f"p{i}", prompt=f"{i}+{i}=", answer=str(2 * i)) for i in range(2)]
  typed = runner.run(params, problems, jax.random.key(5), seeds=[0, 1])
  legacy = runner.run(params, problems, jax.random.PRNGKey(5), seeds=[0, 1])
  assert np.array_equal(typed.host.tokens, legacy.host.tokens)
  assert np.array_equal(typed.device.logprobs, legacy.device.logprobs)
