"""The curriculum (rl_lm.rl.curriculum) against hand-computed pass-rate estimates and weights.

With `decay=1` a prompt's Beta counts are plain sums, so every estimate below is a fraction worked out
by hand: estimate = (alpha + 2 * p0) / (alpha + beta + 2), with p0 = (A + 1) / (A + B + 2) the pooled
prior of the prompt's level (A, B: the level's summed counts). Draws are checked statistically with a
fixed seed, to within 5 binomial standard deviations.
"""

import pickle
from collections import Counter

import numpy as np
import pytest

from rl_lm.rl.curriculum import Curriculum, CurriculumConfig
from rl_lm.tasks.base import Problem


def pool(*levels: int, per_level: int = 1) -> list[Problem]:
  """`per_level` problems per level, ids "L<level>-<i>"."""
  return [Problem(id=f"L{lv}-{i}", prompt=f"{lv}+{i}=", answer=str(lv + i), difficulty=lv)
          for lv in levels for i in range(per_level)]


def cfg(**kw) -> CurriculumConfig:
  """No decay, and nothing retired or promoted unless a test asks for it."""
  base = dict(decay=1.0, floor=0.02, retire_above=1.0, min_attempts=10**9, initial_levels=1, promote_above=1.0,
              promote_min_seen=0.5)
  return CurriculumConfig(**{**base, **kw})


def draw_counts(cur: Curriculum, n: int) -> Counter:
  return Counter(p.id for _ in range(n) for p in cur.next_batch(1))


def within(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
  return abs(count - n * p) <= sigmas * np.sqrt(n * p * (1 - p))


def test_intermediate_prompts_are_drawn_most():
  problems = pool(1, per_level=3)  # L1-0 always solved, L1-1 never, L1-2 half the time
  cur = Curriculum(problems, cfg(), seed=0)
  cur.update(problems, [10, 0, 5], [10, 10, 10])
  # Level prior: A = 15, B = 15 -> p0 = 16 / 32 = 1/2, so the prior adds one success and one failure.
  np.testing.assert_allclose(cur.pass_estimate(), [11 / 12, 1 / 12, 6 / 12])
  w = np.array([11 / 12 * 1 / 12, 1 / 12 * 11 / 12, 1 / 4]) + 0.02  # p (1 - p) + floor
  probs = w / w.sum()  # about 0.208, 0.208, 0.583
  n = 3000
  counts = draw_counts(cur, n)
  for i, p in enumerate(probs):
    assert within(counts[f"L1-{i}"], n, p), (counts, probs)
  assert counts["L1-2"] > 2 * max(counts["L1-0"], counts["L1-1"])


def test_unseen_prompts_take_their_levels_pooled_prior():
  problems = pool(1, 2, 3, per_level=3)
  cur = Curriculum(problems, cfg(initial_levels=3), seed=0)
  np.testing.assert_allclose(cur.pass_estimate(), 0.5)  # nothing seen: Beta(1, 1) everywhere
  by_id = {p.id: p for p in problems}
  cur.update([by_id["L1-0"], by_id["L1-1"], by_id["L2-0"]], [0, 0, 8], [8, 8, 8])
  est = dict(zip([p.id for p in problems], cur.pass_estimate(), strict=True))
  # Level 1: A = 0, B = 16 -> p0 = 1/18. Level 2: A = 8, B = 0 -> p0 = 9/10. Level 3: unseen -> 1/2.
  assert est["L1-2"] == pytest.approx(1 / 18)  # unseen: exactly its level's prior
  assert est["L1-0"] == pytest.approx((0 + 2 / 18) / 10)
  assert est["L2-1"] == est["L2-2"] == pytest.approx(9 / 10)
  assert est["L2-0"] == pytest.approx((8 + 2 * 9 / 10) / 10)
  assert est["L3-0"] == est["L3-1"] == est["L3-2"] == pytest.approx(0.5)
  # An unseen prompt of a level the policy fails is not mistaken for an intermediate one: it is drawn
  # far less than an unseen prompt of a fresh level would be.
  w = lambda p: p * (1 - p)
  assert w(est["L1-2"]) < 0.25 * w(est["L3-0"])


def test_retirement_after_min_attempts_only():
  problems = pool(1, per_level=3)
  cur = Curriculum(problems, cfg(retire_above=0.9, min_attempts=16), seed=0)
  solved, half = problems[0], problems[1]
  cur.update([solved, half], [8, 4], [8, 8])
  # L1-0: level prior (12 + 1) / (16 + 2) = 13/18, estimate (8 + 26/18) / 10 = 0.944 > 0.9, but only 8 attempts.
  assert cur.pass_estimate()[0] == pytest.approx((8 + 26 / 18) / 10)
  assert not cur.retired.any()
  cur.update([solved, half], [8, 4], [8, 8])
  # 16 attempts now: L1-0 (estimate about 0.95) retires; L1-1 (about 0.5) does not, nor does unseen L1-2.
  assert cur.pass_estimate()[0] > 0.9
  assert cur.retired.tolist() == [True, False, False]
  assert cur.metrics()["curriculum/retired"] == 1.0
  assert "L1-0" not in draw_counts(cur, 300)
  # When everything open is retired, the curriculum falls back to the open pool rather than failing.
  cur.retired[:] = True
  assert {p.id for p in cur.next_batch(3)} == {"L1-0", "L1-1", "L1-2"}


def test_promotion_needs_a_high_mean_and_enough_of_the_level_seen():
  problems = pool(1, 2, 3, per_level=4)
  by_id = {p.id: p for p in problems}
  cur = Curriculum(problems, cfg(promote_above=0.6, promote_min_seen=0.5), seed=0)
  assert cur.open_levels == 1
  assert {p.difficulty for _ in range(50) for p in cur.next_batch(2)} == {1}
  cur.update([by_id["L1-0"]], [8], [8])  # estimate > 0.6, but 1 of 4 seen < 0.5 * 4
  assert cur.open_levels == 1
  cur.update([by_id["L1-1"]], [1], [8])  # 2 of 4 seen, but the mean estimate is below 0.6
  # Level 1: A = 9, B = 7 -> p0 = 10/18; estimates (8 + 20/18) / 10 and (1 + 20/18) / 10, mean 0.561.
  assert np.mean(cur.pass_estimate()[:2]) == pytest.approx(((8 + 20 / 18) + (1 + 20 / 18)) / 20)
  assert cur.open_levels == 1
  cur.update([by_id["L1-1"]], [8], [8])  # the mean estimate passes 0.6 with 2 of 4 seen: level 2 opens
  assert cur.open_levels == 2
  assert cur.metrics()["curriculum/highest_open_difficulty"] == 2.0
  assert {p.difficulty for _ in range(100) for p in cur.next_batch(2)} == {1, 2}
  # Only the highest open level counts: more level-1 successes do not open level 3 ...
  cur.update([by_id["L1-2"], by_id["L1-3"]], [8, 8], [8, 8])
  assert cur.open_levels == 2
  # ... and a poor level 2 does not either, however much of it was seen.
  cur.update([by_id[f"L2-{i}"] for i in range(4)], [1, 1, 1, 1], [8, 8, 8, 8])
  assert cur.open_levels == 2
  cur.update([by_id[f"L2-{i}"] for i in range(4)], [16] * 4, [16] * 4)  # alpha 17, beta 7: estimates about 0.71
  assert cur.open_levels == 3


def test_disabled_draws_uniformly_from_every_level():
  problems = pool(1, 2, 3, per_level=3)
  cur = Curriculum(problems, cfg(enabled=False, initial_levels=1, retire_above=0.5, min_attempts=1), seed=0)
  assert cur.open_levels == 3
  cur.update(problems[:3], [8, 0, 8], [8, 8, 8])  # extreme estimates: ignored when disabled, nothing retired
  assert not cur.retired.any()
  n = 9000
  counts = draw_counts(cur, n)
  assert set(counts) == {p.id for p in problems}
  for p in problems:
    assert within(counts[p.id], n, 1 / 9), counts


def test_state_dict_round_trip_replays_the_same_draws():
  problems = pool(1, 2, per_level=5)
  config = cfg(decay=0.9, retire_above=0.9, min_attempts=8, promote_above=0.5)
  results = np.random.default_rng(1)

  def play(cur: Curriculum, outcomes: list[list[int]]) -> list[list[str]]:
    ids = []
    for succ in outcomes:
      batch = cur.next_batch(3)
      ids.append([p.id for p in batch])
      cur.update(batch, succ, [4, 4, 4])
    return ids

  cur = Curriculum(problems, config, seed=0)
  play(cur, results.integers(0, 5, (6, 3)).tolist())
  state = pickle.loads(pickle.dumps(cur.state_dict()))  # plain data, as a checkpoint stores it
  future = results.integers(0, 5, (8, 3)).tolist()
  expected = play(cur, future)
  expected_est = cur.pass_estimate()

  restored = Curriculum(problems, config, seed=123)  # a different seed: the rng state must come from the dict
  restored.load_state_dict(state)
  assert play(restored, future) == expected
  np.testing.assert_allclose(restored.pass_estimate(), expected_est)
  assert restored.open_levels == cur.open_levels
  np.testing.assert_array_equal(restored.retired, cur.retired)

  other = Curriculum(pool(1, 2, per_level=4), config, seed=0)
  with pytest.raises(ValueError, match="different pool"):
    other.load_state_dict(state)


def test_load_state_dict_does_not_alias_the_saved_state():
  problems = pool(1, per_level=4)
  cur = Curriculum(problems, cfg(), seed=0)
  cur.update(problems[:2], [3, 1], [4, 4])
  state = cur.state_dict()
  saved = {k: np.array(state[k]) for k in ("alpha", "beta", "attempts", "retired")}
  restored = Curriculum(problems, cfg(), seed=0)
  restored.load_state_dict(state)
  restored.update(problems, [4, 4, 4, 4], [4, 4, 4, 4])  # playing on must leave the saved state as it was
  for k, v in saved.items():
    np.testing.assert_array_equal(state[k], v, err_msg=k)
