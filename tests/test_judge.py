"""The LLM judge's verdicts from its next-token distribution (rl_lm/rewards/judge.py): pointwise expectations by
hand, off-scale answers masked, the pairwise average invariant to swapping the pair, position bias measured."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import tokenizer as tokenizer_lib
from rl_lm.models import presets, transformer
from rl_lm.rewards import judge


def test_pointwise_score_is_the_expectation_over_the_score_tokens():
  p = np.asarray([[0.1, 0.1, 0.2, 0.3, 0.3, 0.0], [0.9, 0.08, 0.0, 0.01, 0.01, 0.0]])
  logp = jnp.log(jnp.asarray(p) + 1e-38)
  out = judge.pointwise(logp, jnp.asarray([2, 3, 4]), jnp.asarray([1.0, 2.0, 3.0]), min_mass=0.5)
  # row 0: mass 0.8, score (0.2 * 1 + 0.3 * 2 + 0.3 * 3) / 0.8; row 1: mass 0.02, off the scale
  np.testing.assert_allclose(np.asarray(out.mass), [0.8, 0.02], rtol=1e-5)
  assert float(out.score[0]) == pytest.approx(1.7 / 0.8, rel=1e-5)
  assert np.asarray(out.valid).tolist() == [True, False] and np.isnan(float(out.score[1]))


def _judge_logp(cfg, params, tok, texts):
  ids = [tok.encode_prompt(t) for t in texts]
  L = max(map(len, ids))
  tokens = np.full((len(ids), L), tok.pad_id, np.int32)
  for i, row in enumerate(ids):
    tokens[i, : len(row)] = row
  return judge.next_token_logprobs(cfg, params, jnp.asarray(tokens), jnp.asarray([len(r) for r in ids]))


def test_next_token_logprobs_are_the_full_forwards_last_position():
  cfg = presets.get("test")
  params = transformer.init(cfg, jax.random.key(0))
  tok = tokenizer_lib.CharTokenizer()
  texts = ["2+2=4. Score:", "7*8=56, right? Score:"]
  logp = _judge_logp(cfg, params, tok, texts)
  for i, t in enumerate(texts):
    ids = jnp.asarray([tok.encode_prompt(t)])
    full = jax.nn.log_softmax(transformer.forward(cfg, params, ids, jnp.ones_like(ids, bool))[0, -1])
    np.testing.assert_allclose(np.asarray(logp[i]), np.asarray(full), atol=1e-5)


def test_pairwise_average_is_invariant_to_swapping_the_pair():
  """A real (random) judge has a position bias of its own; the two-order average cancels it: P(A > B) computed with
  the pair swapped is exactly 1 - P(A > B)."""
  cfg = presets.get("test")
  params = transformer.init(cfg, jax.random.key(1))
  tok = tokenizer_lib.CharTokenizer()
  pairs = [("3+4=", "7", "8"), ("9-2=", "7.0", "7"), ("5*5=", "25", "twenty five")]
  render = lambda q, x, y: f"Q {q} 1: {x} 2: {y} Better:"  # noqa: E731
  ab = _judge_logp(cfg, params, tok, [render(q, a, b) for q, a, b in pairs])
  ba = _judge_logp(cfg, params, tok, [render(q, b, a) for q, a, b in pairs])
  one, two = tok.encode("1")[0], tok.encode("2")[0]
  p_a = judge.pairwise(ab, ba, one, two, min_mass=0.0)
  p_b = judge.pairwise(ba, ab, one, two, min_mass=0.0)
  np.testing.assert_allclose(np.asarray(p_a.p_first) + np.asarray(p_b.p_first), 1.0, atol=1e-6)
  assert not np.allclose(np.asarray(p_a.q_a_first), np.asarray(p_a.q_b_first), atol=1e-4)  # the orders differ


def test_position_bias_counts_first_picks_and_flips():
  # pair 0: picks A in both orders (consistent); pair 1: picks whichever is first (a flip); pair 2: invalid
  out = judge.Pairwise(jnp.asarray([0.8, 0.5, jnp.nan]), jnp.asarray([0.9, 0.7, 0.5]), jnp.asarray([0.7, 0.3, 0.5]),
                       jnp.asarray([True, True, False]))
  bias = judge.position_bias(out)
  # first picks: pair 0 picks A first-shown in order 1 (1) and A second-shown in order 2 (0): 0.5; pair 1: 1.0
  assert float(bias["judge/first_rate"]) == pytest.approx(0.75)
  assert float(bias["judge/flip_rate"]) == pytest.approx(0.5)
  assert float(bias["judge/invalid_frac"]) == pytest.approx(1 / 3)


def test_an_off_scale_pairwise_answer_is_masked():
  V = 8
  logp = jnp.log(jnp.full((1, V), 1.0 / V))
  out = judge.pairwise(logp, logp, 1, 2, min_mass=0.5)  # "1" and "2" hold 2/8 of the mass
  assert not bool(out.valid[0]) and np.isnan(float(out.p_first[0]))
