"""A curriculum that keeps the policy on prompts it sometimes solves.

Each training prompt carries a decayed Beta estimate of the policy's pass rate
(alpha = successes, beta = failures, both multiplied by `decay` at every update of that prompt, so
old evidence fades as the policy changes). Prompts are drawn with weight p(1 - p) + floor: a prompt
at pass rate 0.5 is drawn most, one that is always or never solved rarely (it gives a zero-variance
group: no signal). A prompt whose estimate exceeds `retire_above` after `min_attempts` samples is
retired. Difficulty levels unlock in order: the next one opens when the mean estimate over the
highest open level exceeds `promote_above`.

The whole state (estimates, retired set, open levels, the random generator) is a plain dict for
the checkpoint: `state_dict()` / `load_state_dict()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_lm.config import CurriculumConfig  # the knobs, with their defaults and checks
from rl_lm.tasks.base import Problem


class Curriculum:
  """Draws training prompts from a fixed pool; see the module docstring."""

  def __init__(self, pool: Sequence[Problem], cfg: CurriculumConfig, seed: int = 0):
    if not pool:
      raise ValueError("the curriculum needs a non-empty pool of training problems")
    self.pool = list(pool)
    self.cfg = cfg
    self.levels = sorted({p.difficulty for p in self.pool})
    self._level_of = np.asarray([self.levels.index(p.difficulty) for p in self.pool])
    self.alpha = np.zeros(len(self.pool))
    self.beta = np.zeros(len(self.pool))
    self.attempts = np.zeros(len(self.pool), np.int64)
    self.retired = np.zeros(len(self.pool), bool)
    self.open_levels = min(cfg.initial_levels, len(self.levels)) if cfg.enabled else len(self.levels)
    self._index = {p.id: i for i, p in enumerate(self.pool)}
    self.rng = np.random.default_rng(seed)

  def pass_estimate(self) -> np.ndarray:
    """Posterior-mean pass rate of every pool prompt. [pool]

    The prior of a prompt is its level's pooled pass rate (Beta(1, 1) before anything of that level
    was seen) with the weight of two samples, so an unseen prompt of a level the policy fails is not
    mistaken for an intermediate one.
    """
    prior = np.full(len(self.levels), 0.5)
    for lv in range(len(self.levels)):
      sel = self._level_of == lv
      a, b = self.alpha[sel].sum(), self.beta[sel].sum()
      prior[lv] = (a + 1.0) / (a + b + 2.0)
    p0 = prior[self._level_of]
    return (self.alpha + 2.0 * p0) / (self.alpha + self.beta + 2.0)

  def _candidates(self) -> np.ndarray:
    ok = self._level_of < self.open_levels
    if self.cfg.enabled:
      ok &= ~self.retired
    if not ok.any():  # everything open is retired: fall back to the open pool
      ok = self._level_of < self.open_levels
    return np.flatnonzero(ok)

  def next_batch(self, n: int) -> list[Problem]:
    """`n` distinct prompts (with repeats only when the pool is smaller than n)."""
    idx = self._candidates()
    if self.cfg.enabled:
      p = self.pass_estimate()[idx]
      w = p * (1.0 - p) + self.cfg.floor
      w = w / w.sum()
    else:
      w = None
    chosen = self.rng.choice(idx, size=n, replace=len(idx) < n, p=w)
    return [self.pool[i] for i in chosen]

  def update(self, problems: Sequence[Problem], successes: Sequence[float], attempts: Sequence[int]) -> None:
    """Records `successes[i]` out of `attempts[i]` samples for `problems[i]`; retires and promotes."""
    for prob, s, a in zip(problems, successes, attempts, strict=True):
      i = self._index.get(prob.id)
      if i is None or a <= 0:
        continue
      self.alpha[i] = self.cfg.decay * self.alpha[i] + s
      self.beta[i] = self.cfg.decay * self.beta[i] + (a - s)
      self.attempts[i] += a
    if not self.cfg.enabled:
      return
    est = self.pass_estimate()
    self.retired |= (est > self.cfg.retire_above) & (self.attempts >= self.cfg.min_attempts)
    top = self._level_of == self.open_levels - 1
    seen = top & (self.attempts > 0)
    if (self.open_levels < len(self.levels) and seen.sum() >= self.cfg.promote_min_seen * top.sum()
        and est[seen].mean() > self.cfg.promote_above):
      self.open_levels += 1

  def metrics(self) -> dict[str, float]:
    est = self.pass_estimate()
    seen = self.attempts > 0
    open_ = self._level_of < self.open_levels
    mid = seen & (est > 0.2) & (est < 0.8)
    return {
      "curriculum/open_levels": float(self.open_levels),
      "curriculum/highest_open_difficulty": float(self.levels[self.open_levels - 1]),
      "curriculum/retired": float(self.retired.sum()),
      "curriculum/seen_frac": float(seen[open_].mean()) if open_.any() else 0.0,
      "curriculum/pass_estimate_mean": float(est[seen].mean()) if seen.any() else 0.0,
      "curriculum/intermediate_frac": float(mid.sum() / max(seen.sum(), 1)),
    }

  def state_dict(self) -> dict[str, Any]:
    return {"alpha": self.alpha.copy(), "beta": self.beta.copy(), "attempts": self.attempts.copy(),
            "retired": self.retired.copy(), "open_levels": self.open_levels,
            "ids": [p.id for p in self.pool], "rng": self.rng.bit_generator.state}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    if list(state["ids"]) != [p.id for p in self.pool]:
      raise ValueError("curriculum state was saved for a different pool of problems")
    self.alpha, self.beta = np.array(state["alpha"], float), np.array(state["beta"], float)  # copies
    self.attempts, self.retired = np.array(state["attempts"], np.int64), np.array(state["retired"], bool)
    self.open_levels = int(state["open_levels"])
    self.rng.bit_generator.state = state["rng"]
