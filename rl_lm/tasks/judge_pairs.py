"""Demonstrations for a generative judge of the synthetic preference task (RLAIF's judge, experiments/rlaif).

Each gold-labelled pair of `rl_lm.tasks.preferences` (the better side is the one with the higher gold score, no
Bradley-Terry sampling and no label noise) becomes two problems, one per order, so the judge learns no position:

  prompt    = compare.format(prompt="abd:", first=A, second=B)      (config.judge.compare)
  reference = choices[0] when A's gold is higher, else choices[1]  (config.judge.choices: one token each)

The SFT stage trains on them; the judge then answers with the next-token distribution that
`rl_lm.rewards.judge.PairwiseJudge` reads. `answer` holds the same choice (a judge's accuracy is checked against
it by the pairs' relabelling, rl_lm/train/pairs.py, not by a verifier).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from rl_lm.tasks.base import Problem
from rl_lm.tasks.preferences import PreferencePair, SyntheticPreferences

TASK_NAME = "judge_pairs"


class JudgePairs:
  """The two orders of `pairs` gold-labelled pairs per split, as SFT problems for a judge (module docstring)."""

  name = TASK_NAME

  def __init__(self, seed: int = 0, test_fraction: float = 0.1, pairs: int = 1000,
               compare: str = "{prompt} 1:{first} 2:{second} better:", choices: str = "12") -> None:
    if len(choices) != 2:
      raise ValueError(f"choices must be two answer tokens, got {choices!r}")
    self.compare, self.choices, self.seed = compare, choices, seed
    self.source = SyntheticPreferences(seed=seed, test_fraction=test_fraction)
    self._problems = {split: self.problems(self.source.pairs(split, pairs, seed=seed)) for split in ("train", "test")}

  def problems(self, pairs: list[PreferencePair]) -> list[Problem]:
    """Both orders of each pair, the better side by its gold."""
    out = []
    for q in pairs:
      better, worse = (q.chosen, q.rejected) if q.agrees_with_gold else (q.rejected, q.chosen)
      for k, (a, b) in enumerate(((better, worse), (worse, better))):
        choice = self.choices[k]
        out.append(Problem(f"{q.id}-{k}", self.compare.format(prompt=q.prompt, first=a, second=b), choice,
                           task=TASK_NAME, reference=choice))
    return out

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    """The training problems in an order drawn from `seed` (the SFT loop reshuffles each pass this way)."""
    problems = list(self._problems["train"])
    random.Random(f"rl_lm/judge_pairs/{seed}").shuffle(problems)
    yield from problems[:n]

  def test_problems(self, n: int | None = 500, seed: int = 0) -> list[Problem]:
    problems = list(self._problems["test"])
    random.Random(f"rl_lm/judge_pairs/test/{seed}").shuffle(problems)
    return problems[:n]

  def reference_completion(self, problem: Problem) -> str:
    return problem.reference
